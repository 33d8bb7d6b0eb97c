"""fused_moe `aiter-triton-moe`: AITER's Triton MoE GEMM (amd-aiter wheel) run for real under the interpreter.

A test double with AITER's documented `fused_moe` signature checks what the adapter hands over (the
slots aligned to the config's BLOCK_SIZE_M, w1 then w2, the routing weights on the second GEMM only,
top_k 1 over the slots) and computes the documented result, so wrong marshalling gives a wrong
answer against the reference. The real kernel runs told gfx950 and gfx942, fp16. The rule's switch
(BLOCK_SIZE_K 64 -> 128 where a launch reaches 256 tokens) is shown in the interpreter only: the
first tokens of a batch keep their slots' places in their experts' blocks in any longer batch, so
their rows are the same tiles' rows on both sides.
"""

from __future__ import annotations

import pytest
import torch

from gdn_lab import aiter, routing
from gdn_lab.ops import fused_moe, spec
from gdn_lab.ops.batch import Batch, BuildOptions, MoEShape, Request
from gdn_lab.ops.fused_moe import aiter_triton, build
from gdn_lab.rules import aiter_triton_moe
from gdn_lab.rules.base import RuleEnv

pytestmark = pytest.mark.skipif(not aiter.probe().installed, reason="amd-aiter is not installed")

BACKEND = "aiter-triton-moe"
SHAPE = MoEShape(hidden=128, num_experts=8, top_k=3, intermediate=64)  # K = 128: two 64-wide slices or one 128


def _args(device, tokens, dtype=torch.float16, shape=SHAPE):
    return build(Batch((Request(tokens, 1),), 0, 0), shape, BuildOptions(dtype=dtype, device=device))


def _first(a, n):
    return {**a, "x": a["x"][:n], "topk_weights": a["topk_weights"][:n], "topk_ids": a["topk_ids"][:n]}


def fused_moe_documented(A, B, C, A_scale, B_scale, B_zp, topk_weights, topk_ids, sorted_token_ids, expert_ids,
                         num_tokens_post_padded, mul_routed_weight, top_k, compute_type, use_fp8_w8a8,
                         use_int8_w8a16, use_int4_w4a16, block_shape=None, config=None):  # fmt: skip
    """AITER's signature (aiter/ops/triton/moe_op.py::fused_moe, 0.1.7)."""


