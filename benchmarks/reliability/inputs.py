"""Bad data files through `recsys data prepare` and bad configs through `recsys train`: exit 2, a message naming the
problem (file and line, or the dotted key), no traceback, nothing half-written, and config errors before any work.
"""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

from benchmarks.reliability.cases import TRACEBACK, Case, Finished, run_recsys, short
from pipelines.config import load_config

SEQUENCES = "u1 a b c d\nu2 b c e\nu3 a c e f\n"
ITEMS = 'item_id,title\na,Alpha\nb,"Bravo, the sequel"\nc,Charlie\nd,Delta\ne,Echo\nf,Foxtrot\n'
CONFIG_SECONDS = 10.0  # a config error must come before any work (importing torch alone takes seconds here)
# cases whose bad rows a lenient reader would drop: an exit 0 there is data lost
ROW_LOSING = ("unbalanced quote", "bad timestamp", "not JSON", "no items", "timestamp", "rating nan", "unixReviewTime")


def _p5(root: Path, sequences: str | bytes = SEQUENCES, items: str | bytes | None = ITEMS) -> Path:
    root.mkdir(parents=True)
    (root / "user_sequence.txt").write_bytes(sequences.encode() if isinstance(sequences, str) else sequences)
    if items is not None:
        (root / "items.csv").write_bytes(items.encode() if isinstance(items, str) else items)
    return root


def data_cases(work: Path) -> list[Case]:
    """Each case: a raw input built under `work`, the `recsys data prepare` options, and what the message must say."""

    def ratings_csv(root: Path, first_row: str) -> list[str]:
        """ratings.csv whose first row is `first_row`, then rows that alone prepare cleanly (exit 0 if it is taken)."""
        root.mkdir(parents=True)
        rows = "".join(f"1,{item},4,{978300760 + item}\n" for item in (11, 12, 13))
        (root / "ratings.csv").write_text("userId,movieId,rating,timestamp\n" + first_row + rows)
        return ["--input", str(root / "ratings.csv")]

    good_reviews = "".join(
        f'{{"reviewerID": "u", "asin": "{item}", "unixReviewTime": {time}, "overall": 5}}\n'
        for item, time in (("b", 6), ("c", 7))
    )
    cases: list[tuple[str, Callable[[Path], list[str]], str]] = [
        ("unbalanced quote in items.csv",
         lambda d: ["--input", str(_p5(d, items='item_id,title\na,"Alpha\nb,Bravo\n'))], "line 2"),
        ("items.csv that cannot be read", lambda d: ["--input", str(_unreadable_items(d))], "items.csv"),
        ("--input naming items.csv, not the folder", lambda d: ["--input", str(_p5(d) / "items.csv")],
         "pass the directory"),
        ("--input that does not exist", lambda d: ["--input", str(d / "missing")], "no such file"),
        ("empty user_sequence.txt", lambda d: ["--input", str(_p5(d, sequences=""))], "empty"),
        ("a line with a user and no items", lambda d: ["--input", str(_p5(d, sequences="u1 a b c\nu2\n"))], "line 2"),
        ("a user on two lines", lambda d: ["--input", str(_p5(d, sequences="u1 a b c\nu1 d e f\n"))], "line 2"),
        ("binary garbage", lambda d: ["--input", str(_p5(d, sequences=bytes(range(256)) * 4))], "user_sequence.txt"),
        ("not UTF-8", lambda d: ["--input", str(_p5(d, sequences="u1 caf\xe9 b c\n".encode("latin-1")))], "UTF-8"),
        ("truncated gzip", lambda d: ["--input", str(_truncated_gzip(d))], "user_sequence.txt.gz"),
        ("duplicate item id in items.csv", lambda d: ["--input", str(_p5(d, items=ITEMS + "a,Again\n"))], "'a'"),
        ("items.csv without its title column", lambda d: ["--input", str(_p5(d, items="item_id\na\nb\n"))], "title"),
        ("ratings.dat with a bad timestamp", lambda d: _movielens(d, "1::10::4::978300760\n1::11::4::later\n"),
         "line 2"),
        ("ratings.dat with another separator", lambda d: _movielens(d, "1,10,4,978300760\n"), "line 1"),
        ("reviews with a line that is not JSON", lambda d: _amazon_raw(d, '{"reviewerID": "u", "asin": "a", '
         '"unixReviewTime": 1}\n{not json\n'), "line 2"),
        ("--out whose parent is a file", lambda d: ["--input", str(_p5(d)), "--out", str(_a_file(d) / "out")], "out"),
        ("--out an unrelated folder", lambda d: ["--input", str(_p5(d)), "--out", str(_unrelated(d))],
         "not an output of this tool"),
        ("--min-interactions 0", lambda d: ["--input", str(_p5(d)), "--min-interactions", "0"],
         "min_interactions: must be >= 3"),
        ("--cold-start-fraction 1.5", lambda d: ["--input", str(_p5(d)), "--cold-start-fraction", "1.5"],
         "cold_start_fraction: Input should be less than 1"),
        ("unknown source", lambda d: ["--input", str(_p5(d)), "--source", "myspace"], "myspace"),
        ("every user filtered out", lambda d: ["--input", str(_p5(d, sequences="u1 a b\nu2 c d\n"))], "min"),
        ("ratings.csv timestamp -978300000", lambda d: ratings_csv(d, "1,10,4,-978300000\n"),
         "line 2: timestamp -978300000"),
        ("ratings.csv timestamp 10^17", lambda d: ratings_csv(d, f"1,10,4,{10**17}\n"), f"line 2: timestamp {10**17}"),
        ("rating nan", lambda d: ratings_csv(d, "1,10,nan,978300759\n"), "line 2: rating 'nan'"),
        ("amazon-raw unixReviewTime -5", lambda d: _amazon_raw(d, '{"reviewerID": "u", "asin": "a", '
         '"unixReviewTime": -5, "overall": 5}\n' + good_reviews), "line 1: unixReviewTime -5"),
        ("unbalanced quote in ratings.csv", lambda d: ratings_csv(d, '"1,2,3,978300759\n'), "line 2"),
    ]  # fmt: skip
    out = []
    for i, (name, build, says) in enumerate(cases):
        root = work / f"data-{i}"
        options = build(root / "raw")
        if "--source" not in options:
            options = ["--source", _source_of(options), *options]
        if "--out" not in options:
            options += ["--out", str(root / "prepared")]
        out_dir = Path(options[options.index("--out") + 1])
        before = sorted(out_dir.rglob("*")) if out_dir.exists() else None  # an existing folder must stay as it was
        done = run_recsys("data", "prepare", *options)
        after = sorted(out_dir.rglob("*")) if out_dir.exists() else None
        case = _exit_2(f"data: {name}", "recsys data prepare " + " ".join(options[:2]), done, says, [out_dir],
                       existed=before is not None)  # fmt: skip
        swallowed = done.exit_code == 0 and any(marker in name for marker in ROW_LOSING)
        lost = case.data_lost or swallowed or (before is not None and before != after)
        out.append(Case(**{**case.record(), "data_lost": lost}))
    return out


