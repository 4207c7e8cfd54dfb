"""The record an LLM writes: a valid answer passes, the usual damage is repaired once, anything else is refused
with the reason; the prompt file and its skeleton agree with the record's fields."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from recsys.enrich.guided import Choice, FreeList, Literal
from recsys.enrich.record import (
    DEFAULT_PROMPT,
    FIELDS,
    PROMPTS_DIR,
    AnswerError,
    check_answer,
    load_prompt,
    repaired,
)
from recsys.errors import ConfigError

PROMPT = load_prompt()
GOOD = {"category": "Beauty > Skin Care", "brand": "Acme", "keywords": ["lip balm", "beeswax", "4 tubes"],
        "description": "A beeswax lip balm.", "queries": ["beeswax lip balm", "acme lip balm"]}  # fmt: skip


def test_a_valid_answer_is_a_record() -> None:
    record = check_answer(json.dumps(GOOD), PROMPT.categories)
    assert record.keywords == ("lip balm", "beeswax", "4 tubes") and record.brand == "Acme"


@pytest.mark.parametrize(
    "text",
    [f"```json\n{json.dumps(GOOD)}\n```", f"Sure! Here it is: {json.dumps(GOOD)} Hope it helps.",
     json.dumps(GOOD).replace('"]', '",]').replace('"}', '",}')],
    ids=["code fence", "prose around it", "trailing commas"],
)  # fmt: skip
def test_the_usual_damage_is_repaired(text: str) -> None:
    assert check_answer(text, PROMPT.categories).brand == "Acme"
    assert json.loads(repaired(text))["brand"] == "Acme"


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ('{"category": "Beauty > Skin Care", "brand": ', "not JSON, even repaired"),
        ("[1, 2]", "a JSON list, not an object"),
        (json.dumps({**GOOD, "category": "Fragrance > Women"}), "is not in the prompt's list"),
        (json.dumps({**GOOD, "keywords": ["balm", "Balm ", "balm"]}), "keywords"),  # one keyword, three times
        (json.dumps({**GOOD, "queries": ["a", "b", "c", "d"]}), "queries"),
        (json.dumps({**GOOD, "price": 3}), "price"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "description"}), "description"),
    ],
    ids=["cut short", "not an object", "category off the list", "repeats itself", "too many queries",
         "an extra field", "a missing field"],
)  # fmt: skip
def test_an_invalid_answer_says_why(answer: str, says: str) -> None:
    with pytest.raises(AnswerError, match=says):
        check_answer(answer, PROMPT.categories)


def test_the_prompt_its_examples_and_its_skeleton_agree() -> None:
    assert PROMPT.version == "item-metadata-v2" and len(PROMPT.examples) >= 3
    assert {record.category for _, record in PROMPT.examples} <= set(PROMPT.categories)
    assert len({record.category for _, record in PROMPT.examples}) == len(PROMPT.examples)  # none to copy blindly
    skeleton = PROMPT.skeleton({"brand": 4, "keywords": 4, "description": 4, "queries": 4})
    literals = "".join(s.text for s in skeleton.segments if isinstance(s, Literal))
    assert [f for f in FIELDS if f'"{f}": ' in literals] == list(FIELDS)  # every field, in the record's order
    choice = next(s for s in skeleton.segments if isinstance(s, Choice))
    assert choice.options == PROMPT.categories and choice.whole  # v2: the whole option's likelihood
    v1 = load_prompt("item-metadata-v1")  # token by token; otherwise v2's text, examples and categories
    assert not next(
        s
        for s in v1.skeleton({"brand": 4, "keywords": 4, "description": 4, "queries": 4}).segments
        if isinstance(s, Choice)
    ).whole
    assert (v1.prefix(), v1.categories, v1.examples) == (PROMPT.prefix(), PROMPT.categories, PROMPT.examples)
    keywords = next(s for s in skeleton.segments if isinstance(s, FreeList))
    assert keywords.item.grounded and (keywords.min_count, keywords.max_count) == (3, 6)
    assert PROMPT.prefix().endswith("Item:") and PROMPT.suffix("  a\n b ") == " a b\nMetadata:"
    assert load_prompt(categories=("A", "B")).categories == ("A", "B")
    with pytest.raises(ConfigError, match="no prompt 'item-metadata-v0'"):
        load_prompt("item-metadata-v0")
    with pytest.raises(ConfigError, match="repeats a name"):
        load_prompt(categories=("A", "A"))


def test_a_prompt_with_an_unknown_category_choice_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    shipped = (PROMPTS_DIR / f"{DEFAULT_PROMPT}.yaml").read_text()
    (tmp_path / "item-metadata-v9.yaml").write_text(
        shipped.replace(f"version: {DEFAULT_PROMPT}", "version: item-metadata-v9").replace(
            "category_choice: whole", "category_choice: beam"
        )
    )
    monkeypatch.setattr("recsys.enrich.record.PROMPTS_DIR", tmp_path)
    with pytest.raises(ConfigError, match=r"category_choice 'beam' is unknown\. Fix: one of \('tokens', 'whole'\)"):
        load_prompt("item-metadata-v9")


@pytest.mark.parametrize("version", ["OUTSIDE", "../prompts/item-metadata-v1", "/etc/hostname", "", "x" * 500])
def test_a_prompt_version_that_is_not_shipped_is_refused_listing_the_versions(
    tmp_path: Path, tiny_config: Callable[..., Path], version: str
) -> None:
    if version == "OUTSIDE":  # a prompt file outside the package, which `../..` reached
        version = os.path.relpath(tmp_path / "outside", PROMPTS_DIR)
        shipped = (PROMPTS_DIR / f"{DEFAULT_PROMPT}.yaml").read_text()
        (tmp_path / "outside.yaml").write_text(shipped.replace(f"version: {DEFAULT_PROMPT}", f"version: {version}"))
    with pytest.raises(ConfigError, match=r"no prompt .* Fix: use one of item-metadata-v1"):
        load_prompt(version)
    config = tiny_config(tmp_path, enrich={"backend": "local", "prompt": version})
    result = CliRunner().invoke(app, ["pipeline", "run", "--config", str(config), "--work-dir", str(tmp_path)])
    assert result.exit_code == 2 and "enrich.prompt: no prompt" in result.output, result.output
    assert "Fix: use one of item-metadata-v1" in " ".join(result.output.split()) and "Traceback" not in result.output
