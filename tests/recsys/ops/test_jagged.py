"""The jagged helpers' backends (TORCH, TRITON) against the reference, and the reference against fbgemm on CPU.

Dimension letters: B rows, L the padded length, D the width of each value, N values.
These ops only copy values, so every backend must match the reference exactly, forward and gradients.
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

import recsys.ops.jagged as ops
from recsys.ops import dispatch
from recsys.ops.jagged import (
    Kernel,
    KernelUnavailableError,
    complete_cumsum,
    jagged_to_padded_dense,
    padded_dense_to_jagged,
)
from recsys.ops.reference import jagged as reference

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.kernels
HAS_TRITON = importlib.util.find_spec("triton") is not None
KERNELS = [
    Kernel.TORCH,
    pytest.param(Kernel.TRITON, marks=pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")),
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def assert_equal(actual: torch.Tensor | None, expected: torch.Tensor | None) -> None:
    """Bit for bit (these ops only copy values), with assert_close's messages."""
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=0.0)


@dataclass(frozen=True)
class Case:
    values: torch.Tensor  # (N, D)
    offsets: torch.Tensor  # (B+1,)
    max_length: int  # L
    padding_value: float

    @property
    def batch_size(self) -> int:
        return self.offsets.numel() - 1


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """B = 0..6 rows of 0..9 values (empty rows, rows longer than L), L = 0..7, D with partial D-blocks."""
    lengths = draw(st.lists(st.integers(0, 9), min_size=0, max_size=6))
    max_length = draw(st.integers(0, 7))
    dim = draw(st.sampled_from([1, 3, 8, 20]))  # 20: two D-blocks in the interpreter (BLOCK_D <= 16)
    dtype = draw(st.sampled_from(DTYPES))
    offsets_dtype = draw(st.sampled_from([torch.int64, torch.int32]))
    padding_value = draw(st.sampled_from([0.0, -1.5, 0.1]))  # 0.1: rounded to the dtype
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    offsets = torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=offsets_dtype)
    values = torch.randn(int(offsets[-1]), dim, generator=gen).to(dtype)
    return Case(values.to(DEVICE), offsets.to(DEVICE), max_length, padding_value)


