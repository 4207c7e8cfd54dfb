"""What was renamed since a result was recorded: the laboratory reads an old record under today's names.

The product's loader (`pipelines.config`) knows today's config keys only, and the product's `configs/` holds only the
configs a user starts from: the laboratory's moved to `benchmarks/configs/` (the benchmarks' settings from
configs/benchmarks/X.yaml to benchmarks/configs/X.yaml, the experiments from configs/D/S.yaml to
benchmarks/configs/D/S.yaml, so their names, `D-S`, stay). A committed result keeps the names of its day: its
`reproduce` record (config path, `--set` overrides) and the settings it recorded. `current_record` gives the record in
today's terms, so `python -m benchmarks.reproduce` checks and prints it as it would run now, and `renamed_keys` the
recorded settings of an experiment config (`benchmarks.quality`); the results' files stay as they were written.

Example:
    >>> renamed_key("train.lr"), renamed_key("sid.content.model"), renamed_key("train.seed")
    ('train.optimization.lr', 'content.model', 'train.seed')
    >>> renamed_keys({"train": {"lr": 0.01}})
    {'train': {'optimization': {'lr': 0.01}}}
    >>> config_path("configs/benchmarks/retrieval-zoo.yaml"), config_path("configs/beauty/sasrec.yaml")
    ('benchmarks/configs/retrieval-zoo.yaml', 'configs/beauty/sasrec.yaml')
    >>> config_path("benchmarks/configs/beauty-ranking-sources.yaml")
    'benchmarks/configs/beauty-multi-source-cold.yaml'
"""

from __future__ import annotations

import copy
from typing import Any

from benchmarks.common import REPO
from pipelines.config import set_dotted

# configs renamed in place, old path -> new (the result they wrote keeps its name)
RENAMED_CONFIGS: dict[str, str] = {
    "benchmarks/configs/beauty-ranking-sources.yaml": "benchmarks/configs/beauty-multi-source-cold.yaml",
    # the product's best generative config until configs/beauty/generative.yaml measured better
    "configs/beauty/tiger-ema-wide.yaml": "benchmarks/configs/beauty/tiger-ema-wide.yaml",
}

# benchmark modules renamed, old -> new (a result names the module of its day)
RENAMED_BENCHMARKS: dict[str, str] = {"benchmarks.generative_popularity": "benchmarks.generative_decoding"}

# config keys that moved, old dotted name -> new
RENAMED_KEYS: dict[str, str] = {
    **{
        f"train.{key}": f"train.schedule.{key}"
        for key in ("epochs", "patience", "monitor", "eval_every", "valid_users")
    },
    "train.max_train_seconds": "train.schedule.max_seconds",
    **{
        f"train.{key}": f"train.optimization.{key}"
        for key in (
            "batch_size",
            "accumulate_batches",
            "lr",
            "lr_schedule",
            "warmup_steps",
            "weight_decay",
            "ema_decay",
        )
    },
    **{
        f"train.{key}": f"train.hardware.{key}"
        for key in ("device", "precision", "threads", "compile", "compile_mode", "max_memory_gb")
    },
    **{f"train.{key}": f"train.distributed.{key}" for key in ("nproc_per_node", "shard_item_table")},
    "data.stream_parts": "train.stream_parts",
    "sid.content": "content",
    # the trained models a model is built on: one mapping by the roles its family declares
    "model.retriever_dir": "model.upstream.retriever",
    "model.holdout_retriever_dir": "model.upstream.holdout_retriever",
    "model.base_dir": "model.upstream.base",
    "model.members": "model.upstream.members",
}
OLD_SETTINGS, LAB_CONFIGS = "configs/benchmarks/", "benchmarks/configs/"
# keys of today that a config records only where set: the old layout recorded them unset (None, []) in every config
ABSENT_WHEN_UNSET = frozenset(new for old, new in RENAMED_KEYS.items() if old.startswith("model."))


def renamed_key(dotted: str) -> str:
    """The name a dotted key (an override's) has today."""
    for old, new in RENAMED_KEYS.items():
        if dotted == old or dotted.startswith(f"{old}."):
            return new + dotted[len(old) :]
    return dotted


def config_path(recorded: str) -> str:
    """The path in the repo, today, of a config a result recorded (a path relative to the repo)."""
    if recorded in RENAMED_CONFIGS:
        return RENAMED_CONFIGS[recorded]
    if recorded.startswith(OLD_SETTINGS):
        return LAB_CONFIGS + recorded.removeprefix(OLD_SETTINGS)
    lab = f"benchmarks/{recorded}"  # an experiment that moved to the laboratory
    if recorded.startswith("configs/") and not (REPO / recorded).is_file() and (REPO / lab).is_file():
        return lab
    return recorded


def renamed_keys(tree: dict[str, Any]) -> dict[str, Any]:
    """A recorded config mapping with every old key under its name of today."""
    tree = copy.deepcopy(tree)
    for old, new in RENAMED_KEYS.items():
        found, value = _pop_dotted(tree, old)
        if found and not (new in ABSENT_WHEN_UNSET and value in (None, [])):
            set_dotted(tree, new, value)
    return tree


def current_record(record: dict[str, Any]) -> dict[str, Any]:
    """A result's `reproduce` record {benchmark, config, overrides} in today's names: its benchmark module, its config's
    path, its overrides' keys, and those of the experiment overrides a benchmark's settings hold (e.g. `variants:
    {LABEL: {train.lr: ..}}`), and the config paths they name."""
    return {
        **record,
        "benchmark": RENAMED_BENCHMARKS.get(record["benchmark"], record["benchmark"]),
        "config": config_path(record["config"]),
        "overrides": _renamed_overrides(record["overrides"]),
    }


def _renamed_overrides(value: Any) -> Any:
    """`value` with every dotted key of a mapping in it, at any depth, under its name of today, and every config path
    in it (e.g. a benchmark's `models: [{config: configs/D/S.yaml}]`) where that config is today."""
    if isinstance(value, dict):
        return {renamed_key(key): _renamed_overrides(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_renamed_overrides(item) for item in value]
    if isinstance(value, str) and value.startswith("configs/") and value.endswith(".yaml"):
        return config_path(value)
    return value


def _pop_dotted(tree: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    """(whether `dotted` is in `tree`, its value), removed from `tree` (an emptied section stays)."""
    *parents, leaf = dotted.split(".")
    node: Any = tree
    for key in parents:
        node = node.get(key)
        if not isinstance(node, dict):
            return False, None
    if leaf not in node:
        return False, None
    return True, node.pop(leaf)
