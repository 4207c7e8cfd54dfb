"""The models' embedding-bag lookups give the same results and gradients with either kernel."""

from __future__ import annotations

from typing import Literal

import pytest
import torch

from recsys.models.sasrec import SASRec, SASRecConfig

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: Triton's interpreter (conftest.py)
pytestmark = pytest.mark.kernels


def sasrec_with_sid(kernel: Literal["torch", "triton"]) -> SASRec:
    torch.manual_seed(0)
    codes = torch.cat([torch.full((1, 2), -1), torch.randint(0, 3, (12, 2))])
    config = SASRecConfig(
        num_items=12, max_history=6, dim=8, num_heads=1, ffn_dim=16, sid_levels=2, embedding_kernel=kernel
    )
    return SASRec(config, codes).to(DEVICE)


def test_sasrec_semantic_id_lookup_is_the_same_on_torch_and_triton() -> None:
    models = {"torch": sasrec_with_sid("torch"), "triton": sasrec_with_sid("triton")}
    histories = torch.tensor([[0, 0, 3, 5, 5], [1, 2, 3, 4, 12]], device=DEVICE)
    outputs = {}
    for kernel, model in models.items():
        model.eval()
        outputs[kernel] = model(histories)
        outputs[kernel].square().sum().backward()
    torch.testing.assert_close(outputs["triton"], outputs["torch"])
    sid_grads = {kernel: model.sid_emb.weight.grad for kernel, model in models.items()}  # type: ignore[union-attr]
    assert sid_grads["torch"] is not None and sid_grads["torch"].abs().sum() > 0
    torch.testing.assert_close(sid_grads["triton"], sid_grads["torch"])
    padding_rows = models["torch"].sid_emb.level_start  # type: ignore[union-attr]
    assert sid_grads["torch"][padding_rows].abs().sum() == 0, "padding rows must get no gradient"
