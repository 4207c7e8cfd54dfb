"""The embedding-bag backends (TORCH, TRITON) against the fp32 reference: forward, gradients, fused updates.

Dimension letters: T tables, B bags per table, D dim, N ids, R rows of the flat weights buffer.
Without CUDA the Triton kernels run in Triton's interpreter (see conftest.py): the shapes stay tiny.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import recsys.ops.embedding_bag as ops
from recsys.ops import dispatch
from recsys.ops.embedding_bag import (
    Kernel,
    KernelUnavailableError,
    OptimizerState,
    OptimType,
    RowwiseOptimizer,
    embedding_bag,
    embedding_bag_backward,
    fused_backward_update,
)
from recsys.ops.reference import embedding_bag as reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.kernels
HAS_TRITON = importlib.util.find_spec("triton") is not None
KERNELS = [
    Kernel.TORCH,
    pytest.param(Kernel.TRITON, marks=pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")),
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Sums run in fp32 everywhere; low-precision results differ from the reference by about one rounding
# (the Triton interpreter truncates fp32 -> bf16 where the GPU rounds to nearest: still one ulp).
TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-4},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
    torch.float16: {"rtol": 2e-3, "atol": 2e-3},
}


@dataclass(frozen=True)
class Case:
    weights: torch.Tensor  # (R, D)
    row_offsets: torch.Tensor  # (T+1,)
    indices: torch.Tensor  # (N,)
    offsets: torch.Tensor  # (T*B+1,)
    per_sample_weights: torch.Tensor | None  # (N,)
    pooling: reference.Pooling
    batch_size: int

    @property
    def num_tables(self) -> int:
        return self.row_offsets.numel() - 1

    def rows(self) -> torch.Tensor:
        """(N,) row of each id in the flat buffer, computed independently of the library."""
        lengths = (self.offsets[1:] - self.offsets[:-1]).tolist()
        tables = [bag // self.batch_size for bag, n in enumerate(lengths) for _ in range(n)]
        return torch.tensor([int(self.row_offsets[t]) for t in tables], dtype=torch.int64) + self.indices.cpu()

    def call(self) -> dict:
        return {
            "indices": self.indices,
            "offsets": self.offsets,
            "row_offsets": self.row_offsets,
            "pooling": self.pooling,
        }


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """T tables of 1..40 rows sharing D, B bags of 0..6 ids, uniform or Zipf-skewed ids (many duplicates)."""
    num_tables = draw(st.integers(1, 3))
    batch_size = draw(st.integers(1, 8))
    dim = draw(st.sampled_from([4, 8, 12, 16, 32]))  # 12: a partial D-block
    dtype = draw(st.sampled_from(DTYPES))
    table_rows = draw(st.lists(st.integers(1, 40), min_size=num_tables, max_size=num_tables))
    lengths = draw(st.lists(st.integers(0, 6), min_size=num_tables * batch_size, max_size=num_tables * batch_size))
    zipf = draw(st.booleans())
    psw_dtype = draw(st.sampled_from([None, torch.float32, dtype]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))

    ids = []
    for t, rows in enumerate(table_rows):
        n = sum(lengths[t * batch_size : (t + 1) * batch_size])
        if zipf:
            probs = 1.0 / torch.arange(1, rows + 1, dtype=torch.float64) ** 1.5
            ids.append(torch.multinomial(probs, n, replacement=True, generator=gen) if n else torch.zeros(0).long())
        else:
            ids.append(torch.randint(0, rows, (n,), generator=gen))
    indices = torch.cat(ids)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    row_offsets = torch.tensor([0, *torch.tensor(table_rows).cumsum(0).tolist()], dtype=torch.int64)
    weights = torch.randn(sum(table_rows), dim, generator=gen).to(dtype)
    psw = None
    if psw_dtype is not None:
        psw = (torch.rand(indices.numel(), generator=gen) * 2 - 0.5).to(psw_dtype)
    return Case(
        weights=weights.to(DEVICE),
        row_offsets=row_offsets.to(DEVICE),
        indices=indices.to(DEVICE),
        offsets=offsets.to(DEVICE),
        per_sample_weights=None if psw is None else psw.to(DEVICE),
        pooling=draw(st.sampled_from(["sum", "mean"])),
        batch_size=batch_size,
    )


def reference_gradients(
    case: Case, grad_output: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(reference output (B, T*D), dense table gradient (R, D), per-sample-weight gradient (N,)), all fp32."""
    weights = case.weights.to(torch.float32, copy=True).requires_grad_()
    psw = None
    if case.per_sample_weights is not None:
        psw = case.per_sample_weights.to(torch.float32, copy=True).requires_grad_()
    out = reference.embedding_bag(weights, per_sample_weights=psw, **case.call())
    out.backward(grad_output.float())
    assert weights.grad is not None
    return out.detach(), weights.grad, None if psw is None else psw.grad


