"""Online = offline: the server's top-10 for a history is the offline evaluation's, item for item, ties included.

A SASRec, a popularity model (whose scores are counts: ties everywhere) and a generative retriever (beam search over
semantic IDs with the retrieval head's candidates beside the beam's) are trained by the pipeline on 1,200 synthetic
users of 3,000 items and served from their bundles by a real `recsys serve` process; 1,000 test users'
histories are sent one at a time and compared with the top-10 lists `recsys.evaluation.evaluate` made for the same
users. Scored alone (evaluation batch 1, one request at a time), both sides compute the same scores bit for bit; batched
with other users, a score may differ in its last float bit (the order of a matrix product's sums follows the batch),
which can swap two items closer than that: docs/serving.md says so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from pipelines.config import load_config
from pipelines.runner import run_pipeline
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.model_dir import load_model_dir
from recsys.evaluation import EvalConfig, UserSample, evaluate
from tests.conftest import recsys_serve

USERS = 1_000
K = 10


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> dict[str, Bundle]:
    """The registered bundles of a SASRec, the popularity baseline and a generative retriever on the same 1,200
    users."""
    work = tmp_path_factory.mktemp("online-offline")
    data = {"options": {"num_users": 1_200, "num_items": 3_000}}
    # no user tokens (user_buckets 0, as every product config): serving passes no user index, so a model trained
    # with them ranks every request as an unknown user's while evaluation reads each user's (docs/serving.md)
    generative = {
        "name": "generative",
        "params": {"dim": 16, "num_heads": 2, "ffn_dim": 32, "num_encoder_layers": 1, "num_decoder_layers": 1,
                   "beam_size": K, "retrieval_candidates": K, "user_buckets": 0},
    }  # fmt: skip
    sid = {"method": "rqkmeans", "rqkmeans": {"levels": 2, "codebook_size": 16}}
    found = {}
    for name, model, more in (
        ("sasrec", {}, {}),
        ("popularity", {"name": "popularity", "params": {}}, {}),
        ("generative", generative, {"sid": sid}),
    ):
        (work / name).mkdir()
        config = load_config(
            tiny_config(
                work / name, name=f"online-{name}", data=data, model=model, train={"schedule": {"epochs": 2}}, **more
            )
        )
        outputs, _ = run_pipeline(config, work)
        assert outputs.registration is not None
        found[name] = Bundle(outputs.registration.bundle_dir)
    return found


@pytest.mark.slow
@pytest.mark.parametrize(("model", "exclude_seen"), [("sasrec", False), ("popularity", True), ("generative", False)])
def test_the_server_ranks_as_the_offline_evaluation(bundles: dict[str, Bundle], model: str, exclude_seen: bool) -> None:
    bundle = bundles[model]
    trained = load_model_dir(bundle.model_dir)
    split = trained.data.eval_split("test")
    sample = UserSample(USERS, seed=0)
    config = EvalConfig(ks=(K,), batch_size=1, exclude_seen=exclude_seen)
    offline = evaluate(trained.model, split, trained.data.num_items, config, sample)
    item_ids = ["", *trained.data.items["item_id"].to_list()]
    rows = sample.rows(len(split.targets)).tolist()
    assert len(rows) == USERS
    online = []
    with recsys_serve("--bundle", str(bundle.path)) as (base, _), httpx.Client(base_url=base, timeout=10) as client:
        for row in rows:
            history = [item_ids[i] for i in split.histories.row(row).tolist()]
            body = {"history": history, "k": K, "exclude_seen": exclude_seen}
            answer = client.post("/v1/recommendations", json=body).json()
            assert answer["source"] == "model", answer
            online.append([item["item_id"] for item in answer["items"]])
    expected = [[item_ids[i] for i in top] for top in offline.top_items.tolist()]
    differing = [(row, got, want) for row, got, want in zip(rows, online, expected, strict=True) if got != want]
    assert not differing, f"{len(differing)} of {USERS} users differ, e.g. {differing[0]}"
    if model == "popularity":  # the comparison held where ties decide: an item listed shares its count with another
        counts = trained.data.item_counts()[1:].tolist()
        shared = {count for count in set(counts) if counts.count(count) > 1}
        index = {item_id: i for i, item_id in enumerate(item_ids)}
        tied = sum(any(counts[index[i] - 1] in shared for i in top) for top in online)
        assert tied > USERS // 2, f"ties decided {tied} of {USERS} lists: too few to test their order"
