"""Content-first item vectors: the residual follows the evidence, cold items get their content's vector, and SASRec
built on them reaches items it never trained on."""

from __future__ import annotations

import pytest
import torch

from recsys.data.prepared import SequenceData
from recsys.errors import ConfigError
from recsys.models.family import ModelInputs
from recsys.models.hstu import HSTU, HSTUConfig
from recsys.models.registry import build_model
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.modules.content_items import ContentFirstItems
from tests.recsys.modules.cold_start import cold_recall, structured_codes


def test_the_residual_is_kept_with_a_probability_that_grows_with_the_count() -> None:
    items = ContentFirstItems(torch.randn(5, 3), torch.tensor([0.0, 0.0, 1.0, 10.0, 1000.0]), dim=4, half_count=10.0)
    keep = items.keep_probability
    assert keep[0] == keep[1] == 0.0, "the padding and a never-trained item have no residual"
    assert 0 < keep[2] < keep[3] < keep[4] < 1
    assert keep[3] == pytest.approx(0.5), "half_count is the count kept half the time"


def test_training_keeps_each_residual_at_its_rate_and_scoring_weights_it_by_that_rate() -> None:
    torch.manual_seed(0)
    items = ContentFirstItems(torch.randn(4, 3), torch.tensor([0.0, 0.0, 10.0, 30.0]), dim=2, half_count=10.0)
    with torch.no_grad():
        items.residual.weight.fill_(1.0)  # type: ignore[union-attr]
    content_alone = items.of_content(items.content)
    items.train()
    kept = torch.stack([(items() - content_alone)[:, 0] for _ in range(4000)])  # 1 where kept, 0 where dropped
    assert kept[:, 1].abs().max() < 1e-6, "a never-trained item's residual is never kept"
    torch.testing.assert_close(kept[:, 2:].mean(0), torch.tensor([0.5, 0.75]), atol=0.03, rtol=0)
    items.eval()
    torch.testing.assert_close((items() - content_alone)[2:, 0], torch.tensor([0.5, 0.75]))
    assert items()[0].abs().max() == 0, "the padding row is zero"


def test_inference_projects_the_catalogue_once_per_state_of_the_weights() -> None:
    items = ContentFirstItems(torch.randn(4, 3), torch.tensor([0.0, 3.0, 0.0, 8.0]), dim=2, half_count=1.0).eval()
    with torch.no_grad():
        table = items()
        assert items() is table  # kept: a serving call gathers rows, it does not project the catalogue
        items.residual.weight.add_(1.0)  # type: ignore[union-attr]  # in place, as a load or an optimizer step
        changed = items()
    assert changed is not table
    torch.testing.assert_close(changed, items._vectors().detach())
    items.train()
    assert items() is not items(), "training draws the residuals afresh every call"


def test_an_item_never_trained_has_its_contents_vector_and_new_text_gets_the_same() -> None:
    content = torch.randn(4, 3)
    items = ContentFirstItems(content, torch.tensor([0.0, 3.0, 0.0, 8.0]), dim=2, half_count=1.0).eval()
    with torch.no_grad():
        items.residual.weight.normal_()  # type: ignore[union-attr]
    torch.testing.assert_close(items()[2], items.of_content(content[2:3])[0])
    assert not torch.allclose(items()[1], items.of_content(content[1:2])[0])