@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=20, deadline=None)
@given(case=cases(), fp32_output=st.booleans(), deterministic=st.booleans(), sparse_grad=st.booleans())
def test_forward_and_gradients_match_reference(
    kernel: Kernel, case: Case, fp32_output: bool, deterministic: bool, sparse_grad: bool
) -> None:
    dtype = case.weights.dtype
    out_dtype = torch.float32 if fp32_output else dtype
    weights = case.weights.clone().requires_grad_()
    psw = None if case.per_sample_weights is None else case.per_sample_weights.clone().requires_grad_()
    out = embedding_bag(
        weights,
        per_sample_weights=psw,
        output_dtype=torch.float32 if fp32_output else None,
        kernel=kernel,
        deterministic=deterministic,
        sparse_grad=sparse_grad,
        **case.call(),
    )
    assert out.shape == (case.batch_size, case.num_tables * weights.shape[1])
    assert out.dtype == out_dtype

    grad_output = torch.randn(out.shape, device=DEVICE).to(out_dtype)
    expected_out, expected_grad, expected_psw_grad = reference_gradients(case, grad_output)
    torch.testing.assert_close(out.float(), expected_out, **TOLERANCE[out_dtype])

    out.backward(grad_output)
    grad = weights.grad
    assert grad is not None and grad.dtype == dtype
    if sparse_grad:
        assert grad.is_sparse
        # Exactly the touched rows, each once: duplicates were summed before the gradient was built.
        assert grad._indices()[0].tolist() == sorted(set(case.rows().tolist()))
        grad = grad.to_dense()
    torch.testing.assert_close(grad.float(), expected_grad, **TOLERANCE[dtype])
    # Before the cast to the table dtype, the summed rows are fp32-accurate whatever the table dtype.
    unique_rows, row_grads = embedding_bag_backward(
        grad_output, case.weights, per_sample_weights=case.per_sample_weights, kernel=kernel, **case.call()
    )
    assert unique_rows.tolist() == sorted(set(case.rows().tolist())) and row_grads.dtype == torch.float32
    torch.testing.assert_close(row_grads, expected_grad[unique_rows], **TOLERANCE[torch.float32])
    if psw is not None:
        assert psw.grad is not None and psw.grad.dtype == psw.dtype
        torch.testing.assert_close(psw.grad.float(), expected_psw_grad, **TOLERANCE[psw.dtype])