def reference_dense_and_grad(case: Case, grad_dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dense (B, L, D), gradient of the values (N, D)) of the reference, through autograd."""
    values = case.values.clone().requires_grad_()
    dense = reference.jagged_to_padded_dense(values, case.offsets, case.max_length, case.padding_value)
    dense.backward(grad_dense)
    assert values.grad is not None
    return dense.detach(), values.grad


@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=20, deadline=None)
@given(case=cases())
def test_jagged_to_padded_dense_matches_reference(kernel: Kernel, case: Case) -> None:
    values = case.values.clone().requires_grad_()
    dense = jagged_to_padded_dense(values, case.offsets, case.max_length, case.padding_value, kernel=kernel)
    assert dense.shape == (case.batch_size, case.max_length, case.values.shape[1])
    assert dense.dtype == case.values.dtype

    grad_dense = torch.randn(dense.shape, device=DEVICE).to(dense.dtype)
    expected, expected_grad = reference_dense_and_grad(case, grad_dense)
    assert_equal(dense.detach(), expected)
    dense.backward(grad_dense)
    assert values.grad is not None and values.grad.dtype == values.dtype
    # Values truncated away (positions >= L) get exactly 0.
    assert_equal(values.grad, expected_grad)


@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=20, deadline=None)
@given(case=cases(), pass_total=st.booleans())
def test_padded_dense_to_jagged_matches_reference(kernel: Kernel, case: Case, pass_total: bool) -> None:
    gen = torch.Generator().manual_seed(case.values.numel())
    dense_shape = (case.batch_size, case.max_length, case.values.shape[1])
    dense = torch.randn(dense_shape, generator=gen).to(case.values.dtype).to(DEVICE)
    grad_values = torch.randn(case.values.shape, generator=gen).to(case.values.dtype).to(DEVICE)

    expected_input = dense.clone().requires_grad_()
    expected = reference.padded_dense_to_jagged(expected_input, case.offsets)
    expected.backward(grad_values)

    leaf = dense.clone().requires_grad_()
    total = case.values.shape[0] if pass_total else None
    values = padded_dense_to_jagged(leaf, case.offsets, total_length=total, kernel=kernel)
    assert values.shape == case.values.shape and values.dtype == dense.dtype
    assert_equal(values.detach(), expected.detach())
    values.backward(grad_values)
    # Padding positions (past a row's end) get exactly 0.
    assert_equal(leaf.grad, expected_input.grad)


@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=15, deadline=None)
@given(case=cases())
def test_round_trip_and_second_order_gradients(kernel: Kernel, case: Case) -> None:
    """dense -> jagged -> dense keeps the first L values; backward of backward is the forward again."""
    values = case.values.clone().requires_grad_()
    dense = jagged_to_padded_dense(values, case.offsets, case.max_length, kernel=kernel)
    back = padded_dense_to_jagged(dense, case.offsets, total_length=case.values.shape[0], kernel=kernel)
    expected = reference.padded_dense_to_jagged(
        reference.jagged_to_padded_dense(case.values, case.offsets, case.max_length), case.offsets
    )
    assert_equal(back.detach(), expected)

    # d/d(grad) of <values.grad, probe> = J2D(probe) when values.grad = D2J(grad_dense).
    grad_dense = torch.randn(dense.shape, device=DEVICE).to(dense.dtype).requires_grad_()
    (values_grad,) = torch.autograd.grad(dense, values, grad_dense, create_graph=True)
    probe = torch.randn(values.shape, device=DEVICE).to(values.dtype)
    (second,) = torch.autograd.grad(values_grad, grad_dense, probe, allow_unused=True)
    expected_second = reference.jagged_to_padded_dense(probe, case.offsets, case.max_length)
    assert_equal(torch.zeros_like(grad_dense) if second is None else second, expected_second)


@pytest.mark.parametrize("kernel", KERNELS)
def test_strided_inputs_and_expanded_gradients(kernel: Kernel) -> None:
    """Non-contiguous values / dense and the zero-stride gradients of `.sum()` are read through their strides."""
    offsets = torch.tensor([0, 3, 3, 7], device=DEVICE)
    wide = torch.randn(7, 10, device=DEVICE)
    values = wide[:, ::2].requires_grad_()  # (N=7, D=5), row stride 10, column stride 2
    dense = jagged_to_padded_dense(values, offsets, 2, kernel=kernel)
    assert_equal(dense, reference.jagged_to_padded_dense(values.detach(), offsets, 2))
    dense.sum().backward()  # grad_dense: expanded ones, all strides 0
    assert_equal(values.grad, reference.padded_dense_to_jagged(torch.ones(3, 2, 5, device=DEVICE), offsets))

    dense_in = torch.randn(2, 5, 3, device=DEVICE).transpose(0, 2).requires_grad_()  # (B=3, L=5, D=2), transposed
    jagged = padded_dense_to_jagged(dense_in, offsets, kernel=kernel)
    assert_equal(jagged, reference.padded_dense_to_jagged(dense_in.detach(), offsets))
    jagged.sum().backward()
    assert_equal(dense_in.grad, reference.jagged_to_padded_dense(torch.ones(7, 2, device=DEVICE), offsets, 5))


@pytest.mark.parametrize("kernel", KERNELS)
@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(0, 1000), max_size=50), dtype=st.sampled_from([torch.int32, torch.int64]))
def test_complete_cumsum_matches_reference(kernel: Kernel, lengths: list[int], dtype: torch.dtype) -> None:
    # Up to 50 lengths: several chunks of the Triton scan in the interpreter (CUMSUM_BLOCK = 16).
    lengths_tensor = torch.tensor(lengths, dtype=dtype, device=DEVICE)
    offsets = complete_cumsum(lengths_tensor, kernel=kernel)
    assert offsets.dtype == torch.int64 and offsets.device == lengths_tensor.device
    assert offsets.tolist() == reference.complete_cumsum(lengths_tensor).tolist()
    assert offsets.tolist()[0] == 0 and len(offsets) == len(lengths) + 1


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fbgemm_gpu's own import-time notices
@settings(max_examples=15, deadline=None)
@given(case=cases())
def test_reference_semantics_are_fbgemm(case: Case) -> None:
    """The reference matches fbgemm's CPU ops: jagged_to_padded_dense, dense_to_jagged, asynchronous_complete_cumsum."""
    pytest.importorskip("fbgemm_gpu")
    fbgemm = torch.ops.fbgemm
    values, offsets = case.values.cpu(), case.offsets.cpu()
    expected_dense = fbgemm.jagged_to_padded_dense(values, [offsets], [case.max_length], case.padding_value)
    assert_equal(reference.jagged_to_padded_dense(values, offsets, case.max_length, case.padding_value), expected_dense)
    dense = torch.randn(case.batch_size, case.max_length, values.shape[1]).to(values.dtype)
    expected_values, _ = fbgemm.dense_to_jagged(dense, [offsets], values.shape[0])
    assert_equal(reference.padded_dense_to_jagged(dense, offsets), expected_values)
    lengths = offsets[1:] - offsets[:-1]
    assert reference.complete_cumsum(lengths).tolist() == fbgemm.asynchronous_complete_cumsum(lengths).tolist()