def _source_of(options: list[str]) -> str:
    path = options[options.index("--input") + 1]
    return "movielens" if "ratings" in path else "amazon-raw" if "reviews" in path else "amazon-p5"


def _movielens(root: Path, ratings: str) -> list[str]:
    root.mkdir(parents=True)
    (root / "ratings.dat").write_text(ratings)
    return ["--input", str(root / "ratings.dat")]


def _amazon_raw(root: Path, reviews: str) -> list[str]:
    root.mkdir(parents=True)
    (root / "reviews_Toys_5.json").write_text(reviews)
    return ["--input", str(root / "reviews_Toys_5.json")]


def _unreadable_items(root: Path) -> Path:
    """items.csv that no one can read: a directory by that name (chmod cannot stop root, who runs CI)."""
    folder = _p5(root, items=None)
    (folder / "items.csv").mkdir()
    return folder


def _truncated_gzip(root: Path) -> Path:
    root.mkdir(parents=True)
    whole = gzip.compress(SEQUENCES.encode() * 50)
    (root / "user_sequence.txt.gz").write_bytes(whole[: len(whole) // 2])  # cut mid-stream, as a broken download
    return root


def _a_file(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "a-file").write_text("x")
    return root / "a-file"


def _unrelated(root: Path) -> Path:
    folder = root / "my-thesis"
    folder.mkdir(parents=True)
    (folder / "chapter1.tex").write_text("precious")
    return folder


def config_cases(work: Path, experiment: Path) -> list[Case]:
    """`recsys train --config` of broken configs (written beside a copy of `experiment`): exit 2 before any work."""
    base = {"base": str(experiment.resolve())}
    cases: list[tuple[str, object, str]] = [
        ("train.schedule.epochs -1", {**base, "train": {"schedule": {"epochs": -1}}}, "train.schedule.epochs"),
        ("unknown key under model.params", {**base, "model": {"name": "sasrec", "params": {"dimm": 64}}},
         "model.params.dimm"),
        ("num_heads that does not divide dim", {**base, "model": {"name": "sasrec", "params": {"dim": 64,
         "num_heads": 3}}}, "num_heads"),
        ("a model name typo", {**base, "model": {"name": "sasrc"}}, "sasrc"),
        ("an empty config", None, "sets nothing"),
        ("invalid YAML", "model: [unclosed\n", "YAML"),
        ("a config that extends itself", {"base": "config.yaml"}, "extends itself"),
        ("an unknown section", {**base, "trian": {"epochs": 3}}, "trian"),
        ("a negative learning rate", {**base, "train": {"optimization": {"lr": -0.1}}}, "train.optimization.lr"),
        ("a string for an integer", {**base, "train": {"optimization": {"batch_size": "big"}}},
         "train.optimization.batch_size"),
        ("epochs: true", {**base, "train": {"schedule": {"epochs": True}}},
         "train.schedule.epochs: Input should be a valid integer"),
        ("lr a quoted string", f"base: {experiment.resolve()}\ntrain:\n  optimization: {{lr: '1e-3'}}\n",
         "train.optimization.lr: Input should be a valid number"),
        ("a section twice", f"base: {experiment.resolve()}\nmodel: {{name: sasrec}}\nmodel: {{name: popularity}}\n",
         "key 'model' is given twice (lines 2 and 3)"),
        ("a UTF-16 file", ("model: {name: sasrec}\n".encode("utf-16")), "not UTF-8 text: it looks like UTF-16"),
    ]  # fmt: skip
    out = []
    for i, (name, content, says) in enumerate(cases):
        path = work / f"config-{i}" / "config.yaml"
        path.parent.mkdir(parents=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content if isinstance(content, str) else "" if content is None else yaml.safe_dump(content))
        done = run_recsys("train", "--config", str(path), "--work-dir", str(path.parent / "work"))
        case = _exit_2(f"config: {name}", f"recsys train --config <{name}>", done, says, [path.parent / "work"])
        fast = done.seconds < CONFIG_SECONDS
        out.append(Case(**{**case.record(), "clear": case.clear and fast,
                           "outcome": f"{case.outcome} after {done.seconds:.1f} s"}))  # fmt: skip
    missing = run_recsys("train", "--config", str(work / "no-such.yaml"))
    out.append(_exit_2("config: a config file that does not exist", "recsys train --config no-such.yaml", missing,
                       "not found", []))  # fmt: skip
    return out + _no_data_path(work / "config-no-path", experiment)


def override_cases(work: Path, experiment: Path) -> list[Case]:
    """`recsys train` of `experiment` with values that once escaped the work dir or raised a traceback: a name that is
    a path, a key under a value that is not a mapping, numbers past what a config holds (exit 2 before any work,
    nothing written under the work dir or where the name points)."""
    work.mkdir(parents=True)
    huge_int = "9" * 5000
    in_file = work / "huge.yaml"
    in_file.write_text(f"base: {experiment.resolve()}\nmodel:\n  params: {{dim: {huge_int}}}\n")
    cases: list[tuple[str, Path, list[str], str, list[Path]]] = [
        ("name ../../esc", experiment, ["name=../../esc"], "is not a valid name", [work / "esc"]),
        ("name an absolute path", experiment, [f"name={work / 'abs-esc'}"], "is not a valid name", [work / "abs-esc"]),
        ("name a/b", experiment, ["name=a/b"], "is not a valid name", []),
        ("name with a NUL", experiment, ['name="a\\0b"'], "is not a valid name", []),
        ("name of 300 characters", experiment, ["name=" + "n" * 300], "is not a valid name", []),
        ("a key under a string: model.name.x", experiment, ["model.name.x=1"], "not a mapping", []),
        ("a 5,000-digit dim", experiment, [f"model.params.dim={huge_int}"], "is too large", []),
        ("a 5,000-digit learning rate", experiment, [f"train.optimization.lr={huge_int}.0"], "is too large", []),
        ("a 5,000-digit number in the file", in_file, [], "is too large", []),
    ]
    out = []
    for i, (name, config, sets, says, escaped) in enumerate(cases):
        where = work / f"set-{i}" / "work"
        options = [part for value in sets for part in ("--set", value)]
        done = run_recsys("train", "--config", str(config), "--work-dir", str(where), *options)
        out.append(_exit_2(f"config: {name}", f"recsys train {' '.join(options)[:120] or config.name}", done, says,
                           [where / "models", *escaped]))  # fmt: skip
    return out


def compare_with_cases(work: Path, experiment: Path) -> list[Case]:
    """`pipeline.compare_with` naming an evaluation directory whose files are cut short or of another kind: exit 2
    naming the file and how to re-create it (the pipeline's own steps run once; each case re-runs its evaluation)."""
    base = work / "base"
    done = run_recsys("pipeline", "run", "--config", str(experiment), "--work-dir", str(base), "--until", "evaluate")
    assert done.exit_code == 0, done.output[-2000:]
    (evaluation,) = (base / "evaluations").iterdir()
    corruptions: list[tuple[str, str, bytes, str]] = [
        ("evaluation.json cut short", "evaluation.json", b'{"name": "x", "users": 3', "it ends in the middle"),
        ("evaluation.json a JSON list", "evaluation.json", b"[1, 2]", "holds a JSON list"),
        ("evaluation.json not JSON", "evaluation.json", b"\x00\x01 binary", "not"),
        ("per_user.npz text", "per_user.npz", b"not an archive", "not an .npz archive"),
        ("per_user.npz cut short", "per_user.npz", b"PK\x03\x04" + bytes(64), "per_user.npz: not a readable"),
    ]
    out = []
    for i, (name, file, content, says) in enumerate(corruptions):
        copy = work / f"compare-{i}"
        shutil.copytree(evaluation, copy)
        (copy / file).write_bytes(content)
        done = run_recsys("pipeline", "run", "--config", str(experiment), "--work-dir", str(base), "--until",
                          "evaluate", "--set", f"pipeline.compare_with={copy}")  # fmt: skip
        out.append(_exit_2(f"config: compare_with {name}", f"--set pipeline.compare_with=<{name}>", done, says, [],
                           existed=True))  # fmt: skip
    return out


def _no_data_path(folder: Path, experiment: Path) -> list[Case]:
    """A file source without data.path: the message names the config key (not a command-line flag), and the failed
    data step lets go of its pipeline's lock (a released lock leaves no file behind)."""
    path = folder / "config.yaml"
    folder.mkdir(parents=True)
    raw = load_config(experiment).model_dump(mode="json", exclude_none=True)
    path.write_text(yaml.safe_dump({**raw, "name": "no-path", "data": {"source": "amazon-p5"}}))  # no base: no options
    done = run_recsys("train", "--config", str(path), "--work-dir", str(folder / "work"))
    named = _exit_2("config: a file source without data.path", "recsys train --config <amazon-p5, no path>", done,
                    "data.path in an experiment config", [folder / "work" / "data" / "no-path"])  # fmt: skip
    lock = folder / "work" / "pipelines" / "no-path" / "lock"
    released = Case(
        "inputs", "config: a failed data step lets go of its lock", "the pipeline's lock file after that run",
        "no lock file (a released lock is removed; only a killed holder's stays)",
        "lock file left" if lock.exists() else "no lock file", not lock.exists(), False, False, False,
        short(lock.read_text()) if lock.is_file() else "",
    )  # fmt: skip
    return [named, released]


def _exit_2(name: str, command: str, done: Finished, says: str, outputs: list[Path], existed: bool = False) -> Case:
    """Exit code 2 with `says` in the message, no traceback, and no output (unless it `existed` before) or temp
    directory left behind."""
    temps = [p for out in outputs for p in out.parent.glob(f".{out.name}.*")]
    leftovers = temps + ([] if existed else [out for out in outputs if out.exists()])
    return Case(
        group="inputs",
        name=name,
        input=command,
        expected=f"exit 2 saying {says!r}",
        outcome=f"exit {done.exit_code}",
        clear=done.exit_code == 2 and says.lower() in done.output.lower(),
        server_error=False,
        traceback=TRACEBACK in done.output,
        data_lost=bool(leftovers),  # a half-written output
        message=short(done.output.strip().splitlines()[-1] if done.output.strip() else ""),
    )
