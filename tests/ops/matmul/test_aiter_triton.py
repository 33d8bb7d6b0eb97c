"""matmul `aiter-triton-gemm`: AITER's Triton gemm_a16w16 (amd-aiter wheel) run for real, under the interpreter on the CPU.

AITER is told it runs on gfx950 (its MI350X tables) or gfx942 (MI300X). Against the float64
reference in fp32 and fp16 (bf16 is refused under the interpreter). The config switch by M is
shown with the rule: M picked on both sides of a numerics switch that `switch_points` names (the
first M rows are the same inputs, so the rows of M - 1 must change bits there) and at two M that
launch the same config (bits kept). Under the interpreter a change of tile alone (BLOCK_SIZE_M) can
move bits too, which the rule does not predict: numpy's matmul behind tl.dot may sum by tile shape,
depending on the CPU's BLAS kernels (the test computes which). A test
double checks the layout AITER is given: w as [N, K] (Y = X @ W^T), contiguous.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_lab import aiter, routing
from gdn_lab.ops import matmul
from gdn_lab.ops.matmul import aiter_triton
from gdn_lab.rules import aiter_gemm_a16w16
from gdn_lab.rules.base import RuleEnv

pytestmark = pytest.mark.skipif(not aiter.probe().installed, reason="amd-aiter is not installed")

OP, BACKEND = "matmul", "aiter-triton-gemm"
N, K = 64, 256  # a small shape of the default MI350X table: numerics switch at M = 129 (BLOCK_SIZE_K 256 -> 128)
TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-3, 2e-3)}


def inputs(m, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, K, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(K, N, generator=g) * K**-0.5).to(device=device, dtype=dtype)
    return x, w


def gemm_a16w16(x, w, bias=None, dtype=torch.bfloat16, y=None, config=None, activation=None, skip_reduce=False):
    """The documented signature (aiter/ops/triton/gemm_a16w16.py: Y = X @ W^T, w [N, K])."""


def test_the_layout_aiter_gets(kernel_double):
    x, w = inputs(5, torch.float32, "cpu")
    fake = kernel_double(gemm_a16w16, lambda x, w, dtype, **_: (x.double() @ w.double().t()).to(dtype))
    out = aiter_triton.matmul_aiter_triton(x, w, kernel=fake)
    c = fake.call
    assert c["w"].shape == (N, K) and c["w"].stride() == (K, 1) and torch.equal(c["w"], w.t())
    assert c["x"] is x and c["dtype"] == torch.float32 and c["config"] is None and c["bias"] is None
    assert c["y"] is None and c["activation"] is None and c["skip_reduce"] is False
    assert torch.allclose(out, x @ w, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
def test_matches_the_reference(device, dtype, arch):
    x, w = inputs(33, dtype, device)
    with aiter.emulate(arch):
        out = matmul(x, w, backend=BACKEND)
    ref = matmul(x, w, backend="torch")
    atol, rtol = TOL[dtype]
    assert out.dtype == dtype and out.shape == (33, N)
    assert torch.allclose(out.double(), ref.double(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_the_config_switch_by_m_shows_in_the_bits(device, dtype):
    numerics = aiter_gemm_a16w16.switch_points(N, K, "gfx950", 300, numerics_only=True)
    configs = aiter_gemm_a16w16.switch_points(N, K, "gfx950", 300)
    assert numerics == [129, 257] and configs == [65, 129, 257]
    if device.type != "cpu":
        pytest.skip(
            "not a GPU claim: on the H200 (2026-12-01) the MI350X configs for M <= 128 need 256 KiB of shared "
            "memory and do not launch, and the BLOCK_SIZE_K 128 -> 64 switch at M = 257 kept every bit in fp16, "
            "bf16 and fp32 (the MMA accumulates K in order whatever the block); not yet run on AMD hardware"
        )
    s, t = numerics[0], configs[0]  # 129: BLOCK_SIZE_K 256 -> 128; 65: BLOCK_SIZE_M 64 -> 128 only
    x, w = inputs(s, dtype, device)
    env = RuleEnv("gfx950", 256)
    rule = routing.get(OP, BACKEND).rule
    with aiter.emulate("gfx950"):
        out = {m: matmul(x[:m], w, backend=BACKEND) for m in (t, s - 1, s)}
        predicted = {m: rule.predict({"x": x[:m], "w": w}, 0, env) for m in out}
    # t and s - 1 launch the same config: the first t rows keep their bits, as the rule predicts
    assert predicted[t].variant == predicted[s - 1].variant and torch.equal(out[t], out[s - 1][:t])
    # s - 1 -> s switches BLOCK_SIZE_K: predicted, and the rows change bits
    assert rule.expect(predicted[s - 1].key, predicted[s].key) == "switch"
    assert (out[s - 1] != out[s][: s - 1]).sum().item() > 0, "predicted switch (BLOCK_SIZE_K) kept every bit"


def _numpy_tile_moves_bits(x: torch.Tensor, w: torch.Tensor, rows: int, bm: int, bn: int) -> bool:
    """Whether numpy's matmul (what the interpreter's tl.dot runs) gives the first `rows` rows of
    x @ w other bits in a [bm, K] tile, zero-padded as the kernel's masked loads pad it, than in a
    tile of those rows alone. It depends on the machine's BLAS: OpenBLAS picks its kernels per CPU."""
    xt, wt = x.numpy(), w.numpy()
    b = np.zeros((wt.shape[0], bn), dtype=np.float32)
    b[:, : wt.shape[1]] = wt
    a = np.zeros((bm, xt.shape[1]), dtype=np.float32)
    a[: x.shape[0]] = xt
    return not np.array_equal(xt[:rows] @ b, (a @ b)[:rows])


