"""matmul: the batch-invariant Triton kernel, the float64 reference, and the two batch-variant controls.

Closeness is against the float64 reference with a tolerance per dtype. Invariance is the
batch_invariant_ops property `mm(x[:m], w) == mm(x, w)[:m]`, plus a row taken alone from the
middle. Each control is shown to differ on a case the test constructs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_lab.device import detect
from gdn_lab.ops import matmul
from gdn_lab.routing import get

OP = "matmul"
# (atol, rtol): float32 accumulation of up to 256 products of unit normals; 16-bit outputs round once.
TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1e-2, 1.6e-2)}


def _inputs(m, k, n, dtype, device, seed=0, transposed=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    w = torch.randn(n, k, generator=g).to(device=device, dtype=dtype)
    return x, (w.t() if transposed else w.t().contiguous())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(
    ("m", "k", "n", "transposed"),
    [(1, 40, 24, False), (33, 100, 70, False), (64, 256, 96, True)],
    ids=["1x40x24", "33x100x70", "64x256x96-wT"],
)
def test_triton_matches_reference(device, dtype, m, k, n, transposed):
    x, w = _inputs(m, k, n, dtype, device, transposed=transposed)
    out = matmul(x, w, backend="triton")
    ref = matmul(x, w, backend="torch")
    assert out.dtype == dtype and out.shape == (m, n)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_triton_is_batch_invariant(device, dtype):
    x, w = _inputs(64, 200, 70, dtype, device, seed=1)
    full = matmul(x, w, backend="triton")
    for m in (1, 2, 3, 17, 33):
        assert torch.equal(matmul(x[:m], w, backend="triton"), full[:m]), f"M={m}"
    assert torch.equal(matmul(x[37:38].clone(), w, backend="triton"), full[37:38])


def test_torch_native_control_varies(device):
    # Measured: the H200's cuBLAS changes kernels for bf16 K=N=4096 from M=64 up, while an H100 kept
    # row 0 of M=1 and M=2048 equal there: so rows 0..M-1 of M = 1, 8 and 64 against the full call,
    # over K x N that include long K (split-K at small M). The CPU's float32 path for M < 8 differs
    # from larger M (bf16 on the CPU did not vary: see matmul_native).
    if device.type == "cuda":
        cases = [(2048, k, n, torch.bfloat16) for k, n in ((4096, 4096), (12288, 4096), (16384, 1024), (4096, 12288))]
    else:
        cases = [(64, 256, 96, torch.float32)]
    run = get(OP, "torch-native").run
    tried = []
    for m, k, n, dtype in cases:
        x, w = _inputs(m, k, n, dtype, device)
        full = run(x, w)
        for rows in (1, 8, 64):
            if not torch.equal(run(x[:rows], w), full[:rows]):
                return
            tried.append(f"{rows}x{k}x{n}")
    pytest.fail(f"torch.matmul kept the bits of every row at {', '.join(tried)} against M={cases[0][0]}")


def test_splitk_control_varies(device):
    from gdn_lab.ops.matmul.triton_kernels import matmul_config, splitk_for_batch

    dtype = torch.float32
    cfg = matmul_config(dtype)
    sms = detect(device).num_sms
    m, k, n = cfg.block_m * sms, 4 * cfg.block_k, cfg.block_n  # one column tile; M fills every SM
    assert splitk_for_batch(1, n, k, cfg, sms) > 1 and splitk_for_batch(m, n, k, cfg, sms) == 1
    x, w = _inputs(m, k, n, dtype, device, seed=2)
    run = get(OP, "triton-splitk-by-batch").run
    alone, batched = run(x[:1], w), run(x, w)[:1]
    assert not torch.equal(alone, batched)
    torch.testing.assert_close(alone, batched, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_torch_splitk_control_varies_by_rows_on_every_device(device, dtype):
    from gdn_lab.ops.matmul.reference import splitk_slices

    x, w = _inputs(64, 256, 96, dtype, device, seed=3)
    run = get(OP, "torch-splitk-by-batch").run
    assert [splitk_slices(m, 256) for m in (1, 2, 16, 64)] == [32, 32, 4, 1]
    full = run(x, w)
    for m in (1, 16):  # more slices than the 64-row batch's one
        assert not torch.equal(run(x[:m], w), full[:m]), f"M={m}"
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(full.float(), matmul(x, w, backend="torch").float(), atol=atol, rtol=rtol)


def test_controls_are_registered_as_controls():
    from gdn_lab.ops.matmul.reference import matmul_native, matmul_splitk_torch
    from gdn_lab.ops.matmul.triton_kernels import matmul_splitk_by_batch

    for name, fn in (
        ("torch-native", matmul_native),
        ("triton-splitk-by-batch", matmul_splitk_by_batch),
        ("torch-splitk-by-batch", matmul_splitk_torch),
    ):
        b = get(OP, name)
        assert b.variant_control and not b.auto
        assert "control" in fn.__doc__.lower()
    assert get(OP, "triton").auto and not get(OP, "triton").variant_control


@pytest.mark.parametrize(
    ("x", "w", "match"),
    [
        (torch.randn(2, 8), torch.randn(8, 3, dtype=torch.float64), "w: dtype"),
        (torch.randn(2, 8), torch.randn(7, 3), "w: expected shape"),
        (torch.randn(2, 0), torch.randn(0, 3), "K: must be > 0"),
        (torch.randn(2, 8, 1), torch.randn(8, 3), "x: expected 2 dims"),
    ],
    ids=["w-dtype", "K-mismatch", "empty-K", "x-rank"],
)
def test_bad_input(x, w, match):
    with pytest.raises(ValueError, match=match):
        matmul(x, w, backend="triton")


def _packed_outputs(run, target, w, g):
    """The target's rows when it follows 0..16 other rows (and more rows follow it), per offset."""
    outs = {}
    for before in range(17):
        others = torch.randn(before + 5, target.shape[1], generator=g).to(target)
        x = torch.cat([others[:before], target, others[before:]])
        outs[before] = run(x, w)[before : before + target.shape[0]]
    return outs