def expected_update(
    optimizer: RowwiseOptimizer,
    weights: torch.Tensor,
    state: OptimizerState,
    dense_grad: torch.Tensor,
    touched: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(weights, momentum1, momentum2) after one step of the fp32 reference (`state.step` is that step's number)."""
    if optimizer.optim is OptimType.SGD:
        return reference.sgd_update(weights, dense_grad, optimizer.lr), None, None
    if optimizer.optim is OptimType.EXACT_ROWWISE_ADAGRAD:
        assert state.momentum2 is not None
        new_weights, new_state = reference.rowwise_adagrad_update(
            weights, state.momentum2, dense_grad, optimizer.lr, optimizer.eps
        )
        return new_weights, None, new_state
    assert state.momentum1 is not None and state.momentum2 is not None
    return reference.adam_update(
        weights, state.momentum1, state.momentum2, dense_grad, touched, step=state.step, lr=optimizer.lr,
        beta1=optimizer.beta1, beta2=optimizer.beta2, eps=optimizer.eps,
    )  # fmt: skip


def random_state(optimizer: RowwiseOptimizer, weights: torch.Tensor, step: int) -> OptimizerState:
    """A state as if `step` updates had been made: positive second moments, any first moments."""
    state = optimizer.init_state(weights)
    for name in ("momentum1", "momentum2"):
        tensor = getattr(state, name)
        if tensor is not None:
            tensor.copy_(torch.rand(tensor.shape, device=DEVICE) * (1 if name == "momentum2" else 0.2))
    state.step = step
    return state


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("optim", list(OptimType))
@settings(max_examples=15, deadline=None)
@given(case=cases(), lr=st.sampled_from([0.01, 0.5]), deterministic=st.booleans(), steps_before=st.sampled_from([0, 3]))
def test_fused_update_matches_reference(
    kernel: Kernel, optim: OptimType, case: Case, lr: float, deterministic: bool, steps_before: int
) -> None:
    dtype = case.weights.dtype
    grad_output = torch.randn(case.batch_size, case.num_tables * case.weights.shape[1], device=DEVICE).to(dtype)
    _, dense_grad, expected_psw_grad = reference_gradients(case, grad_output)
    optimizer = RowwiseOptimizer(optim, lr=lr)
    state = random_state(optimizer, case.weights, steps_before)
    before = OptimizerState(
        *(None if t is None else t.clone() for t in (state.momentum1, state.momentum2)), step=steps_before + 1
    )
    touched = torch.zeros(case.weights.shape[0], dtype=torch.bool)
    touched[case.rows()] = True
    touched = touched.to(DEVICE)
    expected_weights, expected_m1, expected_m2 = expected_update(optimizer, case.weights, before, dense_grad, touched)

    weights = case.weights.clone()
    psw_grad = fused_backward_update(
        grad_output,
        weights,
        optimizer=optimizer,
        state=state,
        per_sample_weights=case.per_sample_weights,
        kernel=kernel,
        deterministic=deterministic,
        **case.call(),
    )
    assert state.step == steps_before + 1
    torch.testing.assert_close(weights.float(), expected_weights.float(), **TOLERANCE[dtype])
    assert torch.equal(weights[~touched], case.weights[~touched])
    for got, expected, old in ((state.momentum1, expected_m1, before.momentum1),
                               (state.momentum2, expected_m2, before.momentum2)):  # fmt: skip
        if expected is None:
            assert got is None
            continue
        assert got is not None and old is not None
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        assert torch.equal(got[~touched], old[~touched])  # untouched rows' state stays (lazy)
    if case.per_sample_weights is None:
        assert psw_grad is None
    else:
        assert psw_grad is not None and expected_psw_grad is not None
        torch.testing.assert_close(psw_grad.float(), expected_psw_grad, **TOLERANCE[case.per_sample_weights.dtype])


@pytest.mark.parametrize("kernel", KERNELS)
def test_rows_crossing_chunks_are_summed_whole_and_deterministically(kernel: Kernel) -> None:
    """Hot rows with many more ids than a chunk (the interpreter's chunks hold 4) and runs crossing chunk edges:
    row gradients and fused Adam equal the reference; deterministic mode repeats bit for bit."""
    gen = torch.Generator().manual_seed(3)
    hot = [torch.zeros(37, dtype=torch.int64), torch.full((9,), 5)]
    ids = torch.cat([*hot, torch.randint(0, 12, (30,), generator=gen)])
    ids = ids[torch.randperm(ids.numel(), generator=gen)].to(DEVICE)
    offsets = torch.arange(0, ids.numel() + 1, 4, device=DEVICE)  # 19 bags of 4 ids
    weights = torch.randn(12, 8, generator=gen).to(DEVICE)
    grad_output = torch.randn(offsets.numel() - 1, 8, generator=gen).to(DEVICE)
    reference_weights = weights.clone().requires_grad_()
    reference.embedding_bag(reference_weights, ids, offsets).backward(grad_output)
    assert reference_weights.grad is not None
    expected = reference_weights.grad

    runs = [embedding_bag_backward(grad_output, weights, ids, offsets, kernel=kernel, deterministic=True)
            for _ in range(2)]  # fmt: skip
    unique_rows, grads = runs[0]
    assert unique_rows.tolist() == sorted(set(ids.tolist()))
    torch.testing.assert_close(grads, expected[unique_rows], rtol=1e-5, atol=1e-5)
    assert torch.equal(runs[1][1], grads)
    fast = embedding_bag_backward(grad_output, weights, ids, offsets, kernel=kernel)[1]
    torch.testing.assert_close(fast, grads, rtol=1e-5, atol=1e-5)

    optimizer = RowwiseOptimizer(OptimType.ADAM, lr=0.1)
    touched = torch.zeros(12, dtype=torch.bool, device=DEVICE)
    touched[unique_rows] = True
    state = optimizer.init_state(weights)
    updated = weights.clone()
    fused_backward_update(grad_output, updated, ids, offsets, optimizer=optimizer, state=state, kernel=kernel)
    expected_weights, _, _ = reference.adam_update(
        weights, torch.zeros(12, 8, device=DEVICE), torch.zeros(12, 8, device=DEVICE), expected, touched, step=1,
        lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8,
    )  # fmt: skip
    torch.testing.assert_close(updated, expected_weights, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_stochastic_rounding_is_unbiased(kernel: Kernel) -> None:
    """bf16 rows updated by a step smaller than half a bf16 ulp: round-to-nearest loses it every time, stochastic
    rounding keeps it on average, and every result is one of the two bf16 neighbours."""
    rows, dim = 64, 32
    weights = torch.ones(rows, dim, dtype=torch.bfloat16, device=DEVICE)  # bf16 ulp at 1.0: 2**-7
    ids = torch.arange(rows, device=DEVICE)
    offsets = torch.arange(rows + 1, device=DEVICE)
    grad_output = torch.full((rows, dim), 2.0**-10, device=DEVICE)  # with lr 1: a step of 1/8 ulp
    if not (kernel is Kernel.TRITON and DEVICE.type == "cpu"):  # Triton's interpreter truncates, GPUs round
        nearest = weights.clone()
        fused_backward_update(grad_output, nearest, ids, offsets, optimizer=RowwiseOptimizer(lr=1.0), kernel=kernel)
        assert torch.equal(nearest, weights)

    optimizer = RowwiseOptimizer(lr=1.0, stochastic_rounding=True)
    state = optimizer.init_state(weights, seed=7)
    rounded = weights.clone()
    fused_backward_update(grad_output, rounded, ids, offsets, optimizer=optimizer, state=state, kernel=kernel)
    down = 1.0 - 2.0**-8  # the bf16 neighbour below 1 - 2**-10 (ulp 2**-8 below 1)
    values = rounded.float()
    assert bool(((values == 1.0) | (values == down)).all())
    # P(down) = (2**-10) / (2**-8) = 1/4 for each of the 2,048 values: 512 expected, sd ~20
    assert 400 < int((values == down).sum()) < 624
    again = weights.clone()
    fused_backward_update(grad_output, again, ids, offsets, optimizer=optimizer,
                          state=optimizer.init_state(weights, seed=7), kernel=kernel)  # fmt: skip
    assert torch.equal(again, rounded)  # the same seed and step: the same draws


def test_state_must_fit_the_optimizer() -> None:
    weights = torch.randn(6, 4)
    ids, offsets, grad = torch.tensor([1, 2]), torch.tensor([0, 2]), torch.ones(1, 4)
    adam = RowwiseOptimizer(OptimType.ADAM)
    with pytest.raises(ValueError, match="ADAM needs state"):
        fused_backward_update(grad, weights, ids, offsets, optimizer=adam, kernel=Kernel.TORCH)
    wrong = RowwiseOptimizer(OptimType.ROWWISE_ADAM).init_state(weights)
    with pytest.raises(ValueError, match=r"state.momentum2 of ADAM must be .* shape \(6, 4\)"):
        fused_backward_update(grad, weights, ids, offsets, optimizer=adam, state=wrong, kernel=Kernel.TORCH)
    with pytest.raises(ValueError, match="stochastic_rounding rounds updated rows to bf16"):
        fused_backward_update(grad, weights, ids, offsets, optimizer=RowwiseOptimizer(stochastic_rounding=True),
                              kernel=Kernel.TORCH)  # fmt: skip


def test_reference_adam_is_torch_adam_then_lazy() -> None:
    """One step from zero state: torch.optim.Adam's (untouched rows have zero moments, so they stay); later steps
    leave untouched rows and their moments alone (SparseAdam's semantics, eps negligible here)."""
    gen = torch.Generator().manual_seed(0)
    weights = torch.randn(5, 3, generator=gen)
    grads = [torch.randn(5, 3, generator=gen) * torch.tensor([1.0, 1, 0, 1, 0])[:, None] for _ in range(3)]
    grads[1][0] = 0.0  # row 0 untouched at the second step
    m, v = torch.zeros(5, 3), torch.zeros(5, 3)
    ours = weights
    for step, grad in enumerate(grads, start=1):
        ours, m, v = reference.adam_update(ours, m, v, grad, grad.abs().sum(1) > 0, step=step, lr=0.1, beta1=0.9,
                                           beta2=0.999, eps=1e-12)  # fmt: skip
        if step == 1:
            dense = torch.nn.Parameter(weights.clone())
            adam = torch.optim.Adam([dense], lr=0.1, eps=1e-12)
            dense.grad = grad.clone()
            adam.step()
            torch.testing.assert_close(ours, dense.detach())
    sparse = torch.nn.Parameter(weights.clone())
    sparse_adam = torch.optim.SparseAdam([sparse], lr=0.1, eps=1e-12)
    for grad in grads:
        sparse.grad = grad.to_sparse()
        sparse_adam.step()
    torch.testing.assert_close(ours, sparse.detach())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fbgemm_gpu's own import-time notices
@pytest.mark.parametrize("kernel", KERNELS)
def test_layout_matches_torchrec_keyed_tensor(kernel: Kernel) -> None:
    pytest.importorskip("torchrec")  # installed everywhere `make setup` ran; absent on a bare GPU image
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=4, num_embeddings=rows, feature_names=[f"f{i}"])
        for i, rows in enumerate([5, 3])
    ]
    ebc = EmbeddingBagCollection(tables=tables)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1"], values=torch.tensor([1, 4, 4, 0, 2, 2, 1]), lengths=torch.tensor([2, 0, 1, 1, 3, 0])
    )
    expected = ebc(kjt).values()  # (B=3, T*D=8)
    weights = torch.cat([ebc.embedding_bags[f"t{i}"].weight.detach() for i in range(2)])
    out = embedding_bag(
        weights.to(DEVICE), kjt.values().to(DEVICE), kjt.offsets().to(DEVICE), torch.tensor([0, 5, 8]).to(DEVICE),
        kernel=kernel,
    )  # fmt: skip
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_empty_bags_and_batches_pool_to_zeros(kernel: Kernel, pooling: reference.Pooling) -> None:
    weights = torch.randn(6, 8, device=DEVICE).requires_grad_()
    no_ids = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    row_offsets = torch.tensor([0, 4, 6], device=DEVICE)

    out = embedding_bag(weights, no_ids, torch.zeros(7, dtype=torch.int64, device=DEVICE), row_offsets,
                        pooling=pooling, kernel=kernel)  # fmt: skip
    assert out.shape == (3, 16) and not out.any()
    out.sum().backward()
    assert weights.grad is not None and weights.grad._nnz() == 0

    empty_batch = embedding_bag(weights, no_ids, torch.zeros(1, dtype=torch.int64, device=DEVICE), row_offsets,
                                pooling=pooling, kernel=kernel)  # fmt: skip
    assert empty_batch.shape == (0, 16)

    before = weights.detach().clone()
    fused_backward_update(
        torch.ones(3, 16, device=DEVICE), weights.detach(), no_ids, torch.zeros(7, dtype=torch.int64, device=DEVICE),
        row_offsets, optimizer=RowwiseOptimizer(lr=1.0), pooling=pooling, kernel=kernel,
    )  # fmt: skip
    assert torch.equal(weights.detach(), before)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fbgemm_gpu's own import-time notices
