"""Reading a JSON file someone handed the program (an evaluation of another run, a saved report): a file that is
missing, not UTF-8, not JSON (truncated by a full disk, a binary) or not the object expected is a `DataError` naming
the file, what is wrong and the fix, not a `JSONDecodeError` or `KeyError` traceback.

Example:
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "evaluation.json"
    >>> _ = path.write_text('{"name": "tiny", "users": 3')
    >>> read_json_object(path, "run its evaluation again")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    recsys.errors.DataError: .../evaluation.json: not valid JSON: it ends in the middle of a value (cut short?)...
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from recsys.errors import DataError
from recsys.runtime.validation import problems

CUT_SHORT = "not valid JSON: it ends in the middle of a value (cut short?)"
# what may be left where the parser stopped when a write was cut short inside a value: the start of true, false or
# null, or of a number's sign, fraction or exponent (the parser stops before "." in "1.", "e" in "1e", at "-" alone)
_PARTIAL_VALUE = re.compile(r"t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?|-|\.|[eE][-+]?")


def _cut_short(err: json.JSONDecodeError) -> bool:
    """Whether the text ends inside a value, as a write cut short leaves it (not text that is wrong where it stops)."""
    tail = err.doc[err.pos :].rstrip()
    if not tail or err.msg.startswith("Unterminated string"):
        return True
    if err.msg.startswith("Invalid \\uXXXX escape") or err.msg.startswith("Invalid \\escape"):
        return len(tail) < 6  # a \uXXXX escape or \ cut inside a string
    return _PARTIAL_VALUE.fullmatch(tail) is not None


def read_json(path: Path, fix: str) -> Any:
    """The JSON document in the file at `path`; DataError (with `fix`) for a missing file or text that is not JSON."""
    if not path.is_file():
        raise DataError(path, "no such file" if not path.exists() else "not a file", fix)
    data = path.read_bytes()
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        if err.reason == "unexpected end of data":  # a character's bytes cut short
            raise DataError(path, CUT_SHORT, fix) from err
        problem = f"not UTF-8 text (byte {err.start} is {data[err.start]:#04x}): not a JSON file"
        raise DataError(path, problem, fix) from err
    except RecursionError as err:
        raise DataError(path, "JSON nested too deeply to read", fix) from err
    except json.JSONDecodeError as err:
        if _cut_short(err):
            raise DataError(path, CUT_SHORT, fix) from err
        raise DataError(path, f"not valid JSON ({err.msg}, line {err.lineno}, column {err.colno})", fix) from err
    except ValueError as err:  # an integer past Python's limit on digits
        raise DataError(path, f"not JSON this program reads ({err})", fix) from err


def read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """`read_json` of a file whose document must be a JSON object (a mapping)."""
    document = read_json(path, fix)
    if not isinstance(document, dict):
        raise DataError(path, f"holds a JSON {type(document).__name__}, not the object expected", fix)
    return document


def read_json_shaped(path: Path, shape: type[BaseModel], what: str, fix: str) -> dict[str, Any]:
    """`read_json_object` of a file that must hold what `shape` describes (a pydantic model of the keys the program
    reads, extra keys allowed), checked strictly: DataError "not <what> of this version (<key>: <problem>)" otherwise.

    Example:
        >>> import tempfile
        >>> from pydantic import ConfigDict
        >>> class Meta(BaseModel):
        ...     model_config = ConfigDict(extra="allow")
        ...     key: str
        >>> path = Path(tempfile.mkdtemp()) / "meta.json"
        >>> _ = path.write_text('{"top_k": 5}')
        >>> read_json_shaped(path, Meta, "a cache's meta.json", "delete it")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        recsys.errors.DataError: .../meta.json: not a cache's meta.json of this version (key: Field required). Fix: ...
    """
    document = read_json_object(path, fix)
    try:
        shape.model_validate(document, strict=True)
    except ValidationError as err:
        raise DataError(path, f"not {what} of this version ({problems(err)})", fix) from err
    return document
