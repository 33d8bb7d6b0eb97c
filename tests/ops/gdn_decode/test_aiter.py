"""gdn_decode `aiter-hip` (AITER's HIP decode as SGLang calls it), without AMD hardware.

A test double of `hip_fused_sigmoid_gating_delta_rule_update` with the documented signature
(aiter_contracts.md 3.4) checks SGLang's keyword call (q/k/v as [1, B, H, D] with cu_seqlens 0..B,
softplus beta 1 and threshold 20, is_kda False, the VK pool updated in place) and computes the step
from what it received, so the adapter's output and state are compared with the torch reference.
"""

from __future__ import annotations

import pytest
import torch

from gdn_lab import aiter, routing
from gdn_lab.ops import aiter_native, spec
from gdn_lab.ops.delta_rule import gates, prepare_qk, step
from gdn_lab.ops.gdn_decode import aiter as hip

decode = spec.get("gdn_decode")
OP = decode.name


def gdn_step(q, k, v, a, b, A_log, dt_bias, S, scale, use_qk_l2norm):
    """One request's step in float32 from a double's arguments: q, k [HK, K]; v [HV, V]; S [HV, V, K]."""
    g, beta = gates(a, b, A_log, dt_bias)
    qh, kh = prepare_qk(q, k, v.shape[0], scale, use_qk_l2norm)
    return step(S.float(), qh, kh, v.float(), g, beta)


def hip_fused_sigmoid_gating_delta_rule_update(
    A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, initial_state_source, initial_state_indices,
    scale=None, use_qk_l2norm_in_kernel=False, cu_seqlens=None, is_kda=False,
):  # fmt: skip
    """The documented signature (aiter/ops/hip/gated_delta_net/hip_gdn_decode.py, aiter_contracts.md 3.4)."""


def emulate_hip(A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, initial_state_source,
                initial_state_indices, scale, use_qk_l2norm_in_kernel, cu_seqlens, is_kda):  # fmt: skip
    """The step for every sequence of SGLang's varlen layout, from the arguments only (dt_bias read as bf16)."""
    o = torch.empty_like(v)
    cu = cu_seqlens.tolist()
    for n, slot in enumerate(initial_state_indices.tolist()):
        for t in range(cu[n], cu[n + 1]):
            o[0, t], S = gdn_step(q[0, t], k[0, t], v[0, t], a[t], b[t], A_log, dt_bias.to(torch.bfloat16),
                                  initial_state_source[slot], scale, use_qk_l2norm_in_kernel)  # fmt: skip
            initial_state_source[slot] = S
    return o


def test_call_is_sglangs_and_the_double_computes_the_reference(gdn_decode_args, kernel_double):
    args = gdn_decode_args(24)
    mine = {**args, "state": args["state"].clone()}
    fake = kernel_double(hip_fused_sigmoid_gating_delta_rule_update, emulate_hip)
    out = hip.gdn_decode_aiter_hip(**mine, kernel=fake)
    c = fake.call
    B, hk, d = args["q"].shape
    assert fake.positional == [0]  # SGLang calls by keyword
    assert c["q"].shape == (1, B, hk, d) and c["v"].shape == (1, B, 8, 128) and c["a"].shape == (B, 8)
    assert c["softplus_beta"] == 1.0 and c["softplus_threshold"] == 20.0 and c["is_kda"] is False
    assert c["cu_seqlens"].dtype == torch.int32 and c["cu_seqlens"].tolist() == list(range(B + 1))
    assert c["initial_state_source"] is mine["state"] and c["initial_state_indices"] is mine["slots"]
    assert c["scale"] == args["scale"] and c["use_qk_l2norm_in_kernel"] is True
    ref_state = args["state"].clone()
    ref = routing.get(OP, "torch").run(**{**args, "state": ref_state})
    assert out.shape == ref.shape and decode.tolerance("out", torch.bfloat16, "torch").holds(out, ref)
    slots = args["slots"].long()
    assert decode.tolerance("state", torch.bfloat16, "torch").holds(mine["state"][slots], ref_state[slots])


def test_sglang_sets_the_sort_cache_off_around_the_call(gdn_decode_args, kernel_double, monkeypatch):
    monkeypatch.delenv("HIP_GDN_SORT_IDX_BS", raising=False)
    seen = []

    def emulate(**kw):
        import os

        seen.append(os.environ.get("HIP_GDN_SORT_IDX_BS"))
        return emulate_hip(**kw)

    hip.gdn_decode_aiter_hip(
        **gdn_decode_args(2), kernel=kernel_double(hip_fused_sigmoid_gating_delta_rule_update, emulate)
    )
    import os

    assert seen == ["0"] and "HIP_GDN_SORT_IDX_BS" not in os.environ


def test_registered_without_a_rule():
    b = routing.get(OP, "aiter-hip")
    assert b.library.name == "aiter" and b.rule is None and not b.auto and b.emulated_arch is None


@pytest.mark.skipif(bool(torch.version.hip), reason="off ROCm only")
def test_unavailable_off_rocm(gdn_decode_args):
    avail, _ = routing.get(OP, "aiter-hip").check(gdn_decode_args(2))
    assert not avail[0] and "ROCm only" in avail[1]
    assert not hip.hip_ready()[0]


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setattr(aiter_native, "on_device", lambda args, tensor: (True, ""))


def test_contract(gdn_decode_args, on_gpu):
    with aiter.emulate("gfx942"):
        assert hip.covered(gdn_decode_args(24))[0]
        assert hip.covered(gdn_decode_args(2, heads=(16, 32, 128)))[0]
        ok, why = hip.covered(gdn_decode_args(2, heads=(4, 8, 128)))
        assert not ok and "(HK, HV) = (4, 8)" in why
        ok, why = hip.covered(gdn_decode_args(2, heads=(2, 8, 64)))
        assert not ok and "K = V = 128" in why
        ok, why = hip.covered(gdn_decode_args(2, dtype=torch.float16))
        assert not ok and "bfloat16" in why
        padded = gdn_decode_args(3)
        padded["slots"] = padded["slots"].clone()
        padded["slots"][1] = -1
        ok, why = hip.covered(padded)
        assert not ok and "padding" in why
    ok, why = hip.covered(gdn_decode_args(2))  # gfx950: the extension is built for gfx942 by default
    assert not ok and "gfx950" in why and "AITER_HIP_GDN_ARCH" in why