@pytest.mark.parametrize("optim", [OptimType.SGD, OptimType.EXACT_ROWWISE_ADAGRAD])  # fbgemm's CPU TBE fuses these
@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_reference_semantics_are_fbgemm_tbe(optim: OptimType, pooling: reference.Pooling, weighted: bool) -> None:
    """Forward, per-sample-weight gradients and the exact optimizers of the reference are those of FBGEMM's CPU TBE."""
    pytest.importorskip("fbgemm_gpu")
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    gen = torch.Generator().manual_seed(0)
    rows, dim, lr, eps = [5, 7], 8, 0.1, 1e-8
    row_offsets = torch.tensor([0, 5, 12])
    indices = torch.tensor([0, 0, 4, 1, 6, 6, 2, 6])  # duplicates inside and across bags
    offsets = torch.tensor([0, 3, 4, 7, 8])  # T=2, B=2
    fbgemm_optim = {
        OptimType.SGD: EmbOptimType.EXACT_SGD,
        OptimType.EXACT_ROWWISE_ADAGRAD: EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    }[optim]
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(r, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for r in rows],
        optimizer=fbgemm_optim,
        learning_rate=lr,
        eps=eps,
        pooling_mode={"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN}[pooling],
    )
    initial = torch.randn(sum(rows), dim, generator=gen)
    for table, w in zip(tbe.split_embedding_weights(), initial.split(rows), strict=True):
        table.data.copy_(w)
    psw = (torch.rand(indices.numel(), generator=gen) + 0.5).requires_grad_() if weighted else None
    out = tbe(indices, offsets, per_sample_weights=psw)
    grad_output = torch.randn(out.shape, generator=gen)
    out.backward(grad_output)  # updates the tables in place

    weights = initial.clone().requires_grad_()
    ref_psw = None if psw is None else psw.detach().clone().requires_grad_()
    expected_out = reference.embedding_bag(
        weights, indices, offsets, row_offsets, pooling=pooling, per_sample_weights=ref_psw
    )
    torch.testing.assert_close(expected_out, out.detach())
    expected_out.backward(grad_output)
    assert weights.grad is not None
    if weighted and pooling == "mean":
        # FBGEMM's CPU TBE divides by len in this forward but not in its backward (table and per-sample-weight
        # gradients are those of weighted "sum"); ours are the derivative of the forward (autograd of the reference).
        return
    if psw is not None and ref_psw is not None:
        torch.testing.assert_close(ref_psw.grad, psw.grad)
    if optim is OptimType.SGD:
        expected = reference.sgd_update(initial, weights.grad, lr)
    else:
        expected, state = reference.rowwise_adagrad_update(initial, torch.zeros(sum(rows)), weights.grad, lr, eps)
        torch.testing.assert_close(state, torch.cat([s[0] for s in tbe.split_optimizer_states()]))
    torch.testing.assert_close(expected, torch.cat([w.detach() for w in tbe.split_embedding_weights()]))


