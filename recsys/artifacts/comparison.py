"""Challenger vs champion on the same users: the paired difference of every ranking metric, overall and per slice.

Two evaluations pair only when they ranked the same users' same targets (equal split digests,
`recsys.artifacts.per_user`); each metric's difference (challenger minus champion) comes with its paired-bootstrap
interval and the p-value of a paired randomisation test (`recsys.evaluation.uncertainty`). Slices are the challenger's
(the same users, so the same slices when both were trained on the same data). The result, JSON-able:

    {"challenger": name, "champion": name, "users": U, "uncertainty": {...}, "split": "test",
     "overall": {metric: {"difference", "low", "high", "p_value"}},
     "slices": {family: [{"slice": name, "users": n, "metrics": {metric: {...}}}]}}

(an empty slice has "metrics": {}; with `slices` named, only those slices, and the families holding them).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, NonNegativeInt, PositiveInt, ValidationError

from recsys.artifacts.evaluation_dir import EVALUATION_FILE
from recsys.artifacts.per_user import PER_USER_FILE, SEARCH_RANKS_FILE, PerUserRanks, read_search_ranks
from recsys.errors import ConfigError, DataError, RecsysError
from recsys.evaluation.uncertainty import Uncertainty, paired_difference, per_user_metrics
from recsys.runtime.json_files import read_json_object
from recsys.runtime.validation import problems


def compare_ranks(
    challenger: PerUserRanks,
    champion: PerUserRanks,
    names: tuple[str, str],
    ks: Sequence[int],
    uncertainty: Uncertainty,
    slices: Collection[str] | None = None,
) -> dict[str, Any]:
    """The comparison of two models' per-user ranks on one split (the module's JSON shape; `split` left out).

    Args:
        challenger, champion: the two evaluations' ranks, of the same users (else `ConfigError`).
        names: (challenger's name, champion's name).
        ks: the cut-offs of the metrics compared.
        uncertainty: the intervals' resamples, confidence and seed (resamples > 0).
        slices: the slice names to compare beside the overall figures (None: every slice); each slice's bootstrap
            is most of the cost, so a caller that reads a few slices names them. An unknown name is a ConfigError.
    """
    if challenger.split_digest != champion.split_digest:
        raise ConfigError(
            f"{names[0]} and {names[1]} were evaluated on different users or targets ({len(challenger.ranks)} vs "
            f"{len(champion.ranks)} users, split digests {challenger.split_digest[:12]} vs "
            f"{champion.split_digest[:12]}): a paired comparison needs the same split. Fix: evaluate both on the same "
            "prepared data (`recsys evaluate --data-dir DIR` for both, or configs with the same data section)"
        )
    metric_names, a = per_user_metrics(challenger.ranks, ks)
    b = per_user_metrics(champion.ranks, ks)[1]

    def differences(members: Any = slice(None)) -> dict[str, dict[str, float]]:
        paired = paired_difference(a[members], b[members], metric_names, uncertainty)
        return {difference.metric: difference.to_dict() for difference in paired}

    masks = {family: challenger.slice_masks(family) for family in challenger.slices}
    known = {name for family in masks.values() for name in family}
    if slices is not None and (unknown := sorted(set(slices) - known)):
        raise ConfigError(f"{names[0]} vs {names[1]}: no slice {unknown} in the evaluations. Fix: one of "
                          f"{sorted(known)} (the cold slices need a cold-start split)")  # fmt: skip
    compared = {
        family: [
            {"slice": name, "users": int(members.sum()), "metrics": differences(members) if members.any() else {}}
            for name, members in family_masks.items()
            if slices is None or name in slices
        ]
        for family, family_masks in masks.items()
    }
    return {"challenger": names[0], "champion": names[1], "users": len(challenger.ranks),
            "uncertainty": uncertainty.to_dict(), "overall": differences(),
            "slices": {family: entries for family, entries in compared.items() if entries}}  # fmt: skip


def compare_evaluation_dirs(
    challenger_dir: Path, champion_dir: Path, uncertainty: Uncertainty, slices: Collection[str] | None = None
) -> dict[str, Any]:
    """The comparison of two evaluation directories of the pipeline's `evaluate` step (evaluation.json and
    per_user.npz each), over the challenger's metrics and slices (only `slices`, when named: `compare_ranks`)."""
    reports = [read_evaluation_report(directory) for directory in (challenger_dir, champion_dir)]
    if reports[0]["split_digest"] != reports[1]["split_digest"]:
        raise ConfigError(
            f"{challenger_dir} ({reports[0]['name']}, {reports[0]['users']} users) and {champion_dir} "
            f"({reports[1]['name']}, {reports[1]['users']} users) ranked different users or targets (split digests "
            "differ): a paired comparison needs the same split. Fix: train both on the same data (the same data "
            "section and seed), then evaluate them again"
        )
    ranks = [PerUserRanks.read(directory / PER_USER_FILE) for directory in (challenger_dir, champion_dir)]
    ks = reports[0]["protocol"]["ks"]
    names = (str(reports[0]["name"]), str(reports[1]["name"]))
    return {**compare_ranks(ranks[0], ranks[1], names, ks, uncertainty, slices), "split": reports[0]["split"]}


