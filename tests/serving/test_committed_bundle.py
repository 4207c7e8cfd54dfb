"""The committed bundle CI's serve-only check serves (tests/fixtures/serve-bundle) loads with this version's code: a
change of the bundle's format fails here, in the full install, before the serve-only venv meets it."""

from __future__ import annotations

from recsys.artifacts.bundle import Bundle
from serving.recommender import Recommender
from tests.fixtures.serve_bundle import BUNDLE_DIR


def test_the_committed_bundle_serves() -> None:
    recommender = Recommender(Bundle(BUNDLE_DIR))
    history = recommender.training_history(recommender.histories.user_ids[1])
    assert history is not None and history[0]
    ranked = recommender.recommend(history[0], k=5, exclude_seen=True)
    assert len(ranked) == 5 and not {r.item_id for r in ranked} & {
        recommender.catalogue.item_ids[i - 1] for i in history[0]
    }
    similar = recommender.similar_items(1, k=3)
    assert similar is not None and len(similar) == 3
