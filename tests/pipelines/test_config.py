from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipelines.config import load_config, parse_overrides
from pipelines.steps.base import ExperimentPaths
from recsys.errors import ConfigError
from recsys.models.family import Input
from recsys.training.recipes import NextItemTraining
from tests.conftest import check_frozen_config

REPO = Path(__file__).resolve().parents[2]


CONFIGS = REPO / "configs"  # the configs a user starts from (the laboratory's: benchmarks/configs)
EXPERIMENTS = sorted(CONFIGS.glob("*/*.yaml"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_frozen_configs_load_and_state_their_purpose_date_and_command(path: Path) -> None:
    check_frozen_config(path)


def test_the_product_ships_few_configs_each_extending_only_its_own() -> None:
    files = [p for p in CONFIGS.rglob("*") if p.is_file()]
    assert len(files) <= 30, f"{len(files)} files under configs/: the product ships the configs a user starts from"
    for path in EXPERIMENTS:
        base = re.search(r"^base: *(\S+)", path.read_text(), re.MULTILINE)
        if base:
            assert (path.parent / base.group(1)).resolve().is_relative_to(CONFIGS), f"{path} extends {base.group(1)}"


def test_every_product_config_is_named_in_a_doc() -> None:
    docs = "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
    unnamed = [str(p.relative_to(REPO)) for p in EXPERIMENTS if str(p.relative_to(REPO)) not in docs]
    assert not unnamed, f"configs a user starts from that no doc names: {unnamed} (docs/configs.md lists them)"


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  epochz: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: train.epochz: Unexpected keyword argument"):
        load_config(path)
    path.write_text("train:\n  schedule: {epochz: 3}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: train.schedule.epochz: Unexpected keyword argument"):
        load_config(path)


def test_wrong_type_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  optimization: {lr: fast}\n")
    with pytest.raises(ConfigError, match=r"train.optimization.lr: Input should be a valid number"):
        load_config(path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("train:\n  schedule: {epochs: true}\n", "train.schedule.epochs: Input should be a valid integer"),
        ('train:\n  optimization: {lr: "1e-3"}\n', "train.optimization.lr: Input should be a valid number"),
        ("train:\n  schedule: {epochs: 2.5}\n", "train.schedule.epochs: Input should be a valid integer"),
    ],
)
def test_types_are_strict_a_bool_is_no_number_and_a_string_no_float(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  name: sasrec\n" + text)
    with pytest.raises(ConfigError, match=re.escape(f"bad.yaml: {problem}")):
        load_config(path)


def test_numbers_read_as_written_in_files_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("model:\n  name: sasrec\ntrain:\n  optimization: {lr: 1e-3, weight_decay: 5E-5}\n")
    config = load_config(path)
    assert (config.train.optimization.lr, config.train.optimization.weight_decay) == (0.001, 5e-5)
    assert load_config(path, parse_overrides(["train.optimization.lr=2e-4"])).train.optimization.lr == 2e-4


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text("model:\n  name: sasrec\ntrain:\n  schedule: {epochs: 3}\nmodel:\n  name: popularity\n")
    with pytest.raises(ConfigError, match=r"twice.yaml: key 'model' is given twice \(lines 1 and 5\)\. Fix: keep one"):
        load_config(path)


@pytest.mark.parametrize(("encoding", "named"), [("utf-16", "UTF-16"), ("latin-1", "line 2 holds the byte b'\\xe9'")])
def test_a_file_not_in_utf8_is_named_with_its_encoding(tmp_path: Path, encoding: str, named: str) -> None:
    path = tmp_path / "other.yaml"
    path.write_bytes("# Purpose: x\nmodel: {name: sé}\n".encode(encoding))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: not UTF-8 text") and named in str(info.value)
    assert str(info.value).endswith("Fix: save the file as UTF-8")


def test_a_key_of_earlier_configs_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text("train: {epochs: 3}\n")  # train.schedule.epochs now: the laboratory renames old records
    with pytest.raises(ConfigError, match=r"old.yaml: train.epochs: Unexpected keyword argument.*Fix: "):
        load_config(path)
    with pytest.raises(ConfigError, match=r"train.lr: Unexpected keyword argument"):
        load_config(REPO / "configs" / "synthetic" / "sasrec.yaml", {"train.lr": 0.01})


def test_upstream_models_only_for_a_family_that_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("model:\n  name: sasrec\n  upstream: {retriever: runs/models/a, members: [a, b]}\n")
    with pytest.raises(ConfigError, match=r"model.upstream.retriever, model.upstream.members: model 'sasrec' is built"):
        load_config(path)
    path.write_text("model: {name: ranker, upstream: {holdout_retriever: a}}\n")  # its first stage is required
    with pytest.raises(ConfigError, match=r"model.upstream.retriever: model 'ranker' is built on the first stage"):
        load_config(path)
    path.write_text("model: {name: fusion, upstream: {members: a}}\n")
    with pytest.raises(ConfigError, match=r"model.upstream.members: 'a' is not a list of trained model directories"):
        load_config(path)
    config = load_config(path, {"model.upstream.members": ["a", "b"]})
    assert config.model.upstream_dirs() == {"members[0]": Path("a"), "members[1]": Path("b")}
    assert config.model.upstream_of(Input.MEMBERS) == [
        ("model.upstream.members[0]", Path("a")),
        ("model.upstream.members[1]", Path("b")),
    ]


def test_semantic_ids_read_need_a_sid_section(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("model:\n  name: sasrec\n  params: {sid_levels: 2}\n")
    with pytest.raises(ConfigError, match=r"reads semantic IDs, which a `sid` section builds. Fix: add one"):
        load_config(path)
    path.write_text("model:\n  name: sasrec\n  params: {sid_levels: 2}\nsid: {method: rqkmeans}\n")
    assert Input.SEMANTIC_IDS in load_config(path).model.reads()


def test_missing_file_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    path = tmp_path / "broken.yaml"
    path.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_overrides_apply_dotted_keys(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("train:\n  schedule: {epochs: 3}\n")
    config = load_config(path, {"train.schedule.epochs": 7, "data.path": "somewhere"})
    assert config.train.schedule.epochs == 7
    assert config.data.path == Path("somewhere")
    assert config.name == "x"


def test_a_mapping_override_that_drops_the_configs_keys_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("model:\n  name: sasrec\n  params: {dim: 16, num_layers: 1, num_heads: 1}\n")
    with caplog.at_level("WARNING", logger="pipelines.config"):
        config = load_config(path, {"model.params": {"dim": 32}})
    assert config.model.params == {"dim": 32}  # replaced, as written: the others take the family's defaults
    assert "model.params: the override replaces the whole mapping, so num_heads, num_layers" in caplog.text
    assert "set each one (e.g. model.params.dim)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="pipelines.config"):
        load_config(path, {"model.params.dim": 32, "model.params": {"dim": 8, "num_layers": 1, "num_heads": 1}})
    assert not caplog.text  # a dotted key, or a mapping that keeps every key, drops nothing


def test_a_config_extends_its_base_and_overrides_a_few_keys(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(
        "name: base\nmodel:\n  name: sasrec\n  params: {dim: 32, num_heads: 2}\n"
        "train: {schedule: {epochs: 5}, optimization: {lr: 0.01}}\n"
    )
    (tmp_path / "wide.yaml").write_text(
        "base: base.yaml\nmodel:\n  params: {dim: 64}\ntrain: {schedule: {epochs: 9}}\n"
    )
    config = load_config(tmp_path / "wide.yaml")
    assert config.name == "wide"  # never inherited
    assert config.model.params == {"dim": 64, "num_heads": 2}  # mappings merge key by key
    assert (config.train.schedule.epochs, config.train.optimization.lr) == (9, 0.01)
    (tmp_path / "typo.yaml").write_text("base: base.yaml\ntrain: {epochz: 3}\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: train.epochz"):  # unknown keys still named
        load_config(tmp_path / "typo.yaml")


def test_a_base_that_is_missing_or_loops_is_named(tmp_path: Path) -> None:
    (tmp_path / "orphan.yaml").write_text("base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"orphan.yaml: `base: nowhere.yaml` is not a file"):
        load_config(tmp_path / "orphan.yaml")
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="extends itself"):
        load_config(tmp_path / "a.yaml")


def test_the_models_training_settings_are_its_familys(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("model:\n  name: sasrec\n  training: {loss: sampled_softmax, num_negatives: 64}\n")
    assert load_config(path).model.training_settings() == NextItemTraining(loss="sampled_softmax", num_negatives=64)
    path.write_text("model:\n  name: sasrec\n  training: {label_smoothing: 0.1}\n")
    with pytest.raises(ConfigError, match=r"model.training.label_smoothing: unknown key"):
        load_config(path)
    path.write_text("model:\n  name: sasrec\n  training: {loss: sampled_softmax, softmax_within_domain: true}\n")
    with pytest.raises(ConfigError, match="softmax_within_domain needs loss: full_softmax"):
        load_config(path)
    path.write_text("model:\n  name: sasrek\n")
    with pytest.raises(
        ConfigError, match=r"x.yaml: model.name: unknown model 'sasrek'. Fix: use one of .*hstu, .*sasrec"
    ):
        load_config(path)


def test_model_params_are_checked_when_the_config_is_loaded(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("model:\n  name: sasrec\n  params: {dim: 64, bogus: 1}\n")
    with pytest.raises(ConfigError, match=r"x.yaml: model 'sasrec': model.params.bogus: unknown key \(known: max_hi"):
        load_config(path)
    path.write_text("model:\n  name: sasrec\n  params: {dim: 64}\n")
    with pytest.raises(ConfigError, match=r"model.params.num_heads: 3 does not divide dim \(64\).* Fix: correct"):
        load_config(path, {"model.params.num_heads": 3})  # --set is checked as well


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("train.schedule.epochs", -1, "Input should be greater than 0"),
        ("train.optimization.batch_size", 0, "Input should be greater than 0"),
        ("train.optimization.lr", 0.0, "Input should be greater than 0"),
        ("train.schedule.patience", 0, "Input should be greater than 0"),
        ("train.optimization.ema_decay", 1.0, "Input should be less than 1"),
        ("data.cold_start_fraction", 1.0, "Input should be less than 1"),
        ("eval.batch_size", 0, "Input should be greater than 0"),
        ("model.training.num_negatives", 0, "Input should be greater than 0"),
    ],
)
def test_impossible_values_name_the_key_and_the_fix(tmp_path: Path, key: str, value: object, problem: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("model:\n  name: sasrec\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, {key: value})
    assert f"x.yaml: {key}: {problem}" in str(info.value) and "Fix: " in str(info.value)


@pytest.mark.parametrize("text", ["", "# just a comment\n", "name: nothing\n", "{}\n"])
def test_a_config_that_sets_nothing_is_an_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"empty.yaml: the config sets nothing .* Fix: state what to run"):
        load_config(path)
    (tmp_path / "sid.yaml").write_text("base: empty.yaml\nsid: {method: rqkmeans}\n")  # sets a section
    assert load_config(tmp_path / "sid.yaml").sid is not None


def test_a_variant_of_another_model_does_not_inherit_the_bases_model_settings(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("model:\n  name: sasrec\n  params: {dim: 32}\ntrain: {schedule: {epochs: 5}}\n")
    (tmp_path / "pop.yaml").write_text("base: base.yaml\nmodel:\n  name: popularity\n")
    config = load_config(tmp_path / "pop.yaml")
    assert config.model.name == "popularity" and config.model.params == {} and config.train.schedule.epochs == 5


@pytest.mark.parametrize(
    "name", ["../esc", "a/b", "a\\b", "a\0b", ".hidden", "..", "/abs", "", "-x", "x y", "é", "n" * 101]
)
def test_a_name_that_is_not_one_directory_name_is_refused(tmp_path: Path, name: str) -> None:
    """`name` becomes WORK/data/NAME, WORK/models/NAME, WORK/pipelines/NAME/state.json...: one path part, in the file
    as through --set."""
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: {json.dumps(name)}\nmodel: {{name: popularity}}\n")
    with pytest.raises(ConfigError, match=r"name: .* is not a valid name .* Fix: use 1 to 100 letters, digits"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"name: .* is not a valid name"):
        load_config(_write(tmp_path, "model: {name: popularity}\n"), {"name": name})
    assert load_config(path, {"name": "beauty-sasrec_v2.1"}).name == "beauty-sasrec_v2.1"


def test_the_paths_built_from_a_name_check_it_again(tmp_path: Path) -> None:
    """Defence in depth: a config built without validation (`model_construct`) still cannot put its outputs outside
    the work dir."""
    config = load_config(_write(tmp_path, "model: {name: popularity}\n"))
    assert ExperimentPaths.under(tmp_path, config).model_dir == tmp_path / "models" / "exp"
    with pytest.raises(ConfigError, match=r"name: '\.\./\.\./esc' is not a valid name"):
        ExperimentPaths.under(tmp_path, config.model_construct(**{**dict(config), "name": "../../esc"}))


def test_an_override_under_a_value_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "model: {name: sasrec}\n")
    with pytest.raises(ConfigError, match=r"model\.name\.x: model\.name is 'sasrec', not a mapping, .* Fix: set"):
        load_config(path, parse_overrides(["model.name.x=1"]))
    with pytest.raises(ConfigError, match=r"a dotted key has an empty part"):
        load_config(path, parse_overrides(["model..dim=1"]))


@pytest.mark.parametrize(
    ("value", "shown"),
    [("9" * 5000, "9" * 20 + r"\.\.\.9{10}, 5,000 characters"), (str(2**63), str(2**63)), ("-" + "1" * 30, "-1+"),
     ("1" * 400 + ".0", "1{20}"), ("1e999", "1e999")],
    ids=["5000-digits", "past-int64", "negative", "float-digits", "float-exponent"],
)  # fmt: skip
def test_a_number_too_large_is_refused_in_files_and_overrides(tmp_path: Path, value: str, shown: str) -> None:
    """Python reads no integer of more than 4,300 digits (a ValueError deep in the YAML parser), a float literal past
    1.8e308 is inf: both are config errors naming the line, the value and the bound."""
    path = _write(tmp_path, f"model:\n  name: sasrec\n  params: {{dim: {value}}}\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(path))}: the number on line 3 \({shown}.*too large"):
        load_config(path)
    with pytest.raises(ConfigError, match=rf"--set model.params.dim: the number on line 1 \({shown}.*too large"):
        parse_overrides([f"model.params.dim={value}"])
    assert parse_overrides(["a=.inf", f"b={2**63 - 1}", "c=1.7e308"]) == {"a": float("inf"), "b": 2**63 - 1,
                                                                          "c": 1.7e308}  # fmt: skip


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path