def test_auto_choice_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    dispatch.log_choice.cache_clear()
    weights = torch.randn(4, 2)
    with caplog.at_level(logging.INFO, logger="recsys.ops.embedding_bag"):
        for _ in range(3):
            embedding_bag(weights, torch.tensor([1, 2]), torch.tensor([0, 2]))
    messages = [r.getMessage() for r in caplog.records if r.name == "recsys.ops.embedding_bag"]
    assert messages == ["embedding_bag: TORCH kernel on cpu (chosen by availability)"]


def test_unavailable_kernels_raise_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    real_find_spec = importlib.util.find_spec
    with monkeypatch.context() as patched:
        patched.setattr(
            importlib.util, "find_spec", lambda name: None if name == "fbgemm_gpu" else real_find_spec(name)
        )
        with pytest.raises(KernelUnavailableError, match="needs fbgemm_gpu"):
            ops.select_kernel(Kernel.FBGEMM, cpu)
    if HAS_TRITON:
        from recsys.ops.triton import embedding_bag as triton_backend

        monkeypatch.setattr(triton_backend, "INTERPRETED", False)
        with pytest.raises(KernelUnavailableError, match="TRITON_INTERPRET=1"):
            ops.select_kernel(Kernel.TRITON, cpu)
    monkeypatch.setattr(dispatch, "triton_available", lambda: False)
    with pytest.raises(KernelUnavailableError, match="pip install triton"):
        ops.select_kernel(Kernel.TRITON, cpu)
    assert ops.select_kernel(None, cpu) is Kernel.TORCH


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"offsets": torch.tensor([0, 1, 2, 3])}, "T\\*B\\+1 values for T=2"),
        ({"indices": torch.tensor([0, 3, 1], dtype=torch.int32)}, "indices must be a 1-d int64"),
        ({"indices": torch.tensor([0, 3, 2])}, "indices\\[2\\]=2 is outside table 1"),
        ({"offsets": torch.tensor([0, 2, 1, 2, 3])}, "offsets must rise from 0 to len\\(indices\\)=3"),
        ({"per_sample_weights": torch.ones(2)}, "per_sample_weights must be"),
        ({"pooling": "max"}, "pooling must be"),
    ],
)
def test_bad_inputs_are_named(kwargs: dict, message: str) -> None:
    call = {
        "weights": torch.randn(6, 4),
        "indices": torch.tensor([0, 3, 1]),
        "offsets": torch.tensor([0, 1, 2, 2, 3]),  # T=2, B=2
        "row_offsets": torch.tensor([0, 4, 6]),
        "kernel": Kernel.TORCH,
    }
    with pytest.raises(ValueError, match=message):
        embedding_bag(**{**call, **kwargs})