REEVALUATE = "evaluate it again: `recsys pipeline run --config CONFIG --rerun evaluate`"


class _Protocol(BaseModel):
    model_config = ConfigDict(extra="allow")

    ks: list[PositiveInt]


class _EvaluationHeader(BaseModel):
    """What a comparison reads of an evaluation.json (the rest of the report is the evaluate step's)."""

    model_config = ConfigDict(extra="allow")

    name: str
    split: str
    users: NonNegativeInt
    split_digest: str
    protocol: _Protocol


def read_evaluation_report(evaluation_dir: Path) -> dict[str, Any]:
    """The evaluation.json of an evaluation directory, checked to hold what a comparison reads (its name, split, users,
    split digest and cut-offs) beside its per_user.npz; DataError naming the file and the fix otherwise."""
    path = evaluation_dir / EVALUATION_FILE
    if not path.is_file():
        raise RecsysError(f"{evaluation_dir} holds no {EVALUATION_FILE}. Fix: pass an evaluation directory of "
                          "`recsys pipeline run` (WORK/evaluations/NAME)")  # fmt: skip
    report = read_json_object(path, REEVALUATE)
    if "split_digest" not in report or not (evaluation_dir / PER_USER_FILE).is_file():
        raise RecsysError(
            f"{evaluation_dir} predates per-user ranks (no split_digest or {PER_USER_FILE}). Fix: evaluate it again: "
            "`recsys pipeline run --config CONFIG --rerun evaluate`"
        )
    try:
        _EvaluationHeader.model_validate(report, strict=True)
    except ValidationError as err:
        raise DataError(path, f"not an evaluation report of this version ({problems(err)})", REEVALUATE) from err
    return report


def compare_search_dirs(
    challenger_dir: Path, champion_dir: Path, ks: Sequence[int], uncertainty: Uncertainty
) -> dict[str, dict[str, Any]]:
    """Two evaluations of models that read queries compared per search level and setting, user by user: {key: {metric:
    paired difference, "users": n}} over the users both ranked at that key (their test queries are each model's own
    draw, disjoint from its training queries: with other training queries, a few users may get another query)."""
    reports = [read_evaluation_report(directory) for directory in (challenger_dir, champion_dir)]
    if reports[0]["split_digest"] != reports[1]["split_digest"]:
        raise ConfigError(f"{challenger_dir} and {champion_dir} ranked different users (split digests differ). Fix: "
                          "evaluate both on the same prepared data")  # fmt: skip
    a, b = (read_search_ranks(directory / SEARCH_RANKS_FILE) for directory in (challenger_dir, champion_dir))
    compared: dict[str, dict[str, Any]] = {}
    for key in sorted(a.keys() & b.keys()):
        (rows_a, ranks_a), (rows_b, ranks_b) = a[key], b[key]
        both = rows_a[torch.isin(rows_a, rows_b)]
        names, values_a = per_user_metrics(ranks_a[torch.searchsorted(rows_a, both)], ks)
        values_b = per_user_metrics(ranks_b[torch.searchsorted(rows_b, both)], ks)[1]
        paired = paired_difference(values_a, values_b, names, uncertainty)
        compared[key.rsplit("/", 1)[0]] = {"users": len(both), **{d.metric: d.to_dict() for d in paired}}
    return compared
