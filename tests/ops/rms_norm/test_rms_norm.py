"""rms_norm: the batch-invariant Triton kernel, the float64 reference, and the two batch-variant controls."""

from __future__ import annotations

import pytest
import torch

from gdn_lab.device import detect
from gdn_lab.ops import rms_norm
from gdn_lab.routing import get

OP = "rms_norm"
# (atol, rtol): float32 math against float64; 16-bit outputs round once.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1e-2, 1.6e-2)}


def _inputs(m, n, dtype, device, seed=0, weight_dtype=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g).to(device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(device=device, dtype=weight_dtype or dtype)
    return x, w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(("m", "n", "weight_dtype"), [(1, 1, None), (5, 300, torch.float32), (3, 1000, None)])
def test_triton_matches_reference(device, dtype, m, n, weight_dtype):
    x, w = _inputs(m, n, dtype, device, weight_dtype=weight_dtype)
    out = rms_norm(x, w, 1e-6, backend="triton")
    ref = rms_norm(x, w, 1e-6, backend="torch")
    assert out.dtype == dtype and out.shape == (m, n)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_triton_is_batch_invariant(device, dtype):
    x, w = _inputs(40, 1000, dtype, device, seed=1)
    full = rms_norm(x, w, backend="triton")
    for m in (1, 2, 3, 17):
        assert torch.equal(rms_norm(x[:m], w, backend="triton"), full[:m]), f"M={m}"
    assert torch.equal(rms_norm(x[29:30].clone(), w, backend="triton"), full[29:30])


def _rows_differ(run, x, w) -> bool:
    """Whether any row normalised alone differs in bits from the same row normalised in x."""
    full = run(x, w, 1e-6)
    return any(not torch.equal(run(x[i : i + 1], w, 1e-6), full[i : i + 1]) for i in range(x.shape[0]))


def test_torch_native_control_varies(device):
    # On the CPU, torch splits a row of >= 32768 elements across threads when there are fewer rows
    # than threads; the float32 sum then rounds differently for some rows (not every row shows it
    # after the rsqrt, hence 64 rows).
    if device.type == "cpu" and torch.get_num_threads() < 2:
        pytest.skip("torch's CPU reduction only splits a row with 2+ threads")
    x, w = _inputs(64, 65536, torch.float32, device, seed=3)
    assert _rows_differ(get(OP, "torch-native").run, x, w)


def test_splitk_control_varies(device):
    from gdn_lab.ops.rms_norm.triton_kernels import row_block, row_splits_for_batch

    sms = detect(device).num_sms
    n = 4 * row_block(1 << 30)  # four chunks per row
    m = 4 * sms  # rows enough to fill the SMs: no split
    assert row_splits_for_batch(1, n, sms) > 1 and row_splits_for_batch(m, n, sms) == 1
    x, w = _inputs(m, n, torch.float32, device, seed=4)
    assert _rows_differ(get(OP, "triton-splitk-by-batch").run, x, w)


def test_controls_are_registered_as_controls():
    from gdn_lab.ops.rms_norm.reference import rms_norm_native
    from gdn_lab.ops.rms_norm.triton_kernels import rms_norm_splitk_by_batch

    for name, fn in (("torch-native", rms_norm_native), ("triton-splitk-by-batch", rms_norm_splitk_by_batch)):
        b = get(OP, name)
        assert b.variant_control and not b.auto
        assert "control" in fn.__doc__.lower()


@pytest.mark.parametrize(
    ("x", "w", "eps", "match"),
    [
        (torch.randn(2, 8), torch.randn(7), 1e-6, "weight: expected shape"),
        (torch.randn(2, 8), torch.randn(8), 0.0, "eps: expected a positive finite float"),
        (torch.randn(8), torch.randn(8), 1e-6, "x: expected 2 dims"),
        (torch.randn(2, 8).to(torch.int32), torch.randn(8), 1e-6, "x: dtype"),
    ],
    ids=["N-mismatch", "eps-zero", "x-rank", "x-dtype"],
)
def test_bad_input(x, w, eps, match):
    with pytest.raises(ValueError, match=match):
        rms_norm(x, w, eps, backend="triton")
