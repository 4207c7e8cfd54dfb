"""What a bundle just loaded (at start-up, at a hot swap) serves: its recommender with the run-time items kept."""

from __future__ import annotations

import logging

from recsys.artifacts.added_items import AddedItemStore
from serving.recommender import Recommender
from serving.settings import ServingSettings

logger = logging.getLogger(__name__)


def added_item_store(settings: ServingSettings) -> AddedItemStore | None:
    """The store of the server's run-time items; None when they are off (`added_items_file` unset)."""
    return None if settings.added_items_file is None else AddedItemStore(settings.added_items_file)


def with_kept_items(recommender: Recommender, store: AddedItemStore | None) -> Recommender:
    """`recommender` (a bundle just loaded) serving the kept items its catalogue lacks, its item encoder loaded;
    those it holds are dropped from the store (the bundle was trained on them). A model that cannot place new items
    serves without them, and they stay kept for a model that can."""
    if store is None:
        return recommender
    if recommender.takes_new_items:
        recommender.load_item_encoder()  # now, not at the first add (under load)
    kept = store.load()
    trained = set(recommender.in_catalogue([item.item_id for item in kept]))
    pending = [item for item in kept if item.item_id not in trained]
    if trained:
        store.save(pending)
        logger.info("%d run-time items are in the new bundle's catalogue: no longer kept apart", len(trained))
    if not pending:
        return recommender
    if not recommender.takes_new_items:
        logger.warning(
            "%d run-time items kept in %s are not served: the %s model cannot place items it never trained on "
            "(serve a content-first model)", len(pending), store.path, recommender.name,
        )  # fmt: skip
        return recommender
    logger.info("placing %d run-time items kept in %s", len(pending), store.path)
    return recommender.with_items(pending)