def _content_first_config(data: SequenceData, content: torch.Tensor, **fields: object) -> SASRecConfig:
    return SASRecConfig(
        num_items=data.num_items, max_history=20, dim=32, num_heads=1, ffn_dim=64, dropout=0.1,
        content_first=True, content_dim=content.shape[1], encoder="test", **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def _one_hot_content(data: SequenceData) -> torch.Tensor:
    """(V+1, C) a content embedding that knows each item's category and brand, as a text encoder would."""
    codes = structured_codes(data)[:, :2].clamp_min(0)
    content = torch.cat([torch.nn.functional.one_hot(codes[:, level]).float() for level in range(2)], dim=1)
    content[0] = 0.0
    return content


def test_content_first_sasrec_reaches_cold_items_that_id_only_sasrec_cannot(cold_data: SequenceData) -> None:
    content = _one_hot_content(cold_data)
    base = dict(num_items=cold_data.num_items, max_history=20, dim=32, num_heads=1, ffn_dim=64, dropout=0.1)
    id_only = cold_recall(cold_data, SASRecConfig(**base), None)  # type: ignore[arg-type]
    config = _content_first_config(cold_data, content)
    counts = cold_data.item_counts().float()
    torch.manual_seed(0)
    model = SASRec(config, content=content, counts=counts)
    assert float(model.content_items.keep_probability[cold_data.cold_mask].max()) == 0.0  # type: ignore[union-attr]
    with_content = cold_recall(cold_data, config, None, model)
    assert id_only < 0.02, "an ID-only model cannot know items it never trained on"
    assert with_content > id_only + 0.05


def test_a_saved_content_first_model_scores_as_it_did(cold_data: SequenceData) -> None:
    content = _one_hot_content(cold_data)
    config = _content_first_config(cold_data, content, residual_half_count=2.0)
    model = SASRec(config, content=content, counts=cold_data.item_counts().float()).eval()
    with torch.no_grad():
        model.content_items.residual.weight.normal_()  # type: ignore[union-attr]
    loaded = SASRec(config)  # shaped from the saved config alone, as a model directory loads
    loaded.load_state_dict(model.state_dict())
    histories = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    torch.testing.assert_close(loaded.eval().score(histories), model.score(histories))


def test_the_registry_builds_it_from_content_and_counts_and_says_what_is_missing(cold_data: SequenceData) -> None:
    content, counts = _one_hot_content(cold_data), cold_data.item_counts()
    params = {"max_history": 20, "dim": 16, "num_heads": 1, "content_first": True}
    inputs = ModelInputs(content=content, content_encoder="enc", item_counts=counts)
    model = build_model("sasrec", params, cold_data.num_items, inputs)
    assert isinstance(model, SASRec) and model.config.encoder == "enc" and model.config.content_dim == content.shape[1]
    assert model.item_id_table() is None, "the ID residual is not a table training may read row by row"
    with pytest.raises(ConfigError, match="training counts"):
        build_model("sasrec", params, cold_data.num_items, ModelInputs(content=content, content_encoder="enc"))
    with pytest.raises(ConfigError, match="content embeddings"):
        build_model("sasrec", params, cold_data.num_items, ModelInputs(item_counts=counts))


def test_content_first_hstu_places_never_trained_items_by_their_content(cold_data: SequenceData) -> None:
    content, counts = _one_hot_content(cold_data), cold_data.item_counts()
    params = {"max_history": 20, "dim": 32, "num_heads": 1, "dropout": 0.1, "content_first": True}
    model = build_model("hstu", params, cold_data.num_items, ModelInputs(content=content, item_counts=counts))
    assert isinstance(model, HSTU) and model.item_id_table() is None and model.item_emb is None
    torch.manual_seed(0)
    recall = cold_recall(cold_data, SASRecConfig(num_items=cold_data.num_items), None, model)
    assert recall > 0.05, "cold items are reached through their content"
    model.eval()
    cold = int(torch.nonzero(cold_data.cold_mask)[0])
    assert model.content_items is not None
    vector = torch.nn.functional.normalize(model.content_items.of_content(content[cold : cold + 1]), dim=-1)[0]
    torch.testing.assert_close(model.item_embeddings()[cold], vector)
    loaded = HSTU(HSTUConfig(**{**model.config.__dict__}))  # shaped from the saved config alone
    loaded.load_state_dict(model.state_dict())
    histories = torch.tensor([[0, 1, 2, 3]])
    torch.testing.assert_close(loaded.eval().score(histories), model.score(histories))