def _emulate(A, B, C, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded, mul_routed_weight, top_k,
             config, **_):  # fmt: skip
    """The documented result: for each valid slot s of an expert's block, C[s] = (A[s // top_k] @ B[e]^T)
    (times topk_weights[s] when asked) in float32, rounded to C's dtype."""
    numel, bm = topk_weights.numel(), config["BLOCK_SIZE_M"]
    rows = C.view(numel, C.shape[-1])
    weights = topk_weights.reshape(-1)
    for b in range(int(num_tokens_post_padded) // bm):
        e = int(expert_ids[b])
        for s in sorted_token_ids[b * bm : (b + 1) * bm].tolist():
            if s < numel:
                y = A[s // top_k].float() @ B[e].float().t()
                rows[s] = (y * weights[s] if mul_routed_weight else y).to(C.dtype)


def test_what_aiter_is_handed(kernel_double, device):
    a = _args(device, 20)
    fake = kernel_double(fused_moe_documented, _emulate)
    out = aiter_triton.fused_moe_aiter_triton(**a, kernel=fake)
    first, second = fake.calls
    cfg = aiter_triton_moe.get_config(20, aiter.effective_arch(device), torch.float16)
    for c in (first, second):
        assert c["config"] == cfg.config and c["topk_ids"] is a["topk_ids"] and c["topk_weights"] is a["topk_weights"]
        assert c["A_scale"] is None and c["B_scale"] is None and not (c["use_fp8_w8a8"] or c["use_int8_w8a16"])
    assert first["A"] is a["x"] and first["B"] is a["w1"] and first["C"].shape == (20, 3, 128)
    assert (first["mul_routed_weight"], first["top_k"]) == (False, 3)
    assert second["B"] is a["w2"] and second["A"].shape == (60, 64) and second["C"].shape == (20, 3, 128)
    assert (second["mul_routed_weight"], second["top_k"]) == (True, 1)
    tol = spec.get("fused_moe").tolerance("out", torch.float16)
    ref = fused_moe(**a, backend="torch")
    assert tol.holds(out, ref), tol.measure(out, ref)


def test_align_block_size_keeps_vllms_contract(device):
    ids = torch.tensor([[2, 0, 5], [5, 2, 1], [0, 5, 3]], dtype=torch.int32, device=device)
    sorted_ids, expert_ids, padded = aiter_triton.align_block_size(ids, 6, 4)
    numel, bound = 9, 9 + 6 * 3
    assert sorted_ids.shape == (bound,) and int(padded) == 20  # experts 0, 1, 2, 3, 5: 2, 1, 2, 1, 3 slots -> 5 blocks
    got = sorted_ids.tolist()
    assert got[:20] == [1, 6, numel, numel, 5, numel, numel, numel, 0, 4, numel, numel, 8, numel, numel, numel,
                        2, 3, 7, numel]  # fmt: skip
    assert set(got[20:]) == {numel}
    assert expert_ids.tolist()[:5] == [0, 1, 2, 3, 5] and set(expert_ids.tolist()[5:]) == {-1}


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
def test_matches_the_reference(device, arch):
    a = _args(device, 40)
    with aiter.emulate(arch):
        out = fused_moe(**a, backend=BACKEND)
    ref = fused_moe(**a, backend="torch")
    tol = spec.get("fused_moe").tolerance("out", a["x"].dtype)
    assert out.dtype == a["x"].dtype and tol.holds(out, ref), tol.measure(out, ref)


def test_the_config_switch_at_256_tokens_shows_in_the_bits(device):
    assert aiter_triton_moe.switch_points("gfx950", torch.float16, 2048) == [256, 1024]
    if device.type != "cpu":
        pytest.skip(
            "an interpreter claim: there each BLOCK_SIZE_K slice is a dot of its own, added to the accumulator; "
            "compiled, the dots may chain into one accumulation (AITER's gemm_a16w16 kept every bit at its "
            "BLOCK_SIZE_K switch on the H200); not yet run on AMD hardware"
        )
    a = _args(device, 256)
    rule, env = routing.get("fused_moe", BACKEND).rule, RuleEnv("gfx950", 256)
    with aiter.emulate("gfx950"):
        out = {m: fused_moe(**_first(a, m), backend=BACKEND) for m in (64, 255, 256)}
        keys = {m: rule.predict(_first(a, m), 0, env).key for m in out}
    assert keys[64] == keys[255] == "bk64/mfma16/kpack1" and keys[256] == "bk128/mfma16/kpack1"
    assert rule.expect(keys[64], keys[255]) == "equal" and torch.equal(out[64], out[255][:64])
    assert rule.expect(keys[255], keys[256]) == "switch"
    assert (out[255] != out[256][:255]).sum().item() > 0, "predicted switch (BLOCK_SIZE_K 64 -> 128) kept every bit"


def test_registered_with_the_moe_rule(device):
    b = routing.get("fused_moe", BACKEND)
    assert b.library.name == "aiter-triton" and b.rule is aiter_triton_moe.RULE and not b.auto
    assert b.emulated_arch is not None and b.available()[0]
    ok, why = b.covered(_args(device, 3))
    assert ok and "small_M for M=3" in why
    ok, why = b.covered(_args(device, 3, torch.float32))
    assert not ok and "fp16 or bf16" in why


def test_bf16_is_refused_under_the_interpreter(device):
    if device.type != "cpu":
        pytest.skip("CPU interpreter only")
    ok, why = aiter_triton.covered(_args(device, 2, torch.bfloat16))
    assert not ok and "interpreter" in why
