"""HSTU's two attention paths (attention_kernel torch: dense masked rows; triton: jagged runs through the kernel)
give the same outputs and parameter gradients; the config key is validated and optional in saved models.

Dimension letters: B rows, L row width, D dim. Without CUDA the kernel runs in Triton's interpreter (conftest.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from recsys.errors import ConfigError
from recsys.models.hstu import HSTU, HSTUConfig
from recsys.models.registry import build_model, load_model, save_model
from recsys.runtime.checkpoint import load_checkpoint, save_checkpoint
from tests.conftest import compiled_recording_graphs

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = [
    pytest.mark.kernels,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
]

# Packed rows (B=2, L=8): two and three runs per row, positions counted back from each run's end, padding at the end.
PACKED = {
    "item_ids": [[3, 4, 5, 7, 8, 0, 0, 0], [9, 2, 6, 6, 1, 11, 12, 10]],
    "segments": [[1, 1, 1, 2, 2, 0, 0, 0], [1, 1, 2, 2, 2, 3, 3, 3]],
    "positions": [[5, 6, 7, 6, 7, 0, 0, 0], [6, 7, 5, 6, 7, 5, 6, 7]],
}
# Left-padded histories (one per row): a single item, a partial row, a full one.
LEFT_PADDED = [[0, 0, 0, 0, 0, 0, 0, 5], [0, 0, 0, 2, 7, 7, 1, 3], [4, 9, 10, 11, 2, 5, 6, 8]]


def hstu(kernel: Literal["torch", "triton"], time_buckets: int) -> HSTU:
    torch.manual_seed(0)
    config = HSTUConfig(
        num_items=12, max_history=8, dim=16, num_heads=2, dropout=0.0, num_time_buckets=time_buckets,
        attention_kernel=kernel,
    )  # fmt: skip
    model = HSTU(config).to(DEVICE)
    with torch.no_grad():  # zero at initialisation: make the biases matter here
        for layer in model.layers:
            layer.position_bias.normal_()
            if layer.time_bias is not None:
                layer.time_bias.normal_()
    return model


def inputs(layout: str, time_buckets: int) -> dict[str, Any]:
    """The forward's keyword arguments for one layout, with random times when the model reads them."""
    if layout == "packed":
        args = {key: torch.tensor(value, device=DEVICE) for key, value in PACKED.items()}
    else:
        args = {"item_ids": torch.tensor(LEFT_PADDED, device=DEVICE)}
    if time_buckets:
        gen = torch.Generator().manual_seed(1)
        shape = args["item_ids"].shape
        timestamps = torch.randint(0, 10**9, shape, generator=gen).sort(dim=1).values
        args["timestamps"] = timestamps.to(DEVICE)
        args["query_times"] = (timestamps + torch.randint(0, 10**6, shape, generator=gen)).to(DEVICE)
    return args


def outputs_and_grads(model: HSTU, args: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(outputs at the real tokens (T, D), every parameter's gradient) of a loss reading the real tokens only.

    The loss weighs the outputs with fixed random vectors: their squared norms alone would be constant (the outputs
    are normalised), leaving gradients of rounding noise."""
    out = model(**args)
    real = out[args.get("segments", args["item_ids"]) != 0]  # (T, D)
    weights = torch.randn(real.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    (real * weights).sum().backward()
    return real.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("time_buckets", [0, 24])
@pytest.mark.parametrize("layout", ["packed", "left_padded"])
def test_triton_attention_gives_the_torch_outputs_and_gradients(layout: str, time_buckets: int) -> None:
    args = inputs(layout, time_buckets)
    expected, expected_grads = outputs_and_grads(hstu("torch", time_buckets), args)
    actual, actual_grads = outputs_and_grads(hstu("triton", time_buckets), args)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-4)  # outputs are cosines / 0.05
    assert actual_grads.keys() == expected_grads.keys()
    assert "layers.0.position_bias" in expected_grads and (time_buckets == 0 or "layers.1.time_bias" in actual_grads)
    for name, grad in expected_grads.items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(actual_grads[name], grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_triton_path_compiles_without_graph_breaks() -> None:
    model = hstu("triton", 24)
    args = inputs("packed", 24)
    compiled, graphs = compiled_recording_graphs(model)
    torch.testing.assert_close(compiled(**args), model(**args))  # padding tokens too: the same path
    # one call per layer, its backward beside it
    assert len(graphs) == 1 and graphs[0].count("recsys.hstu_attention_triton.default") == 2
    assert graphs[0].count("recsys.hstu_attention_triton_backward.default") == 2


def test_unknown_attention_kernel_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"model\.params\.attention_kernel: Input should be 'auto', 'torch' or"):
        build_model("hstu", {"attention_kernel": "cuda"}, num_items=3)


def test_a_saved_model_without_the_key_loads_with_auto(tmp_path: Path) -> None:
    """Models saved before `attention_kernel` existed hold no such key in their config."""
    path = tmp_path / "model.pt"
    save_model(path, build_model("hstu", {"max_history": 5, "dim": 8, "num_heads": 2}, num_items=12))
    payload = load_checkpoint(path)
    del payload["config"]["attention_kernel"]
    save_checkpoint(path, payload)
    _, loaded = load_model(path)
    assert isinstance(loaded, HSTU) and loaded.config.attention_kernel == "auto"