def test_auto_choice_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    dispatch.log_choice.cache_clear()
    values = torch.randn(3, 2)
    offsets = torch.tensor([0, 1, 3])
    with caplog.at_level(logging.INFO, logger="recsys.ops.jagged"):
        for _ in range(3):
            padded_dense_to_jagged(jagged_to_padded_dense(values, offsets, 2), offsets)
            complete_cumsum(torch.tensor([1, 2]))
    messages = [r.getMessage() for r in caplog.records if r.name == "recsys.ops.jagged"]
    assert messages == [
        "jagged_to_padded_dense: TORCH kernel on cpu (chosen by availability)",
        "padded_dense_to_jagged: TORCH kernel on cpu (chosen by availability)",
        "complete_cumsum: TORCH kernel on cpu (chosen by default: torch.cumsum scales, the Triton scan is one program)",
    ]


def test_unavailable_kernels_raise_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    with pytest.raises(KernelUnavailableError, match=r"kernel=Kernel\.TORCH"):
        ops.select_kernel(Kernel.FBGEMM, cpu)
    if HAS_TRITON:
        from recsys.ops.triton import jagged as triton_backend

        monkeypatch.setattr(triton_backend, "INTERPRETED", False)
        with pytest.raises(KernelUnavailableError, match="TRITON_INTERPRET=1"):
            jagged_to_padded_dense(torch.randn(2, 2), torch.tensor([0, 2]), 2, kernel=Kernel.TRITON)
    monkeypatch.setattr(dispatch, "triton_available", lambda: False)
    with pytest.raises(KernelUnavailableError, match="pip install triton"):
        ops.select_kernel(Kernel.TRITON, cpu)
    assert ops.select_kernel(None, cpu) is Kernel.TORCH


BAD_CALLS = {
    "1-d values": (
        lambda: jagged_to_padded_dense(torch.randn(3), torch.tensor([0, 3]), 2),
        r"values must be a \(N, D\)",
    ),
    "int values": (lambda: jagged_to_padded_dense(torch.randn(3, 2).long(), torch.tensor([0, 3]), 2), "fp32/bf16/fp16"),
    "float offsets": (lambda: jagged_to_padded_dense(torch.randn(3, 2), torch.tensor([0.0, 3.0]), 2), "int32/int64"),
    "short offsets": (lambda: jagged_to_padded_dense(torch.randn(3, 2), torch.tensor([0, 2]), 2), "rise from 0 to N=3"),
    "falling offsets": (
        lambda: jagged_to_padded_dense(torch.randn(3, 2), torch.tensor([0, 2, 1, 3]), 2),
        "rise from 0 to N=3",
    ),
    "negative L": (
        lambda: jagged_to_padded_dense(torch.randn(3, 2), torch.tensor([0, 3]), -1),
        "max_length must be >= 0",
    ),
    "B mismatch": (lambda: padded_dense_to_jagged(torch.randn(2, 2, 2), torch.tensor([0, 3])), r"B\+1 = 3 values"),
    "wrong total": (
        lambda: padded_dense_to_jagged(torch.randn(1, 2, 2), torch.tensor([0, 3]), total_length=4),
        "rise from 0 to N=4",
    ),
    "float lengths": (lambda: complete_cumsum(torch.tensor([1.0])), "lengths must be a 1-d int32/int64"),
    "negative length": (lambda: complete_cumsum(torch.tensor([1, -1])), "lengths must be >= 0"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_inputs_are_named(name: str) -> None:
    call, message = BAD_CALLS[name]
    with pytest.raises(ValueError, match=message):
        call()