def test_a_tile_change_alone_moves_bits_exactly_when_numpy_does(device):
    """BLOCK_SIZE_M 64 -> 128 at M = 65 keeps the rule's numerics key (the hardware sums each element
    by BLOCK_SIZE_K steps whatever the tile), but the interpreter computes tl.dot with numpy, whose
    matmul may sum a [BM, BK] x [BK, BN] tile in a BM-dependent order: on the CPU the tile moves the
    kernel's bits exactly when numpy's matmul of the same tiles moves them (on some CPUs it does, on
    others not: the comparison is computed here, never assumed)."""
    if device.type != "cpu":
        pytest.skip("an interpreter artifact; not asserted on GPUs (not yet measured there)")
    x, w = inputs(65, torch.float32, device)
    rule, env = routing.get(OP, BACKEND).rule, RuleEnv("gfx950", 256)
    with aiter.emulate("gfx950"):
        a, b = matmul(x[:64], w, backend=BACKEND), matmul(x, w, backend=BACKEND)
        predicted = [rule.predict({"x": x[:m], "w": w}, 0, env) for m in (64, 65)]
    assert predicted[0].key == predicted[1].key
    assert [p.variant.split("xBK")[0] for p in predicted] == ["BM64xBN128", "BM128xBN128"]
    # K = BLOCK_SIZE_K = 256: one tile per output block, so the kernel's bits are numpy's
    assert torch.equal(a, b[:64]) != _numpy_tile_moves_bits(x, w, 64, bm=128, bn=128)


def test_registered_with_the_gemm_rule(device):
    b = routing.get(OP, BACKEND)
    assert b.library.name == "aiter-triton" and b.rule is aiter_gemm_a16w16.RULE and not b.auto
    assert b.emulated_arch is not None and b.available()[0]
    ok, why = b.covered(matmul.__globals__["validate"](*inputs(3, torch.float32, device)))
    assert ok and "M_LEQ_" in why and "fp32: outside AITER's 16-bit contract" in why


def test_bf16_is_refused_under_the_interpreter():
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter only")
    ok, why = aiter_triton.covered(
        {"x": torch.zeros(2, K, dtype=torch.bfloat16), "w": torch.zeros(K, N, dtype=torch.bfloat16)}
    )
    assert not ok and "interpreter" in why
