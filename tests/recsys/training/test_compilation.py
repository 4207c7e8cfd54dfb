"""`train.compile` with dynamic shapes: SASRec and HSTU, compiled as the trainer compiles them, compile one graph per
path of their forward (packed training rows; left-padded histories, trained on; scoring) across 20 history lengths
and 2 batch sizes, and give eager's outputs and gradients.

Graphs are counted with `backend="aot_eager"`: dynamo decides the graphs and their guards, and so every
recompilation, before a backend sees a graph (aot_eager still runs AOTAutograd, whose tracing of the backward can add
shape guards too); only inductor's lowering could add more. So aot_eager counts what inductor would, in seconds where
inductor spends tens of seconds per graph generating and compiling C++ on 2 CPU cores; one inductor case checks that
it agrees.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

from recsys.data.batching import HistoryBatch
from recsys.data.prepared import load_prepared
from recsys.errors import ConfigError
from recsys.evaluation import EvalConfig
from recsys.models.hstu import HSTU, HSTUConfig
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.modules.transformer import most_recent
from recsys.runtime.distributed import Workers
from recsys.runtime.validation import config_from
from recsys.training import data_parallel, trainer
from recsys.training.compilation import compile_model, compiled_graphs
from recsys.training.config import HardwareConfig, ScheduleConfig, TrainConfig
from recsys.training.data_parallel import DataParallelLoss
from recsys.training.recipes import GenerativeRecipe
from recsys.training.trainer import fit
from tests.conftest import tiny_generative

ITEMS, MAX_HISTORY = 100, 50
LENGTHS = torch.linspace(8, MAX_HISTORY, 20).long().tolist()  # 20 distinct lengths, 8 ... max_history
BATCH_SIZES = (3, 5)  # sizes 0 and 1 are specialised by dynamo whatever the setting (compilation.py)

SMALL: dict[str, Any] = {
    "dim": 16,
    "num_heads": 2,
    "num_layers": 1,
    "dropout": 0.0,
}  # dropout 0: no masks to compare with eager
Model = SASRec | HSTU
MODELS: dict[str, Callable[[], Model]] = {
    "sasrec": lambda: SASRec(SASRecConfig(ITEMS, MAX_HISTORY, ffn_dim=32, attn_dropout=0.0, **SMALL)),
    "hstu": lambda: HSTU(HSTUConfig(ITEMS, MAX_HISTORY, **SMALL)),
    "hstu_time_buckets": lambda: HSTU(HSTUConfig(ITEMS, MAX_HISTORY, num_time_buckets=8, **SMALL)),
}
# Most graphs per path (sizes 0 and 1 aside, which dynamo always specialises)
MOST_GRAPHS = {
    "sasrec": {"packed": 1, "left_padded": 1, "scoring": 1},
    "hstu": {"packed": 1, "left_padded": 1, "scoring": 1},
    "hstu_time_buckets": {"packed": 1, "left_padded": 1, "scoring": 1},
}


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Every test counts its own graphs: no code cache or counts from another."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def inputs(model: Model, rows: int, length: int, packed: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(B, L) item ids and the forward's keyword arguments: packed rows (two runs a row, as the packer fills them)
    or left-padded histories; with the items' and the predictions' times for a model that reads them."""
    generator = torch.Generator().manual_seed(rows * 1_000 + length)
    items = torch.randint(0, ITEMS + 1, (rows, length), generator=generator)
    kwargs = {}
    if packed:
        first = length * 3 // 5
        kwargs["segments"] = (torch.arange(length) >= first).long().add(1).expand(rows, -1).contiguous()
        run_start = torch.where(torch.arange(length) < first, 0, first)
        run_length = torch.where(torch.arange(length) < first, first, length - first)
        positions = MAX_HISTORY - run_length + torch.arange(length) - run_start  # counted back from each run's end
        kwargs["positions"] = positions.expand(rows, -1).contiguous()
    if getattr(model, "reads_timestamps", False):
        times = torch.randint(1, 600, (rows, length + 1), generator=generator).cumsum(dim=1)
        kwargs["timestamps"], kwargs["query_times"] = times[:, :-1].contiguous(), times[:, 1:].contiguous()
    return items, kwargs


def check_step(compiled: Model, eager: Model, items: torch.Tensor, kwargs: dict[str, torch.Tensor]) -> None:
    """Forward and backward through both models: the same outputs and gradients."""
    for model in (compiled, eager):
        model.zero_grad(set_to_none=True)
    out, expected = compiled(items, **kwargs), eager(items, **kwargs)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    (out * out).sum().backward()
    (expected * expected).sum().backward()
    grads, expected_grads = ({name: p.grad for name, p in m.named_parameters()} for m in (compiled, eager))
    torch.testing.assert_close(grads, expected_grads, rtol=1e-4, atol=1e-5)