@pytest.mark.parametrize("dim", [128, 160, 512])  # one D-block, a partial second block, four blocks
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_at_real_sizes_on_cuda(dim: int, dtype: torch.dtype) -> None:
    """Production-sized batches (B=4,096 bags of 20 ids over 2 x 200,000 rows, Zipf hot rows hit by thousands
    of ids): forward, sparse gradient (fast and deterministic) and every fused optimizer against the fp32
    reference."""
    if DEVICE.type != "cuda" or not HAS_TRITON:
        pytest.skip("real sizes need a CUDA GPU with triton (the interpreter would take hours)")
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    num_tables, rows, batch, pool = 2, 200_000, 4_096, 20
    ranks = torch.multinomial(
        torch.arange(1, rows + 1, device=DEVICE, dtype=torch.float32).pow(-1.15), num_tables * batch * pool,
        replacement=True, generator=gen,
    )  # fmt: skip
    case = Case(
        weights=torch.randn(num_tables * rows, dim, device=DEVICE, generator=gen).to(dtype),
        row_offsets=torch.tensor([0, rows, 2 * rows], device=DEVICE),
        indices=ranks,
        offsets=torch.arange(num_tables * batch + 1, device=DEVICE) * pool,
        per_sample_weights=None,
        pooling="sum",
        batch_size=batch,
    )
    grad_output = torch.randn(batch, num_tables * dim, device=DEVICE, generator=gen).to(dtype)
    expected_out, expected_grad, _ = reference_gradients(case, grad_output)

    out = embedding_bag(case.weights, kernel=Kernel.TRITON, **case.call())
    torch.testing.assert_close(out.float(), expected_out, **TOLERANCE[dtype])
    unique_rows, row_grads = embedding_bag_backward(grad_output, case.weights, kernel=Kernel.TRITON, **case.call())
    assert torch.equal(unique_rows.cpu(), torch.unique(case.rows()))
    # Hot rows sum ~25,000 fp32 terms of size ~1 in another order than the reference: ~1e-3 apart.
    torch.testing.assert_close(row_grads, expected_grad[unique_rows], rtol=1e-4, atol=1e-2)

    deterministic = embedding_bag_backward(
        grad_output, case.weights, kernel=Kernel.TRITON, deterministic=True, **case.call()
    )[1]
    torch.testing.assert_close(deterministic, row_grads, rtol=1e-4, atol=1e-2)

    touched = torch.zeros(case.weights.shape[0], dtype=torch.bool, device=DEVICE)
    touched[unique_rows] = True
    for optim in OptimType:
        optimizer = RowwiseOptimizer(optim, lr=0.05)
        state = random_state(optimizer, case.weights, step=2)
        before = OptimizerState(*(None if t is None else t.clone() for t in (state.momentum1, state.momentum2)), step=3)
        expected_weights, expected_m1, expected_m2 = expected_update(
            optimizer, case.weights, before, expected_grad, touched
        )
        weights = case.weights.clone()
        fused_backward_update(grad_output, weights, optimizer=optimizer, state=state, kernel=Kernel.TRITON,
                              **case.call())  # fmt: skip
        # the hot rows' gradients are ~1e-2 apart (above): first moments (0.1 g) and SGD's step (0.05 g) ~1e-3
        for got, expected in ((state.momentum1, expected_m1), (state.momentum2, expected_m2)):
            if expected is not None:
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)
        tolerance = TOLERANCE[dtype] if dtype != torch.float32 else {"rtol": 1e-5, "atol": 1e-3}
        torch.testing.assert_close(weights.float(), expected_weights.float(), **tolerance)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fbgemm_gpu's own import-time notices
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_fbgemm_backend_matches_reference(dtype: torch.dtype, pooling: reference.Pooling, weighted: bool) -> None:
    """Kernel.FBGEMM (fbgemm's dense TBE op): forward and dense table gradient equal the fp32 reference."""
    pytest.importorskip("fbgemm_gpu")
    if not importlib.import_module("recsys.ops.fbgemm.embedding_bag").runs_on(DEVICE.type):
        pytest.skip(f"the installed fbgemm_gpu has no {DEVICE.type} kernel (its CPU build on a GPU machine)")
    gen = torch.Generator().manual_seed(0)
    case = Case(
        weights=torch.randn(12, 8, generator=gen).to(dtype).to(DEVICE),
        row_offsets=torch.tensor([0, 5, 12], device=DEVICE),
        indices=torch.tensor([0, 0, 4, 1, 6, 6, 2, 6], device=DEVICE),  # duplicates inside and across bags
        offsets=torch.tensor([0, 3, 3, 4, 8], device=DEVICE),  # T=2, B=2, one empty bag
        per_sample_weights=(torch.rand(8, generator=gen) + 0.5).to(DEVICE) if weighted else None,
        pooling=pooling,
        batch_size=2,
    )
    trainable = not (weighted and pooling == "mean")  # FBGEMM's weighted-mean backward is refused (next test)
    weights = case.weights.clone().requires_grad_(trainable)
    out = embedding_bag(
        weights, per_sample_weights=case.per_sample_weights, kernel=Kernel.FBGEMM, sparse_grad=False, **case.call()
    )
    grad_output = torch.randn(out.shape, generator=gen).to(DEVICE).to(dtype)
    expected_out, expected_grad, _ = reference_gradients(case, grad_output)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected_out, **TOLERANCE[dtype])
    if not trainable:
        return
    out.backward(grad_output)
    assert weights.grad is not None and not weights.grad.is_sparse
    torch.testing.assert_close(weights.grad.float(), expected_grad, **TOLERANCE[dtype])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fbgemm_backend_refuses_what_it_cannot_do() -> None:
    pytest.importorskip("fbgemm_gpu")
    weights = torch.randn(6, 4, requires_grad=True)
    ids, offsets = torch.tensor([1, 2, 5]), torch.tensor([0, 2, 3])
    with pytest.raises(KernelUnavailableError, match="pass sparse_grad=False"):
        embedding_bag(weights, ids, offsets, kernel=Kernel.FBGEMM)
    with pytest.raises(KernelUnavailableError, match="detach them"):
        embedding_bag(weights.detach(), ids, offsets, per_sample_weights=torch.ones(3, requires_grad=True),
                      kernel=Kernel.FBGEMM)  # fmt: skip
    with pytest.raises(KernelUnavailableError, match="backward of a weighted mean"):
        embedding_bag(weights, ids, offsets, per_sample_weights=torch.ones(3), pooling="mean", kernel=Kernel.FBGEMM,
                      sparse_grad=False)  # fmt: skip
    with pytest.raises(KernelUnavailableError, match="drop deterministic=True"):
        embedding_bag(weights, ids, offsets, kernel=Kernel.FBGEMM, sparse_grad=False, deterministic=True)
    with pytest.raises(KernelUnavailableError, match="no bf16 tables"):
        embedding_bag(weights.detach().bfloat16(), ids, offsets, kernel=Kernel.FBGEMM)
    with pytest.raises(KernelUnavailableError, match="SplitTableBatchedEmbeddingBagsCodegen"):
        fused_backward_update(torch.ones(2, 4), weights.detach(), ids, offsets, optimizer=RowwiseOptimizer(),
                              kernel=Kernel.FBGEMM)  # fmt: skip
    with pytest.raises(KernelUnavailableError, match=r"Kernel\.FBGEMM has no embedding_bag_backward"):
        embedding_bag_backward(torch.ones(2, 4), weights.detach(), ids, offsets, kernel=Kernel.FBGEMM)
