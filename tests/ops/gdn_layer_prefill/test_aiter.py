"""gdn_layer_prefill `aiter-fused` (AITER's fused_gdn_prefill_qkvz behind its own predicate), without AMD hardware.

Two test doubles with the documented signatures (aiter_contracts.md 3.8): the predicate
`fused_gdn_prefill_qkvz_supported`, which records what covered() asks it, and the kernel, which
records the call and computes the unfused chain from the arguments it received, so the adapter's
(normalized, quantized, scales) and both states are compared with the torch chain.
"""

from __future__ import annotations

import pytest
import torch

from gdn_lab import routing
from gdn_lab.ops import spec
from gdn_lab.ops.batch import BuildOptions, GDNShape
from gdn_lab.ops.gdn_layer_prefill import aiter as fused
from gdn_lab.ops.gdn_layer_prefill.reference import gdn_layer_prefill_torch
from gdn_lab.rules import aiter_fused_gdn_prefill
from gdn_lab.rules.base import RuleEnv
from gdn_lab.workloads import build, make_batch, target_request

layer = spec.get("gdn_layer_prefill")
OP = layer.name


def fused_gdn_prefill_qkvz(
    projected_qkvz, projected_ba, conv_state, delta_state, cache_indices, cu_seqlens, has_initial_state,
    conv_weight, conv_bias, a_log, dt_bias, norm_weight, *, scale, eps=1.0e-6,
):  # fmt: skip
    """The documented signature (aiter PR #5606, aiter_contracts.md 3.8)."""


def fused_gdn_prefill_qkvz_supported(
    projected_qkvz, projected_ba, conv_state, delta_state, cache_indices, cu_seqlens, has_initial_state,
    conv_weight, conv_bias, quant_dtype=None, *, a_log=None, dt_bias=None, norm_weight=None,
):  # fmt: skip
    """The documented predicate's signature."""


def emulate_fused(projected_qkvz, projected_ba, conv_state, delta_state, cache_indices, cu_seqlens,
                  has_initial_state, conv_weight, conv_bias, a_log, dt_bias, norm_weight, scale, eps):  # fmt: skip
    """The chain from the kernel's arguments only (heads read from the state and projection widths)."""
    hv, d = delta_state.shape[1], delta_state.shape[-1]
    hk = (projected_qkvz.shape[1] // d - 2 * hv) // 2
    assert scale == d**-0.5  # the query scale (AITER's test reference)
    normalized, quantized, scales = gdn_layer_prefill_torch(
        projected_qkvz, projected_ba, conv_state, delta_state, cache_indices, cu_seqlens, has_initial_state,
        conv_weight, conv_bias, a_log, dt_bias, norm_weight, hk, hv, d, eps, True, torch.float8_e4m3fn,
    )  # fmt: skip
    return normalized, conv_state, delta_state, quantized, scales


def layer_args(lengths=(20, 45), heads=(2, 4, 32), dtype=torch.float32, quantize_fp8=True):
    target = target_request(lengths[0], 0)
    batch = make_batch(target, len(lengths), seed=0, min_len=min(lengths), max_len=max(lengths))
    opts = BuildOptions(dtype=dtype, quantize_fp8=quantize_fp8, fp8_dtype=torch.float8_e4m3fn)
    args = build(OP, batch, GDNShape(*heads), opts)
    args["dt_bias"] = args["dt_bias"].to(torch.bfloat16).float()  # bf16-exact: the adapter's cast changes nothing
    return args


@pytest.mark.parametrize("quantize_fp8", [True, False])
def test_call_and_outputs(kernel_double, quantize_fp8):
    args = layer_args(quantize_fp8=quantize_fp8)
    mine = {**args, "conv_state": args["conv_state"].clone(), "delta_state": args["delta_state"].clone()}
    fake = kernel_double(fused_gdn_prefill_qkvz, emulate_fused)
    normalized, quantized, scales = fused.gdn_layer_prefill_aiter_fused(**mine, kernel=fake)
    c = fake.call
    assert fake.positional == [12] and c["scale"] == 32**-0.5 and c["eps"] == args["eps"]
    assert c["a_log"].dtype == torch.float32 and c["dt_bias"].dtype == torch.bfloat16
    assert c["conv_state"] is mine["conv_state"] and c["delta_state"] is mine["delta_state"]
    ref = {**args, "conv_state": args["conv_state"].clone(), "delta_state": args["delta_state"].clone()}
    r_norm, r_q, r_s = routing.get(OP, "torch").run(**ref)
    assert torch.equal(normalized, r_norm)
    if quantize_fp8:
        assert torch.equal(quantized.view(torch.uint8), r_q.view(torch.uint8)) and torch.equal(scales, r_s)
    else:
        assert quantized is None and scales is None
    slots = args["cache_indices"].long()
    for name in ("conv_state", "delta_state"):
        assert torch.equal(mine[name][slots], ref[name][slots])


def test_covered_asks_aiters_own_predicate(kernel_double):
    args = layer_args(lengths=(1024, 1100), heads=(4, 8, 128), dtype=torch.bfloat16)
    yes = kernel_double(fused_gdn_prefill_qkvz_supported, lambda **kw: (True, ""))
    ok, why = fused.covered(args, predicate=yes)
    c = yes.call
    assert ok and "m1024_3071" in why and yes.positional == [10]
    assert c["quant_dtype"] is torch.float8_e4m3fn and c["dt_bias"].dtype == torch.bfloat16
    assert c["a_log"].dtype == torch.float32 and c["norm_weight"] is args["norm_weight"]
    no = kernel_double(fused_gdn_prefill_qkvz_supported, lambda **kw: (False, "gfx950 only, got gfx942"))
    ok, why = fused.covered(args, predicate=no)
    assert not ok and why == "fused_gdn_prefill_qkvz_supported: gfx950 only, got gfx942"


def test_sglangs_own_checks_come_first(kernel_double):
    never = kernel_double(fused_gdn_prefill_qkvz_supported, lambda **kw: pytest.fail("the predicate was asked"))
    args = layer_args()
    ok, why = fused.covered({**args, "conv_bias": None}, predicate=never)
    assert not ok and "conv bias is required" in why
    ok, why = fused.covered({**args, "fp8_dtype": torch.float8_e4m3fnuz}, predicate=never)
    assert not ok and "float8_e4m3fn only" in why
    ok, why = fused.covered({**args, "cache_indices": torch.tensor([-1, 0], dtype=torch.int32)}, predicate=never)
    assert not ok and "no skip" in why


def test_registered_with_the_schedule_rule():
    b = routing.get(OP, "aiter-fused")
    assert b.library.name == "aiter" and b.rule is aiter_fused_gdn_prefill.RULE and not b.auto
    env = RuleEnv("gfx950", 256)
    # the reference's fact: in the m1024_3071 tile, chunk 64 for 4 sequences, 32 for 5
    four = b.rule.predict(layer_args(lengths=(512,) * 4), 0, env)
    five = b.rule.predict(layer_args(lengths=(410,) * 5), 0, env)
    assert "chunk=64" in four.key and "chunk=32" in five.key and b.rule.expect(four.key, five.key) == "switch"
    assert b.rule.predict(layer_args(lengths=(20, 45)), 0, env).key == "unfused"  # 65 tokens: below 1024


@pytest.mark.skipif(bool(torch.version.hip), reason="off ROCm only")
def test_unavailable_off_rocm():
    avail, _ = routing.get(OP, "aiter-fused").check(layer_args())
    assert not avail[0] and "ROCm only" in avail[1] and "gfx950" in avail[1]
