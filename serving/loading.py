"""What a bundle just loaded (at start-up, at a hot swap, at a rollback) serves: its recommender with the run-time items
kept for it, and the checks `recsys serve` makes of them before it binds its port.

Every acknowledged add stays in the kept file (`recsys.artifacts.added_items`): a bundle whose catalogue holds an item
serves it from there, and the others place it by its text, so an id acknowledged once answers through every route
whichever bundle is served after. A bundle that could not (a model that cannot place items, more items to place than
`max_added_items`) is refused: at start-up `recsys serve` exits 2 saying so, at a hot swap the current model keeps
serving (`serving.reloader`).
"""

from __future__ import annotations

import logging

from recsys.artifacts.added_items import AddedItemStore, NewItem
from recsys.artifacts.registry import resolve_bundle
from recsys.errors import RecsysError
from serving.recommender import Recommender
from serving.settings import ServingSettings

logger = logging.getLogger(__name__)


def added_item_store(settings: ServingSettings) -> AddedItemStore | None:
    """The store of the server's run-time items; None when they are off (`added_items_file` unset)."""
    return None if settings.added_items_file is None else AddedItemStore(settings.added_items_file)


def with_kept_items(
    recommender: Recommender, kept: list[NewItem], store: AddedItemStore | None, max_items: int
) -> Recommender:
    """`recommender` (a bundle just loaded) serving the `kept` items its catalogue lacks (their texts' vectors read
    from the store's cache, only the others embedded); `RecsysError` when it cannot serve them all (`to_place`)."""
    if store is None:
        return recommender
    pending = to_place(recommender, kept, store, max_items)
    if not recommender.takes_new_items:
        logger.warning(
            "run-time items are off for this model: the served %s model cannot place items it never trained on, so "
            "POST /v1/admin/items answers 409 (serve a content-first model, or leave --added-items-file unset)",
            recommender.name,
        )
        return recommender
    if not pending:
        return recommender
    logger.info("placing %d run-time items kept in %s (%d in the catalogue)", len(pending), store.path,
                len(kept) - len(pending))  # fmt: skip
    return recommender.with_items(pending, store.embeddings_dir)


def to_place(recommender: Recommender, kept: list[NewItem], store: AddedItemStore, max_items: int) -> list[NewItem]:
    """The kept items the bundle's catalogue lacks, which its model must place; `RecsysError` when it cannot place
    them, or they are more than `max_items`."""
    trained = set(recommender.in_catalogue([item.item_id for item in kept]))
    pending = [item for item in kept if item.item_id not in trained]
    if pending and not recommender.takes_new_items:
        raise RecsysError(
            f"{store.path} keeps {len(pending)} run-time items the bundle's catalogue lacks (e.g. "
            f"{pending[0].item_id!r}), and its {recommender.name} model cannot place items it never trained on: they "
            "would answer 404. Fix: serve a content-first model or a bundle trained with them, or move the file away "
            "to drop them"
        )
    if len(pending) > max_items:
        raise RecsysError(
            f"{store.path} keeps {len(pending)} run-time items the bundle's catalogue lacks, more than "
            f"max_added_items ({max_items}). Fix: raise --max-added-items (RECSYS_MAX_ADDED_ITEMS) to at least "
            f"{len(pending)}, or serve a bundle trained with them"
        )
    return pending


def check_before_serving(settings: ServingSettings) -> None:
    """What `recsys serve` checks before it binds its port: there is a bundle to serve, a bundle directory given
    (`--bundle`) loads (a corrupt file of it is an error naming the file, not the server's start-up traceback) and,
    with run-time items on, their file reads (every entry) and the bundle can serve them all. `RecsysError` saying
    what is wrong and the fix."""
    bundle = resolve_bundle(settings.bundle, settings.model_name, settings.registry_uri)
    store = added_item_store(settings)
    kept = [] if store is None else store.load()
    if settings.bundle is not None:  # the one bundle it would serve: a corrupt file of it exits 2, naming the file
        recommender = Recommender(bundle)
    elif store is None or not kept:
        return
    else:
        try:
            recommender = Recommender(bundle)
        except Exception:  # a champion that does not load is the lifespan's to report: not ready until one does
            return
    if store is not None and kept:
        to_place(recommender, kept, store, settings.max_added_items)