def _numpy_rows_depend_on_their_place(cfg, shifts: range, seed: int = 0) -> bool:
    """Whether numpy's matmul of a [block_m, block_k] x [block_k, block_n] float32 tile (what tl.dot
    runs under the interpreter) gives a row other bits when the row sits elsewhere in the tile.
    It depends on the machine's BLAS: OpenBLAS picks its micro-kernels per CPU."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((cfg.block_m, cfg.block_k), dtype=np.float32)
    b = rng.standard_normal((cfg.block_k, cfg.block_n), dtype=np.float32)
    rows = a @ b
    return any(not np.array_equal(np.roll(rows, s, axis=0), np.roll(a, s, axis=0) @ b) for s in shifts)


def test_triton_rows_do_not_depend_on_their_tile_offset(device, monkeypatch):
    """A 9-row target packed after 0..16 other rows keeps its bits. Under the interpreter numpy's
    matmul can compute a row differently at different places in a tile (BLAS micro-kernels, by
    CPU), so the kernel's dot there is products summed over K in order. The control: with tl.dot
    itself the target moves bits exactly when numpy's matmul of such tiles moves a row's bits on
    this machine (computed here, never assumed)."""
    from gdn_lab.ops.matmul import triton_kernels

    g = torch.Generator().manual_seed(5)
    target = torch.randn(9, 96, generator=g).to(device)
    w = torch.randn(96, 40, generator=g).to(device)
    run = get(OP, "triton").run
    alone = run(target, w)
    for before, out in _packed_outputs(run, target, w, g).items():
        assert torch.equal(out, alone), f"target after {before} rows"
    if device.type == "cpu":
        monkeypatch.setattr(triton_kernels, "interpreting", lambda: False)  # tl.dot, and the GPU tiles
        outs = _packed_outputs(run, target, w, g)
        moved = any(not torch.equal(out, run(target, w)) for out in outs.values())
        assert moved == _numpy_rows_depend_on_their_place(triton_kernels.matmul_config(torch.float32), range(1, 17))


def test_an_empty_batch_is_an_empty_result(device):
    """M = 0 rows is a batch with no request in it (tests/ops/test_empty_batch.py runs every backend)."""
    out = matmul(torch.randn(0, 8, device=device), torch.randn(8, 3, device=device), backend="triton")
    assert out.shape == (0, 3)
