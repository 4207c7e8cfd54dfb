"""HSTU attention's backends (TORCH, TRITON) against the fp32 reference, forward and gradients; the time buckets'
exactness; the custom op under torch.compile; errors for bad inputs.

Dimension letters: S sequences, N tokens, H heads, E head dim, L the position-bias width, K time buckets.
Without CUDA the Triton kernels run in Triton's interpreter (see conftest.py, blocks of 16): the shapes stay
small, but sequences of up to 40 tokens still cover several blocks, the diagonal and partial blocks.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

import recsys.ops.hstu_attention as ops
from recsys.ops import dispatch
from recsys.ops.hstu_attention import Kernel, KernelUnavailableError, hstu_attention, time_buckets
from recsys.ops.reference import hstu_attention as reference
from tests.conftest import compiled_recording_graphs

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.kernels
HAS_TRITON = importlib.util.find_spec("triton") is not None
if HAS_TRITON:
    import triton
    from triton.runtime.errors import OutOfResources

    from recsys.ops.triton.hstu_attention import AUTOTUNE_TILES, TMA_TILES, config_tile
else:
    AUTOTUNE_TILES = TMA_TILES = ()
TRITON = pytest.param(Kernel.TRITON, marks=pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed"))
KERNELS = [Kernel.TORCH, TRITON]
RTOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def assert_close_scaled(actual: torch.Tensor | None, expected: torch.Tensor, rtol: float) -> None:
    """Elementwise within rtol, plus rtol of the largest expected value (sums of many terms cancel)."""
    actual = torch.zeros_like(expected) if actual is None else actual  # no gradient = a zero gradient
    atol = rtol * max(float(expected.abs().max()), 1.0) if expected.numel() else 0.0
    torch.testing.assert_close(actual.float(), expected.float(), rtol=rtol, atol=atol)


@dataclass(frozen=True)
class Case:
    qkvu: torch.Tensor  # (N, 4*H*E): q, k, v are strided chunks of it, as the model's linear output gives them
    offsets: torch.Tensor  # (S+1,) int64; tokens past offsets[-1] belong to no sequence
    heads: int  # H
    max_len: int  # L
    position_bias: torch.Tensor  # (H, L) fp32
    time_bias: torch.Tensor | None = None  # (H, K) fp32
    timestamps: torch.Tensor | None = None  # (N,) int64
    query_times: torch.Tensor | None = None  # (N,) int64

    def qkv(self, qkvu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shape = (qkvu.shape[0], self.heads, qkvu.shape[1] // (4 * self.heads))  # (N, H, E)
        _, v, q, k = qkvu.chunk(4, dim=-1)
        return q.view(shape), k.view(shape), v.view(shape)

    def kwargs(self, position_bias: torch.Tensor, time_bias: torch.Tensor | None) -> dict[str, Any]:
        return {
            "max_len": self.max_len, "position_bias": position_bias, "time_bias": time_bias,
            "timestamps": self.timestamps, "query_times": self.query_times,
        }  # fmt: skip


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """S = 1..4 sequences of 0..40 tokens (+0..2 trailing), H 1..2, E 8/16, fp32/bf16, L below or above the
    lengths (distances past L - 1 share its column), time buckets or not (gaps up to ~2**33 s, some negative)."""
    lengths = draw(st.lists(st.integers(0, 40), min_size=1, max_size=4))
    trailing = draw(st.integers(0, 2))
    heads, head_dim = draw(st.integers(1, 2)), draw(st.sampled_from([8, 16]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    max_len = draw(st.integers(1, 45))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    n = sum(lengths) + trailing
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    case = Case(
        (torch.randn(n, 4 * heads * head_dim, generator=gen) * 0.5).to(dtype).to(DEVICE),
        offsets.to(DEVICE), heads, max_len, torch.randn(heads, max_len, generator=gen).to(DEVICE),
    )  # fmt: skip
    if not draw(st.booleans()):
        return case
    num_buckets = draw(st.integers(1, 36))
    timestamps = torch.randint(0, 2**40, (n,), generator=gen)
    gaps = (2.0 ** (torch.rand(n, generator=gen) * 34)).long() - torch.randint(0, 3, (n,), generator=gen)
    return replace(
        case, time_bias=torch.randn(heads, num_buckets, generator=gen).to(DEVICE),
        timestamps=timestamps.to(DEVICE), query_times=(timestamps + gaps).to(DEVICE),
    )  # fmt: skip


def grads(out: torch.Tensor, wrt: list[torch.Tensor], grad_out: torch.Tensor) -> list[torch.Tensor | None]:
    """d out / d wrt for `grad_out`; None where nothing flows (an output of no sequence has no graph)."""
    if not out.requires_grad:
        return [None] * len(wrt)
    return list(torch.autograd.grad(out, wrt, grad_out, allow_unused=True))


def forward_and_grads(case: Case, kernel: Kernel | None, max_seq_len: int | None = 40) -> list[torch.Tensor | None]:
    """[output, d qkvu, d position_bias, d time_bias] for a fixed output gradient; kernel None = the reference.
    `max_seq_len` bounds the lengths (40 = the most `cases` draws; None = read from offsets)."""
    leaves = [t.clone().requires_grad_() for t in (case.qkvu, case.position_bias)]
    time_bias = None if case.time_bias is None else case.time_bias.clone().requires_grad_()
    q, k, v = case.qkv(leaves[0])
    kwargs = case.kwargs(leaves[1], time_bias)
    if kernel is None:
        out = reference.hstu_attention(q, k, v, case.offsets, **kwargs)
    else:
        out = hstu_attention(q, k, v, case.offsets, **kwargs, max_seq_len=max_seq_len, kernel=kernel)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype).to(DEVICE)
    wrt = [*leaves, *([] if time_bias is None else [time_bias])]
    return [out.detach(), *grads(out, wrt, grad_out), *([None] if time_bias is None else [])]


def check_against_reference(kernel: Kernel, case: Case, max_seq_len: int | None = 40) -> None:
    expected = forward_and_grads(case, None)
    actual = forward_and_grads(case, kernel, max_seq_len)
    assert actual[0] is not None and actual[0].dtype == case.qkvu.dtype and actual[0].shape == expected[0].shape
    rtol = RTOL[case.qkvu.dtype]
    for name, got, want in zip(["out", "qkvu", "position_bias", "time_bias"], actual, expected, strict=True):
        if want is not None:
            # a bias gradient sums ds over every pair of its bucket: in bf16 their rounding adds up (~sqrt of the
            # pairs) while the sum itself may cancel, so it gets 4x the tolerance
            assert_close_scaled(got, want, rtol * 4 if name.endswith("bias") and rtol > RTOL[torch.float32] else rtol)
    trailing = int(case.offsets[-1])
    assert not actual[0][trailing:].any(), "tokens past offsets[-1] must get 0"


@settings(max_examples=25, deadline=None)
@given(case=cases())
def test_torch_matches_the_reference(case: Case) -> None:
    check_against_reference(Kernel.TORCH, case)


def long_case() -> Case:
    """Sequences of 40 (3 blocks of 16, the last partial) and 17 tokens, an empty one, L=12 < the lengths, time
    buckets, bf16: every loop, mask and clamp of the kernels at least once, whatever Hypothesis draws."""
    gen = torch.Generator().manual_seed(7)
    n, heads = 57 + 2, 2
    timestamps = torch.randint(0, 2**40, (n,), generator=gen)
    return Case(
        (torch.randn(n, 4 * heads * 16, generator=gen) * 0.5).bfloat16().to(DEVICE),
        torch.tensor([0, 40, 40, 57], device=DEVICE), heads, 12, torch.randn(heads, 12, generator=gen).to(DEVICE),
        torch.randn(heads, 20, generator=gen).to(DEVICE), timestamps.to(DEVICE),
        (timestamps + torch.randint(-5, 2**33, (n,), generator=gen)).to(DEVICE),
    )  # fmt: skip


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@settings(max_examples=10, deadline=None)  # the interpreter runs ~0.6 s an example
@given(case=cases())
@example(case=long_case())
def test_triton_matches_the_reference(case: Case) -> None:
    check_against_reference(Kernel.TRITON, case)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_writes_every_row_of_its_unfilled_outputs() -> None:
    """The output and dq, dk, dv are allocated unfilled: the kernels write every row, and the last sequence's
    programs zero the tokens past offsets[-1] (here 37 of them: more than two blocks). Deterministic mode fills
    unfilled memory with NaN, so a row no kernel wrote fails the comparison with the reference."""
    case, extra = long_case(), 37
    gen = torch.Generator().manual_seed(3)
    trailing_rows = (torch.randn(extra, case.qkvu.shape[1], generator=gen) * 0.5).to(case.qkvu.dtype).to(DEVICE)
    assert case.timestamps is not None and case.query_times is not None
    times = torch.randint(0, 2**40, (extra,), generator=gen).to(DEVICE)
    case = replace(
        case, qkvu=torch.cat([case.qkvu, trailing_rows]), timestamps=torch.cat([case.timestamps, times]),
        query_times=torch.cat([case.query_times, times]),
    )  # fmt: skip
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert torch.empty(2, dtype=case.qkvu.dtype, device=DEVICE).isnan().all()  # what a missed row would hold
        check_against_reference(Kernel.TRITON, case)
    finally:
        torch.use_deterministic_algorithms(deterministic)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_programs_stride_over_blocks_past_the_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    """With one program per (sequence, head) along the blocks (CUDA caps that axis at 65,535 programs), each program
    takes all its sequence's blocks; `max_seq_len` None reads the longest sequence from offsets."""
    from recsys.ops.triton import hstu_attention as triton_backend

    monkeypatch.setattr(triton_backend, "MAX_GRID_BLOCKS", 1)
    check_against_reference(Kernel.TRITON, long_case(), max_seq_len=None)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_the_kernels_through_tensor_descriptors_give_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel's TMA config (the rows of its inner loop read through tensor descriptors, which read the next
    sequence's rows past a sequence's end and zeros past the tensor's: the forward's q, k and v, dk/dv's q and dO,
    dq's k and v) against the reference, outputs and gradients; in the interpreter here, on a GPU in
    test_every_autotune_config_gives_the_reference."""
    from recsys.ops.triton import hstu_attention as triton_backend

    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("tensor descriptors (TMA) need a Hopper GPU or later")
    for kernel in triton_backend.AUTOTUNED_KERNELS:
        blocks = {"BLOCK_M": 16, "BLOCK_N": 16, "TMA": True}
        if "DIAGS" in kernel.fn.arg_names:
            blocks["DIAGS"] = 32
        monkeypatch.setattr(kernel, "configs", [triton.Config(blocks, num_warps=1)])
        monkeypatch.setattr(kernel, "cache", {})
    check_against_reference(Kernel.TRITON, long_case())


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_tma_configs_are_pruned_where_the_layout_cannot_take_descriptors(monkeypatch: pytest.MonkeyPatch) -> None:
    from recsys.ops.triton import hstu_attention as triton_backend

    qkv = torch.zeros(8, 3 * 2 * 16, dtype=torch.bfloat16).view(8, 3, 2, 16)
    assert triton_backend._tma_fits(qkv[:, 0], qkv[:, 1], qkv[:, 2]) == triton_backend.INTERPRETED  # 32-byte rows
    narrow = torch.zeros(8, 2, 12, dtype=torch.bfloat16)  # heads of 24 bytes: the second head's rows misaligned
    assert not triton_backend._tma_fits(narrow, narrow, narrow)
    strided = torch.zeros(8, 2, 32, dtype=torch.bfloat16)[..., ::2]  # elements of a row not contiguous
    assert not triton_backend._tma_fits(strided, strided, strided)
    broadcast = torch.zeros(1, 2, 16, dtype=torch.bfloat16).expand(8, 2, 16)  # one row for all: a sum's gradient
    assert not triton_backend._tma_fits(qkv[:, 0], qkv[:, 1], qkv[:, 2], broadcast)
    # through each kernel's autotuner's own prune, as a launch calls it: the positional arguments apart from TMA_OK
    plain, tma = (triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "TMA": t}) for t in (False, True))
    for autotuner in triton_backend.AUTOTUNED_KERNELS:
        monkeypatch.setattr(autotuner, "configs", [plain, tma])
        monkeypatch.setattr(autotuner, "nargs", {"q": qkv[:, 0]}, raising=False)  # set by each launch
        assert autotuner.prune_configs({"TMA_OK": False}) == [plain], autotuner.fn.__name__
        assert autotuner.prune_configs({"TMA_OK": True}) == [plain, tma], autotuner.fn.__name__


def _bucket_oracle(gap: int, num_buckets: int) -> int:
    """Integer arithmetic only: 0 below 1 s, else the number of binary digits of the gap, clamped."""
    return 0 if gap < 1 else min(gap.bit_length(), num_buckets - 1)


GAPS = [-7, 0, 1, 2, 3, *[2**e + d for e in range(2, 34) for d in (-1, 0, 1)], 10**10]


def test_time_buckets_are_exact_around_powers_of_two() -> None:
    for num_buckets in (40, 8):
        got = time_buckets(torch.tensor(GAPS), num_buckets).tolist()
        assert got == [_bucket_oracle(g, num_buckets) for g in GAPS]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("num_buckets", [40, 8])
def test_kernels_bucket_every_gap_exactly(kernel: Kernel, num_buckets: int) -> None:
    """One sequence of one token per gap: with q = k = 0, no position bias and v = 1, out = silu(time_bias[bucket])
    / L, and every bucket has its own time-bias value, so a bucket off by one shows."""
    n, heads, head_dim, max_len = len(GAPS), 1, 16, 4
    qkvu = torch.zeros(n, 4 * head_dim, device=DEVICE)
    qkvu[:, head_dim : 2 * head_dim] = 1.0  # v
    time_bias = torch.arange(num_buckets, dtype=torch.float32, device=DEVICE)[None] / 4  # distinct per bucket
    timestamps = torch.full((n,), 10**9, device=DEVICE)
    case = Case(
        qkvu, torch.arange(n + 1, device=DEVICE), heads, max_len, torch.zeros(heads, max_len, device=DEVICE),
        time_bias, timestamps, timestamps + torch.tensor(GAPS, device=DEVICE),
    )  # fmt: skip
    q, k, v = case.qkv(qkvu)
    out = hstu_attention(q, k, v, case.offsets, **case.kwargs(case.position_bias, time_bias), kernel=kernel)
    buckets = torch.tensor([_bucket_oracle(g, num_buckets) for g in GAPS], device=DEVICE)
    expected = torch.nn.functional.silu(time_bias[0, buckets]) / max_len
    torch.testing.assert_close(out[:, 0, 0], expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kernel", KERNELS)
def test_empty_sequences_and_zero_stride_gradients(kernel: Kernel) -> None:
    """No sequence at all, then all-empty ones; `.sum()` gives an output gradient of stride 0 everywhere."""
    position_bias = torch.randn(2, 3, device=DEVICE, requires_grad=True)
    qkvu = torch.randn(5, 4 * 2 * 8, device=DEVICE, requires_grad=True)
    case = Case(qkvu, torch.tensor([0], device=DEVICE), 2, 3, position_bias)
    for offsets in ([0], [0, 0, 0], [0, 2, 5]):
        q, k, v = case.qkv(qkvu)
        out = hstu_attention(q, k, v, torch.tensor(offsets, device=DEVICE), max_len=3, position_bias=position_bias,
                             kernel=kernel)  # fmt: skip
        expected = reference.hstu_attention(q, k, v, torch.tensor(offsets, device=DEVICE), max_len=3,
                                            position_bias=position_bias)  # fmt: skip
        assert_close_scaled(out.detach(), expected.detach(), 1e-5)
        ones = torch.ones((), device=DEVICE)
        got, want = (grads(o.sum(), [qkvu, position_bias], ones) for o in (out, expected))
        for g, w, leaf in zip(got, want, (qkvu, position_bias), strict=True):
            assert_close_scaled(g, torch.zeros_like(leaf) if w is None else w, 1e-5)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_ops_are_registered_with_fakes_and_traced_by_torch_compile() -> None:
    n, heads, head_dim = 12, 2, 8
    assert hasattr(torch.ops.recsys, "hstu_attention_triton")
    with FakeTensorMode():
        q = torch.empty(n, heads, head_dim, dtype=torch.bfloat16)
        out = torch.ops.recsys.hstu_attention_triton(
            q, q, q, torch.empty(3, dtype=torch.int64), torch.empty(heads, 5), None, None, None, 5, 7
        )
        assert out.shape == (n, heads, head_dim) and out.dtype == torch.bfloat16

    offsets = torch.tensor([0, 5, 12], device=DEVICE)
    position_bias = torch.randn(heads, 5, device=DEVICE, requires_grad=True)
    qkvu = torch.randn(n, 4 * heads * head_dim, device=DEVICE, requires_grad=True)

    def attend(qkvu: torch.Tensor, position_bias: torch.Tensor) -> torch.Tensor:
        u, v, q, k = (t.view(n, heads, head_dim) for t in qkvu.chunk(4, dim=-1))
        out = hstu_attention(q, k, v, offsets, max_len=5, position_bias=position_bias, max_seq_len=7,
                             kernel=Kernel.TRITON)  # fmt: skip
        return (out * u).sum()

    compiled, graphs = compiled_recording_graphs(attend)
    got = torch.autograd.grad(compiled(qkvu, position_bias), [qkvu, position_bias])
    # the kernels' ops, not another path
    assert "recsys.hstu_attention_triton.default" in graphs[0]
    assert "recsys.hstu_attention_triton_backward.default" in graphs[0]
    want = torch.autograd.grad(attend(qkvu, position_bias), [qkvu, position_bias])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_eager_calls_launch_the_kernels_without_the_dispatcher() -> None:
    """In eager mode the Function calls the Triton launchers itself: no custom op (nor torch.library's autograd
    wrapper) on the host's path of a call, which at short shapes is the call's time."""
    n, heads, head_dim = 12, 2, 8
    qkvu = torch.randn(n, 3 * heads * head_dim, device=DEVICE, requires_grad=True)
    q, k, v = (t.view(n, heads, head_dim) for t in qkvu.chunk(3, dim=-1))
    position_bias = torch.randn(heads, 5, device=DEVICE, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiled:
        out = hstu_attention(q, k, v, torch.tensor([0, 5, 12], device=DEVICE), max_len=5,
                             position_bias=position_bias, max_seq_len=7, kernel=Kernel.TRITON)  # fmt: skip
        out.sum().backward()
    names = {event.key for event in profiled.key_averages()}
    assert "_TritonAttention" in names and "_TritonAttentionBackward" in names, sorted(names)
    assert not [name for name in names if name.startswith("recsys::") or "GeneratedBackwardFor" in name]
    assert qkvu.grad is not None and position_bias.grad is not None


def real_case(num_seqs: int, seq_len: int, dtype: torch.dtype) -> Case:
    """H=2, E=64, jagged lengths from seq_len / 2 to seq_len (the first at seq_len), 32 time buckets, on CUDA."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (num_seqs,), generator=gen)
    lengths[0] = seq_len
    n = int(lengths.sum())
    timestamps = torch.randint(0, 2**40, (n,), generator=gen)
    return Case(
        (torch.randn(n, 4 * 2 * 64, generator=gen) * 0.3).to(dtype).cuda(),
        torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).cuda(), 2, seq_len,
        torch.randn(2, seq_len, generator=gen).cuda(), torch.randn(2, 32, generator=gen).cuda(),
        timestamps.cuda(), (timestamps + torch.randint(0, 2**33, (n,), generator=gen)).cuda(),
    )  # fmt: skip