def graphs_per_path(compiled: Model, eager: Model, lengths: list[int]) -> dict[str, int]:
    """Train on packed rows (max_history wide) and on left-padded histories of `lengths`, then score those in eval
    mode, each at every batch size, checking every step against eager: the graphs each path compiled."""
    graphs = {}
    before = compiled_graphs()
    for rows in BATCH_SIZES:
        check_step(compiled, eager, *inputs(compiled, rows, MAX_HISTORY, packed=True))
    graphs["packed"], before = compiled_graphs() - before, compiled_graphs()
    for rows in BATCH_SIZES:
        for length in lengths:
            check_step(compiled, eager, *inputs(compiled, rows, length, packed=False))
    graphs["left_padded"], before = compiled_graphs() - before, compiled_graphs()
    compiled.eval()
    eager.eval()
    with torch.no_grad():
        for rows in BATCH_SIZES:
            for length in lengths:
                items, kwargs = inputs(compiled, rows, length, packed=False)
                torch.testing.assert_close(compiled(items, **kwargs), eager(items, **kwargs), rtol=1e-4, atol=1e-5)
    graphs["scoring"] = compiled_graphs() - before
    return graphs


def compiled_pair(name: str, backend: str = "aot_eager") -> tuple[Model, Model]:
    torch.manual_seed(0)
    eager = MODELS[name]()
    compiled = copy.deepcopy(eager)
    compile_model(compiled, backend=backend)  # as the trainer does (train.compile)
    return compiled, eager


@pytest.mark.parametrize("name", list(MODELS))
def test_no_recompiles_across_lengths_and_batch_sizes(name: str) -> None:
    compiled, eager = compiled_pair(name)
    graphs = graphs_per_path(compiled, eager, LENGTHS)
    assert all(graphs[path] <= most for path, most in MOST_GRAPHS[name].items()), graphs
    assert not counters["graph_break"], dict(counters["graph_break"])  # else a graph counted is only part of one


def test_a_static_compile_recompiles_at_every_length() -> None:
    """What the check above would catch: without dynamic shapes, every new length compiles a graph."""
    torch.manual_seed(0)
    model = MODELS["sasrec"]()
    model.compile(dynamic=False, backend="aot_eager")
    for length in LENGTHS[:4]:
        items, _ = inputs(model, 3, length, packed=False)
        model(items).sum().backward()
    assert compiled_graphs() == 4


def test_most_recent_keeps_one_graph_where_a_slice_splits_two() -> None:
    """`x[:, -max_len:]` guards L < max_len (its start), so full-width histories (L = max_len) and shorter ones
    compile apart; `most_recent` guards L <= max_len, which both satisfy."""
    sliced = torch.compile(lambda x: x[:, -10:] * 2, dynamic=True, backend="aot_eager")
    cut = torch.compile(lambda x: most_recent(x, 10) * 2, dynamic=True, backend="aot_eager")
    for length in (6, 10):
        torch.testing.assert_close(cut(torch.ones(2, length)), sliced(torch.ones(2, length)))
    assert compiled_graphs() == 3  # 2 for the slice, 1 for most_recent


def test_inductor_agrees_at_three_lengths() -> None:
    compiled, eager = compiled_pair("sasrec", backend="inductor")
    compiled.eval()
    eager.eval()
    with torch.no_grad():
        for length in LENGTHS[::9]:  # 8, 27, 50
            items, _ = inputs(compiled, 3, length, packed=False)
            torch.testing.assert_close(compiled.score(items), eager.score(items), rtol=1e-4, atol=1e-5)
    assert compiled_graphs() == 1


def test_inductor_compiles_in_the_mode_asked_with_the_coalescing_analysis_off() -> None:
    """`compile_model` hands inductor its mode's settings (reduce-overhead: CUDA graphs) with the tiling analysis that
    asserts on dynamic shapes (torch 2.11) off: both read inside inductor's compilation, by a post-grad pass."""
    seen: dict[str, bool] = {}

    class ReadSettings(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            seen.update(cudagraphs=inductor_config.triton.cudagraphs,
                        coalescing=inductor_config.triton.coalesce_tiling_analysis)  # fmt: skip

        def uuid(self) -> None:  # no cache key: the compilation is never served from inductor's cache
            return None

    class Layer(nn.Module):  # dynamo skips torch.nn's own frames: a module of torch.nn alone would not compile
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x))

    assert inductor_config.triton.coalesce_tiling_analysis  # inductor's default, which compile_model overrides
    model = Layer()
    compile_model(model, "reduce-overhead")
    with inductor_config.patch(post_grad_custom_post_pass=ReadSettings()):
        model(torch.ones(3, 4))
    assert seen == {"cudagraphs": True, "coalescing": False}


