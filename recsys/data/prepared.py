"""Read a prepared data directory (see `recsys.data.schema`) into per-user sequences and splits.

Dimension letters: U users, N interactions, V items (+1 for padding index 0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import polars as pl
import torch

from recsys.data import schema
from recsys.data.jagged import Jagged
from recsys.data.splits import MIN_INTERACTIONS, VALID, held_out
from recsys.data.tasks import task_labels, tasks_in
from recsys.data.times import HistoryTimes
from recsys.errors import ConfigError, DataError
from recsys.runtime.digest import feed_file
from recsys.runtime.json_files import read_json_object


@dataclass(frozen=True)
class EvalSplit:
    """Inputs and targets of one leave-one-out evaluation split.

    Args:
        histories: (U,) rows of item_idx the model may read, oldest first.
        targets: (U,) the held-out item_idx per user.
        user_idx: (U,) the users, aligned with rows.
        timestamps: (U,) rows aligned with `histories`: the time of every history item (for time-aware models);
            None = unknown.
        request_times: (U,) the held-out item's time: the moment the recommendation is for (with `timestamps`).
        candidates: (V+1,) bool, the items ranked for these users (e.g. their domain's); None = every item.
        target_labels: {task: (U,)} the targets' labels of each task the data has (`recsys.data.tasks`).
    """

    histories: Jagged
    targets: torch.Tensor
    user_idx: torch.Tensor
    timestamps: Jagged | None = None
    request_times: torch.Tensor | None = None
    candidates: torch.Tensor | None = None
    target_labels: dict[str, torch.Tensor] = field(default_factory=dict)

    def times(self, rows: torch.Tensor, width: int) -> HistoryTimes | None:
        """The times of `rows`, histories left-padded to `width` (as `histories.select(rows).to_padded(width)`)."""
        if self.timestamps is None or self.request_times is None:
            return None
        return HistoryTimes(self.timestamps.select(rows).to_padded(width), self.request_times[rows])


@dataclass(frozen=True)
class TrainingRows:
    """Every user's training interactions, oldest first: the items and, aligned with them, their times and labels.

    Args:
        items: (U,) rows of item_idx.
        timestamps: (U,) rows of unix seconds (or positions, for sources without times).
        labels: {task: (U,) rows of float labels}, one per task the data has.
    """

    items: Jagged
    timestamps: Jagged
    labels: dict[str, Jagged] = field(default_factory=dict)

    def truncate_last(self, count: int) -> TrainingRows:
        """Every row without its last `count` interactions."""
        return TrainingRows(
            self.items.truncate_last(count),
            self.timestamps.truncate_last(count),
            {task: rows.truncate_last(count) for task, rows in self.labels.items()},
        )


@dataclass(frozen=True)
class SequenceData:
    """A prepared dataset: every user's chronological sequence and the item catalog.

    Leave-one-out (`recsys.data.splits`): the last item of each sequence is the test target, the second-to-last
    the validation target, the rest trains. Items marked `is_cold` (cold-start split) are removed from
    training sequences and from model inputs; they remain as validation/test targets.

    Args:
        sequences: (U,) rows of item_idx; row u is the user of `users` row u (user_idx u + 1 in a whole dataset).
        timestamps: (U,) rows aligned with `sequences`: the `ts` of every interaction (unix seconds, or the
            position in the sequence for sources without times).
        items: the catalog (item_idx 1..V, item_id, title, is_cold, ...), sorted by item_idx.
        users: user_idx 1..U -> user_id, sorted by user_idx.
        meta: meta.json of the directory.
        candidates: (V+1,) bool, the items these users can be recommended (`for_domain` sets it: the domain's
            items); None = every item. Training keeps the others out of the softmax, evaluation out of the ranking.
        labels: {task: (U,) rows aligned with `sequences`}: every interaction's label of each task the data has
            (`recsys.data.tasks`, in that module's order).
    """

    sequences: Jagged
    timestamps: Jagged
    items: pl.DataFrame
    users: pl.DataFrame
    meta: dict[str, Any]
    candidates: torch.Tensor | None = None
    labels: dict[str, Jagged] = field(default_factory=dict)

    @property
    def num_items(self) -> int:
        return self.items.height

    @property
    def num_users(self) -> int:
        return self.users.height

    @property
    def tasks(self) -> tuple[str, ...]:
        """The prediction tasks beside the next item whose labels the data has."""
        return tuple(self.labels)

    @cached_property
    def cold_mask(self) -> torch.Tensor:
        """(V+1,) bool, True for cold-start items (index 0, the padding, is never cold)."""
        mask = torch.zeros(self.num_items + 1, dtype=torch.bool)
        cold = self.items.filter(pl.col(schema.IS_COLD))[schema.ITEM_IDX].to_torch().long()
        mask[cold] = True
        return mask

    @cached_property
    def domains(self) -> list[str]:
        """The items' domain names, sorted (empty without a `domain` column)."""
        if schema.DOMAIN not in self.items.columns:
            return []
        return sorted(self.items[schema.DOMAIN].drop_nulls().unique().to_list())

    def item_domains(self) -> torch.Tensor:
        """(V+1,) int64, every item's index in `domains` (-1 for the padding row and items without one)."""
        names = {name: i for i, name in enumerate(self.domains)}
        out = torch.full((self.num_items + 1,), -1, dtype=torch.int64)
        if names:
            out[1:] = torch.tensor([names.get(d, -1) for d in self.items[schema.DOMAIN].to_list()])
        return out

    def for_domain(self, domain: str) -> SequenceData:
        """Every user's interactions in `domain`, for the users with at least 3 there (train, valid, test), and
        `candidates` = the domain's items.

        Item indices stay those of the whole catalog, so a model of all domains scores this data as is.
        """
        if domain not in self.domains:
            raise KeyError(f"unknown domain {domain!r}: this dataset has {self.domains}")
        item_domain = self.item_domains()
        in_domain = item_domain == self.domains.index(domain)
        keep = in_domain[self.sequences.values]
        rows = torch.nonzero(_keep_values(self.sequences, keep).lengths() >= MIN_INTERACTIONS).squeeze(1)

        def kept(aligned: Jagged) -> Jagged:
            return _keep_values(aligned, keep).select(rows)

        return SequenceData(
            sequences=kept(self.sequences),
            timestamps=kept(self.timestamps),
            items=self.items,
            users=self.users[rows.tolist()],
            meta=self.meta,
            candidates=in_domain,
            labels={task: kept(labels) for task, labels in self.labels.items()},
        )

    def training_excluded(self) -> torch.Tensor:
        """(V+1,) bool, items kept out of training softmaxes: cold-start items and non-candidates."""
        excluded = self.cold_mask.clone()
        if self.candidates is not None:
            excluded |= ~self.candidates
            excluded[0] = False
        return excluded

    def _warm(self, back: int) -> Callable[[Jagged], Jagged]:
        """What drops, from rows aligned with `sequences`, each row's last `back` values and the values of cold items
        (which values are cold is found once, for every aligned table)."""
        keep = ~self.cold_mask[self.sequences.truncate_last(back).values] if bool(self.cold_mask.any()) else None

        def warm(aligned: Jagged) -> Jagged:
            rows = aligned.truncate_last(back)
            return rows if keep is None else _keep_values(rows, keep)

        return warm

    @cached_property
    def _training_rows(self) -> TrainingRows:
        return self.training_rows()

    def training_rows(self) -> TrainingRows:
        """Every sequence without its validation and test targets (and without cold items), with times and labels."""
        warm = self._warm(held_out(VALID))
        return TrainingRows(
            warm(self.sequences), warm(self.timestamps), {task: warm(labels) for task, labels in self.labels.items()}
        )

    def training_sequences(self) -> Jagged:
        """(U,) rows: every sequence without its validation and test targets (and without cold items)."""
        return self._warm(held_out(VALID))(self.sequences)

    def eval_split(self, split: str) -> EvalSplit:
        """Histories and targets for `split` in {"valid", "test"}."""
        back = held_out(split)
        warm = self._warm(back)
        return EvalSplit(
            histories=warm(self.sequences),
            targets=self.sequences.last(back),
            user_idx=self.users[schema.USER_IDX].to_torch().long(),
            timestamps=warm(self.timestamps),
            request_times=self.timestamps.last(back),
            candidates=self.candidates,
            target_labels={task: labels.last(back) for task, labels in self.labels.items()},
        )

    def item_counts(self) -> torch.Tensor:
        """(V+1,) how often each item occurs in the training sequences (index 0 stays 0)."""
        return torch.bincount(self.training_sequences().values, minlength=self.num_items + 1)

    def training_epoch(self, generator: torch.Generator) -> Iterator[TrainingRows]:
        """One epoch's training rows: here all of them at once (`PreparedParts` yields a shuffle buffer at a time);
        `generator` is not drawn from, so the batches' shuffle is the same as from `training_rows()`."""
        del generator
        yield self._training_rows

    def select_users(self, rows: torch.Tensor) -> SequenceData:
        """The users at `rows` (ascending row indices) with everything aligned to them."""
        return SequenceData(
            sequences=self.sequences.select(rows),
            timestamps=self.timestamps.select(rows),
            items=self.items,
            users=self.users[rows.tolist()],
            meta=self.meta,
            candidates=self.candidates,
            labels={task: labels.select(rows) for task, labels in self.labels.items()},
        )

    def fingerprint(self, digest: Any) -> None:
        """Feed what training learns from (the sequences, candidates and task labels) to `digest` (a hashlib one)."""
        tensors = [self.sequences.values, self.sequences.offsets]
        tensors += [] if self.candidates is None else [self.candidates]
        tensors += [labels.values for _, labels in sorted(self.labels.items())]
        for tensor in tensors:
            digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())

    def user_row(self, user_id: str) -> int:
        """Row of `user_id` in `sequences` (user_idx - 1 for a whole dataset); KeyError with a hint if unknown."""
        hit = self.users.with_row_index("row").filter(pl.col(schema.USER_ID) == user_id)
        if hit.height == 0:
            raise KeyError(f"unknown user {user_id!r}: it is not in users.parquet of this dataset")
        row: int = hit["row"].cast(pl.Int64).item()
        return row

    @cached_property
    def _display_titles(self) -> list[str]:
        """Title of every item in item_idx order, its item_id where the title is empty."""
        return (
            self.items.select(
                pl.when(pl.col(schema.TITLE).fill_null("") == "")
                .then(pl.col(schema.ITEM_ID))
                .otherwise(pl.col(schema.TITLE))
            )
            .to_series()
            .to_list()
        )

    def titles(self, item_idx: torch.Tensor) -> list[str]:
        """Titles (or item ids where the title is empty) for a 1-d tensor of item_idx."""
        return [self._display_titles[int(i) - 1] for i in item_idx]


class TrainingData(Protocol):
    """What training reads from a dataset: a `SequenceData` in memory, or `PreparedParts` streamed from disk."""

    @property
    def num_items(self) -> int: ...

    @property
    def num_users(self) -> int: ...

    def training_excluded(self) -> torch.Tensor: ...

    def item_domains(self) -> torch.Tensor: ...

    def item_counts(self) -> torch.Tensor: ...

    def training_epoch(self, generator: torch.Generator) -> Iterator[TrainingRows]:
        """One epoch's training rows, in one or several pieces."""
        ...

    def select_users(self, rows: torch.Tensor) -> SequenceData: ...

    def eval_split(self, split: str) -> EvalSplit: ...

    def fingerprint(self, digest: Any) -> None: ...


def _keep_values(rows: Jagged, keep: torch.Tensor) -> Jagged:
    """The rows with only the values where `keep` (N,) is True, in order."""
    row_of_value = torch.repeat_interleave(torch.arange(len(rows)), rows.lengths())
    lengths = torch.zeros(len(rows), dtype=torch.int64).index_add_(0, row_of_value, keep.long())
    return Jagged.from_lengths(rows.values[keep], lengths)


def load_prepared(data_dir: Path, domain: str | None = None) -> SequenceData:
    """Load a prepared directory (interactions in one file or in parts), restricted to the users and items of `domain`
    (a config's `data.domain`) when given; `DataError` naming the missing file or broken invariant."""
    data_dir = Path(data_dir)
    items, meta = _read_catalog(data_dir)
    users = pl.read_parquet(data_dir / schema.USERS_FILE).sort(schema.USER_IDX)
    files = schema.interaction_files(data_dir)
    where = files[0] if len(files) == 1 else data_dir / schema.INTERACTIONS_DIR
    if users.height == 0:
        raise DataError(where, "the prepared data has no users", "prepare the data again from a non-empty input")
    data = _sequence_data(_read_interactions(files), items, users, meta, where)
    if domain is None:
        return data
    if domain not in data.domains:
        raise ConfigError(f"data.domain={domain!r} is not a domain of {data_dir}. Fix: one of {data.domains}")
    return data.for_domain(domain)


def _read_catalog(data_dir: Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """items.parquet (sorted by item_idx) and meta.json, after checking the directory's files and schema version."""
    for name in (schema.ITEMS_FILE, schema.USERS_FILE, schema.META_FILE):
        if not (data_dir / name).is_file():
            raise DataError(data_dir / name, "prepared data file not found", schema.PREPARE_HINT)
    meta = read_json_object(data_dir / schema.META_FILE, schema.PREPARE_HINT)
    if meta.get("schema_version") != schema.SCHEMA_VERSION:
        raise DataError(
            data_dir / schema.META_FILE,
            f"schema_version {meta.get('schema_version')} is not {schema.SCHEMA_VERSION}",
            "prepare the data again with this version of recsys",
        )
    return pl.read_parquet(data_dir / schema.ITEMS_FILE).sort(schema.ITEM_IDX), meta


def _sequence_data(
    inter: pl.DataFrame, items: pl.DataFrame, users: pl.DataFrame, meta: dict[str, Any], where: Path
) -> SequenceData:
    """The sequences of `inter` (sorted by user_idx, each user's rows in order), one per row of `users`."""
    lengths = inter.group_by(schema.USER_IDX, maintain_order=True).len()["len"].to_torch().long()
    if len(lengths) != users.height or (len(lengths) and int(lengths.min()) < MIN_INTERACTIONS):
        raise DataError(
            where,
            f"every user needs at least {MIN_INTERACTIONS} interactions (train, valid, test) and one row in "
            "users.parquet",
            f"prepare the data again (`recsys data prepare` drops users with fewer than {MIN_INTERACTIONS})",
        )
    sequences = Jagged.from_lengths(inter[schema.ITEM_IDX].to_torch().long(), lengths)
    timestamps = Jagged.from_lengths(inter[schema.TS].to_torch().long(), lengths)
    labels = {
        task: Jagged.from_lengths(values, lengths) for task, values in task_labels(inter, tasks_in(inter)).items()
    }
    return SequenceData(sequences, timestamps, items, users, meta, labels=labels)


@dataclass(frozen=True)
class PreparedParts:
    """A prepared directory read a few parts of its users at a time (`recsys data prepare` writes a large input as
    parts by user hash), so that training holds one shuffle buffer of users, not every sequence.

    An epoch (`training_epoch`) visits the parts in an order drawn from the trainer's generator (deterministic by seed
    and epoch), `buffer_parts` parts at a time: their users' training rows are shuffled and packed together. The
    sequences read this way carry user_idx only (user ids are not read: training does not need them).

    Args:
        data_dir: the prepared directory.
        files: its interaction files (parts), in part order.
        catalog: the items and meta of the directory, as a dataset without users (item-side facts: cold items,
            domains, the number of items).
        num_users: users in users.parquet.
        buffer_parts: parts per shuffle buffer (more parts: a better mix, more memory).
    """

    data_dir: Path
    files: tuple[Path, ...]
    catalog: SequenceData
    num_users: int
    buffer_parts: int = 1

    @staticmethod
    def open(data_dir: Path, buffer_parts: int = 1) -> PreparedParts:
        """The parts of `data_dir` (one file is one part); `DataError` as `load_prepared` for a broken directory."""
        data_dir = Path(data_dir)
        items, meta = _read_catalog(data_dir)
        user_idx = pl.scan_parquet(data_dir / schema.USERS_FILE).select(schema.USER_IDX)
        num_users = int(user_idx.select(pl.len()).collect().item())
        no_users = Jagged.from_lengths(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
        catalog = SequenceData(no_users, no_users, items, pl.DataFrame(schema={schema.USER_IDX: pl.Int64}), meta)
        return PreparedParts(data_dir, tuple(schema.interaction_files(data_dir)), catalog, num_users, buffer_parts)

    @property
    def num_items(self) -> int:
        return self.catalog.num_items

    def training_excluded(self) -> torch.Tensor:
        return self.catalog.training_excluded()

    def item_domains(self) -> torch.Tensor:
        return self.catalog.item_domains()

    def read(self, files: Sequence[Path], user_idx: torch.Tensor | None = None) -> SequenceData:
        """The users of `files` (or, of them, those in `user_idx`), sorted by user_idx."""
        inter = _read_interactions(list(files), user_idx)
        users = inter.select(pl.col(schema.USER_IDX).unique(maintain_order=True).cast(pl.Int64))
        return _sequence_data(inter, self.catalog.items, users, self.catalog.meta, self.data_dir)

    def item_counts(self) -> torch.Tensor:
        """(V+1,) training interactions per item, counted one part at a time (once: every part is read for it)."""
        return self._item_counts

    @cached_property
    def _item_counts(self) -> torch.Tensor:
        counts = torch.zeros(self.num_items + 1, dtype=torch.int64)
        for path in self.files:
            counts += self.read([path]).item_counts()
        return counts

    def training_epoch(self, generator: torch.Generator) -> Iterator[TrainingRows]:
        """One epoch's training rows, a shuffle buffer of parts at a time, in an order drawn from `generator`."""
        order = torch.randperm(len(self.files), generator=generator)
        for buffer in torch.split(order, self.buffer_parts):
            yield self.read([self.files[i] for i in buffer.tolist()]).training_rows()

    def select_users(self, rows: torch.Tensor) -> SequenceData:
        """The users at `rows` (ascending row indices of users.parquet, i.e. user_idx - 1), read part by part."""
        return self.read(self.files, rows + 1)

    def eval_split(self, split: str) -> EvalSplit:
        """Every user's split: this reads every part (a full validation pass needs every user)."""
        return self.read(self.files).eval_split(split)

    def fingerprint(self, digest: Any) -> None:
        """Feed the bytes of the interaction files (what training learns from) to `digest`."""
        for path in self.files:
            feed_file(digest, path)


def _read_interactions(files: list[Path], user_idx: torch.Tensor | None = None) -> pl.DataFrame:
    """The interactions of `files` (each sorted by user_idx, each user in one of them) in one frame sorted by user_idx,
    each user's rows in their order: the columns the data layer reads; only the users in `user_idx` when given."""
    label_columns = [c for c in (schema.EVENT, schema.VALUE) if c in pl.read_parquet_schema(files[0])]
    wanted = None if user_idx is None else pl.Series(user_idx.tolist(), dtype=pl.Int64)
    parts = []
    for path in files:
        part = pl.read_parquet(path, columns=[schema.USER_IDX, schema.ITEM_IDX, schema.TS, *label_columns])
        if not part[schema.USER_IDX].is_sorted():
            raise DataError(path, "rows are not sorted by user_idx", "prepare the data again")
        if wanted is not None:
            part = part.filter(pl.col(schema.USER_IDX).cast(pl.Int64).is_in(wanted.implode()))
        parts.append(part)
    if len(parts) == 1:
        return parts[0]
    return pl.concat(parts).sort(schema.USER_IDX, maintain_order=True)  # parts split the users: merge them