def check_real_case(case: Case, seq_len: int) -> None:
    expected = forward_and_grads(case, None)
    actual = forward_and_grads(case, Kernel.TRITON, max_seq_len=seq_len)
    for name, got, want in zip(["out", "qkvu", "position_bias", "time_bias"], actual, expected, strict=True):
        assert want is not None
        # the bias gradients sum up to ~10^6 terms each, in another order (atomics): fp32 keeps ~1e-5 of them
        rtol = max(RTOL[case.qkvu.dtype], 1e-4) if name.endswith("bias") else RTOL[case.qkvu.dtype]
        assert_close_scaled(got, want, rtol), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="real sizes need a CUDA device (the interpreter is slow)")
@pytest.mark.parametrize(("num_seqs", "seq_len"), [(128, 200), (8, 1024)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_real_sizes_on_cuda(num_seqs: int, seq_len: int, dtype: torch.dtype) -> None:
    """TRITON against the reference (with the one autotune config tests run: tests/conftest.py)."""
    check_real_case(real_case(num_seqs, seq_len, dtype), seq_len)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("tma", "tile"),
    [(False, tile) for tile in AUTOTUNE_TILES] + [(True, tile) for tile in TMA_TILES],
    ids=lambda value: "x".join(map(str, value)) if isinstance(value, tuple) else ("tma" if value else "loads"),
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_autotune_config_gives_the_reference(
    dtype: torch.dtype, tma: bool, tile: tuple[int, int, int, int], one_hstu_attention_config: dict[Any, list[Any]]
) -> None:
    """Each config the kernels may autotune to, alone (a test each: a stopped run loses one config, and names it):
    lengths of 150-300 tokens cross every block size's edges; `tma`: each kernel's config of the tile that reads
    through tensor descriptors."""
    if not torch.cuda.is_available():
        pytest.skip("the autotune configs are compiled for a CUDA device")
    if tma and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("tensor descriptors (TMA) need a Hopper GPU or later")
    every = one_hstu_attention_config  # each autotuned kernel's whole config list (tests/conftest.py)
    pinned = {tuner: (tuner.configs, tuner.cache) for tuner in every}
    try:
        for tuner, configs in every.items():
            tuner.configs = [c for c in configs if config_tile(c) == tile and c.kwargs.get("TMA", tma) == tma]
            tuner.cache = {}
        try:
            check_real_case(real_case(6, 300, dtype), 300)
        except OutOfResources as error:  # what the autotuner does with it too: times it as never finishing
            pytest.skip(f"this GPU cannot hold the config, so its autotuner skips it: {error}")
    finally:
        for tuner, (configs, cache) in pinned.items():
            tuner.configs, tuner.cache = configs, cache


def test_auto_choice_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    dispatch.log_choice.cache_clear()
    q = torch.randn(3, 1, 4)
    with caplog.at_level(logging.INFO, logger="recsys.ops.hstu_attention"):
        for _ in range(3):
            hstu_attention(q, q, q, torch.tensor([0, 3]), max_len=2, position_bias=torch.zeros(1, 2))
    messages = [r.getMessage() for r in caplog.records if r.name == "recsys.ops.hstu_attention"]
    assert messages == ["hstu_attention: TORCH kernel on cpu (chosen by availability)"]


def test_unavailable_kernels_raise_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    q = torch.randn(3, 1, 4)
    with pytest.raises(KernelUnavailableError, match=r"no hstu_attention.*kernel=Kernel\.TORCH"):
        hstu_attention(q, q, q, torch.tensor([0, 3]), max_len=2, position_bias=torch.zeros(1, 2), kernel=Kernel.FBGEMM)
    if HAS_TRITON:
        from recsys.ops.triton import hstu_attention as triton_backend

        monkeypatch.setattr(triton_backend, "INTERPRETED", False)
        with pytest.raises(KernelUnavailableError, match="TRITON_INTERPRET=1"):
            ops.select_kernel(Kernel.TRITON, cpu)
    monkeypatch.setattr(dispatch, "triton_available", lambda: False)
    with pytest.raises(KernelUnavailableError, match="pip install triton"):
        ops.select_kernel(Kernel.TRITON, cpu)


def _call(**changes: Any) -> None:
    """hstu_attention on a valid small input (N=4, H=2, E=4, L=3, two sequences) with `changes` applied."""
    q = torch.randn(4, 2, 4)
    args: dict[str, Any] = {"q": q, "k": q, "v": q, "offsets": torch.tensor([0, 1, 4]), "max_len": 3,
                            "position_bias": torch.zeros(2, 3), "kernel": Kernel.TORCH}  # fmt: skip
    args.update(changes)
    hstu_attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("offsets"), **args)


TIMES = {"time_bias": torch.zeros(2, 5), "timestamps": torch.zeros(4, dtype=torch.int64),
         "query_times": torch.zeros(4, dtype=torch.int64)}  # fmt: skip
BAD_CALLS: dict[str, tuple[dict[str, Any], str]] = {
    "2-d q": ({"q": torch.randn(4, 8)}, r"q must be a \(N, H, E\) fp32 or bf16"),
    "fp16 q": ({"q": torch.randn(4, 2, 4).half()}, "fp16: use bf16 autocast"),
    "k of another shape": ({"k": torch.randn(4, 2, 2)}, r"k must match q: \(4, 2, 4\)"),
    "v of another dtype": ({"v": torch.randn(4, 2, 4).bfloat16()}, "v must match q"),
    "int32 offsets": ({"offsets": torch.tensor([0, 1, 4], dtype=torch.int32)}, "offsets must be a non-empty 1-d int64"),
    "offsets past N": ({"offsets": torch.tensor([0, 1, 5])}, "rise from 0 to at most N=4"),
    "falling offsets": ({"offsets": torch.tensor([0, 3, 1])}, "rise from 0 to at most N=4"),
    "max_len 0": ({"max_len": 0, "position_bias": torch.zeros(2, 0)}, "max_len .* must be >= 1"),
    "bias of another width": ({"position_bias": torch.zeros(2, 4)}, r"position_bias must be a \(2, 3\) float"),
    "bias of another head count": ({"position_bias": torch.zeros(1, 3)}, r"position_bias must be a \(2, 3\)"),
    "short max_seq_len": ({"max_seq_len": 2}, r"max_seq_len=2 is below the longest sequence \(3\)"),
    "negative max_seq_len": ({"max_seq_len": -1}, "max_seq_len must be >= 0"),
    "times without time_bias": ({**TIMES, "time_bias": None}, "read with time_bias only"),
    "time_bias without times": ({"time_bias": torch.zeros(2, 5)}, r"time_bias needs timestamps: a \(N,\) = \(4,\)"),
    "float query times": ({**TIMES, "query_times": torch.zeros(4)}, "time_bias needs query_times"),
    "time_bias of no bucket": ({**TIMES, "time_bias": torch.zeros(2, 0)}, r"time_bias must be a \(2, K >= 1\)"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_inputs_are_named(name: str) -> None:
    changes, message = BAD_CALLS[name]
    with pytest.raises(ValueError, match=message):
        _call(**changes)


def test_triton_refuses_heads_wider_than_its_tile() -> None:
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    device = "cuda" if torch.cuda.is_available() else "cpu"  # on a GPU machine Triton refuses cpu tensors first
    q = torch.randn(2, 1, 264, device=device)
    with pytest.raises(ValueError, match=r"head dim E=264 is wider .*kernel=Kernel\.TORCH"):
        hstu_attention(
            q, q, q, torch.tensor([0, 2], device=device), max_len=2,
            position_bias=torch.zeros(1, 2, device=device), kernel=Kernel.TRITON,
        )  # fmt: skip
