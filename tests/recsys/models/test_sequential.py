"""SASRec and HSTU: causal, padding-invariant, packed rows equal separate histories."""

from __future__ import annotations

import pytest
import torch

from recsys.models.hstu import HSTU, HSTUConfig
from recsys.models.sasrec import SASRec, SASRecConfig


@pytest.fixture(params=["sasrec", "hstu"])
def model(request: pytest.FixtureRequest) -> SASRec | HSTU:
    """Both packed-row sequential retrievers share these layout properties."""
    torch.manual_seed(0)
    if request.param == "sasrec":
        return SASRec(SASRecConfig(num_items=20, max_history=6, dim=16, num_heads=2, ffn_dim=32)).eval()
    hstu = HSTU(HSTUConfig(num_items=20, max_history=6, dim=16, num_heads=2)).eval()
    with torch.no_grad():
        for layer in hstu.layers:
            layer.position_bias.normal_()  # zero at initialisation: make the relative bias matter here
    return hstu


def test_outputs_are_causal(model: SASRec | HSTU) -> None:
    a = model(torch.tensor([[0, 3, 4, 5, 6, 7]]))
    b = model(torch.tensor([[0, 3, 4, 5, 9, 1]]))  # only the last two items differ
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_extra_left_padding_does_not_change_the_user_vector(model: SASRec | HSTU) -> None:
    short = model.encode_queries(torch.tensor([[3, 4, 5]]))
    padded = model.encode_queries(torch.tensor([[0, 0, 0, 3, 4, 5]]))
    torch.testing.assert_close(short, padded)


def test_histories_longer_than_max_history_keep_the_most_recent_items(model: SASRec | HSTU) -> None:
    long = model.score(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]]))
    recent = model.score(torch.tensor([[3, 4, 5, 6, 7, 8]]))
    torch.testing.assert_close(long, recent)
    assert long.shape == (1, 21)


def test_packed_rows_match_separate_left_padded_histories(model: SASRec | HSTU) -> None:
    packed = model(
        torch.tensor([[3, 4, 5, 7, 8, 0]]),
        segments=torch.tensor([[1, 1, 1, 2, 2, 0]]),
        positions=torch.tensor([[3, 4, 5, 4, 5, 0]]),
    )
    torch.testing.assert_close(packed[0, 2], model.encode_queries(torch.tensor([[3, 4, 5]]))[0])
    torch.testing.assert_close(packed[0, 4], model.encode_queries(torch.tensor([[7, 8]]))[0])
    torch.testing.assert_close(packed[0, 3], model(torch.tensor([[7, 8]]))[0, 0])