def test_compile_mode_is_validated() -> None:
    hardware = {"compile": True, "compile_mode": "max-autotune"}
    assert config_from(TrainConfig, {"hardware": hardware}, "train.").hardware.compile_mode == "max-autotune"
    with pytest.raises(ConfigError, match=r"train\.hardware\.compile_mode: Input should be 'default', 'reduce-"):
        config_from(TrainConfig, {"hardware": {"compile_mode": "autotune"}}, "train.")


def test_the_trainer_compiles_with_train_compile_mode(tiny_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[nn.Module, str]] = []
    monkeypatch.setattr(trainer, "compile_model", lambda model, mode: calls.append((model, mode)))
    data = load_prepared(tiny_data_dir)
    model = SASRec(SASRecConfig(data.num_items, max_history=20, dim=16, num_heads=1, num_layers=1, ffn_dim=32))
    config = TrainConfig(
        schedule=ScheduleConfig(epochs=1),
        hardware=HardwareConfig(compile=True, compile_mode="max-autotune-no-cudagraphs"),
        progress=False,
    )
    fit(model, data, config, EvalConfig(ks=(10,)))
    assert calls == [(model, "max-autotune-no-cudagraphs")]


def test_a_model_with_dropout_compiles_its_training_pass_in_one_analysis() -> None:
    """Its floats (dropout rates, epsilons) are constants: traced as symbolic inputs, the first one specialised would
    restart dynamo's analysis, and AOTAutograd would trace the forward and backward twice."""
    torch._dynamo.reset()
    counters.clear()
    model = SASRec(SASRecConfig(ITEMS, MAX_HISTORY, ffn_dim=32, **{**SMALL, "dropout": 0.2})).train()
    compile_model(model, backend="aot_eager")
    histories = torch.randint(1, ITEMS + 1, (3, MAX_HISTORY))
    model(histories).float().sum().backward()
    assert dict(counters["aot_autograd"]) == {"total": 1, "ok": 1}


def test_the_generative_loss_compiles_into_one_graph_with_the_forward() -> None:
    """`GenerativeRecipe.loss_compiles_with_model`: its cross-entropies run in the training step's one graph (no eager
    kernels after the forward), with the loss and gradients of the eager step, across batch sizes and lengths."""
    graphs: list[torch.fx.GraphModule] = []

    def recording(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        graphs.append(gm)
        return gm.forward

    model = tiny_generative(ITEMS).train()
    eager_model = copy.deepcopy(model)
    recipe = GenerativeRecipe(max_history=8, batch_size=5, label_smoothing=0.1)
    compiled = DataParallelLoss(model, recipe, Workers(), find_unused_parameters=False)
    eager = DataParallelLoss(eager_model, recipe, Workers(), find_unused_parameters=False)
    compile_model(model, backend=recording)  # the trainer's order: the forward (validation's), then the loss
    compiled.compile("default", backend=recording)
    generator = torch.Generator().manual_seed(0)
    for rows, length in ((5, 8), (3, 6), (4, 2)):
        batch = HistoryBatch(
            torch.randint(1, ITEMS + 1, (rows, length), generator=generator),
            torch.randint(1, ITEMS + 1, (rows,), generator=generator),
            torch.randint(1, 6, (rows,), generator=generator),
        )
        (loss, summed, n), (want, want_summed, want_n) = compiled(batch, generator), eager(batch, generator)
        torch.testing.assert_close(loss, want)
        torch.testing.assert_close(summed, want_summed)
        assert n == want_n == rows
        loss.backward()
        want.backward()
    for (name, p), q in zip(model.named_parameters(), eager_model.parameters(), strict=True):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert not counters["graph_break"]
    assert len(graphs) == 1, "one graph for every batch size and length, the model's forward inlined in it"
    called = {node.target for node in graphs[0].graph.nodes if node.op == "call_function"}
    assert F.cross_entropy in called


def test_the_trainer_compiles_a_recipe_loss_with_the_model_only_where_the_recipe_says_so(
    tiny_data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str]] = []

    def record(module: nn.Module, mode: str, backend: object = "inductor") -> None:
        calls.append((type(module).__name__, mode))

    monkeypatch.setattr(trainer, "compile_model", record)
    monkeypatch.setattr(data_parallel, "compile_model", record)
    data = load_prepared(tiny_data_dir)
    config = TrainConfig(
        schedule=ScheduleConfig(epochs=1), hardware=HardwareConfig(compile=True, compile_mode="reduce-overhead"),
        progress=False,
    )  # fmt: skip
    fit(tiny_generative(data.num_items, retrieval_candidates=0), data, config, EvalConfig(ks=(10,)))
    assert calls == [("GenerativeRetriever", "reduce-overhead"), ("LossModule", "reduce-overhead")]
    calls.clear()
    fit(SASRec(SASRecConfig(data.num_items, max_history=20, dim=16, num_heads=1, num_layers=1, ffn_dim=32)), data,
        config, EvalConfig(ks=(10,)))  # fmt: skip
    assert calls == [("SASRec", "reduce-overhead")]  # its recipe draws on the host: the loss stays eager
