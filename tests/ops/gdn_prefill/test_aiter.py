"""gdn_prefill `aiter-vk` (AITER's chunk_gated_delta_rule_opt_vk as SGLang's AiterGDNKernel.extend calls it), without AMD hardware.

A test double with the documented signature (aiter_contracts.md 3.7) checks SGLang's call: q and k
L2-normalized before it (use_qk_l2norm_in_kernel=False), float32 log-space g and beta [1, T, HV],
varlen B = 1 with cu_seqlens, the VK pool updated in place at the sequences' slots, the HIP K5
for one sequence only; it runs the recurrence from what it received, so the output and states are
compared with the torch reference.
"""

from __future__ import annotations

import pytest
import torch

from gdn_lab import routing
from gdn_lab.ops import aiter_native, spec
from gdn_lab.ops.batch import BuildOptions, GDNShape
from gdn_lab.ops.delta_rule import recurrent_sequence
from gdn_lab.ops.gdn_prefill import aiter as vk
from gdn_lab.rules import aiter_gdn_prefill_vk
from gdn_lab.rules.base import RuleEnv
from gdn_lab.workloads import alone, build, make_batch, target_request

prefill = spec.get("gdn_prefill")
OP = prefill.name


def chunk_gated_delta_rule_opt_vk(
    q, k, v, o=None, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
    use_qk_l2norm_in_kernel=False, cu_seqlens=None, use_chunk_hip=False, use_chunk_flydsl=False,
    use_prepare_flydsl=False, state_dtype=None, use_exp2=True, num_decodes=0, num_decode_tokens=0,
    seq_lens_cpu=None, prefill_metadata=None, initial_state_indices=None, inplace_final_state=None,
    snapshot_dtype=None,
):  # fmt: skip
    """The documented signature (aiter/ops/triton/gated_delta_net/gated_delta_rule.py, aiter_contracts.md 3.7)."""


def emulate_vk(q, k, v, o, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens,
               initial_state_indices, inplace_final_state, **_):  # fmt: skip
    """The recurrence per sequence from the arguments only (q and k arrive normalized; g is log-space)."""
    cu = cu_seqlens.tolist()
    rep = v.shape[2] // q.shape[2]
    for n, slot in enumerate(initial_state_indices.tolist()):
        s, e = cu[n], cu[n + 1]
        qh = (q[0, s:e].float() * scale).repeat_interleave(rep, dim=1)
        kh = k[0, s:e].float().repeat_interleave(rep, dim=1)
        out, S = recurrent_sequence(qh, kh, v[0, s:e].float(), g[0, s:e], beta[0, s:e], initial_state[slot].float())
        o[0, s:e] = out.to(o.dtype)
        initial_state[slot] = S
    return o, None


def prefill_args(lengths, heads=(1, 2, 32), dtype=torch.float32, seed=0):
    target = target_request(lengths[0], seed)
    batch = (
        make_batch(target, len(lengths), seed=seed, min_len=min(lengths), max_len=max(lengths))
        if len(lengths) > 1
        else alone(target, seed)
    )
    return build(OP, batch, GDNShape(*heads), BuildOptions(dtype=dtype))


@pytest.mark.parametrize("lengths", [[70], [70, 9, 33]], ids=["one-sequence", "three"])
def test_call_is_sglangs_and_the_double_computes_the_reference(kernel_double, lengths):
    args = prefill_args(lengths)
    mine = {**args, "state": args["state"].clone()}
    fake = kernel_double(chunk_gated_delta_rule_opt_vk, emulate_vk)
    out = vk.gdn_prefill_aiter_vk(**mine, kernel=fake)
    c = fake.call
    T, hk, d = args["q"].shape
    hv = args["v"].shape[1]
    assert fake.positional == [0]  # by keyword, as SGLang
    assert c["q"].shape == (1, T, hk, d) and c["v"].shape == (1, T, hv, d) and c["o"].shape == (1, T, hv, d)
    assert c["use_qk_l2norm_in_kernel"] is False
    norms = c["q"].float().pow(2).sum(-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-4)  # normalized before the call
    for name in ("g", "beta"):
        assert c[name].dtype == torch.float32 and c[name].shape == (1, T, hv)
    assert (c["g"] <= 0).all() and ((c["beta"] > 0) & (c["beta"] < 1)).all()  # log-space decay, sigmoid
    assert c["initial_state"] is mine["state"] and c["initial_state_indices"] is mine["slots"]
    assert c["output_final_state"] is True and c["inplace_final_state"] is True
    assert c["cu_seqlens"] is mine["cu_seqlens"] and c["use_exp2"] is True and c["state_dtype"] == torch.float32
    assert c["use_chunk_hip"] is (len(lengths) == 1) and c["use_chunk_flydsl"] is False
    ref_state = args["state"].clone()
    ref = routing.get(OP, "torch").run(**{**args, "state": ref_state})
    assert prefill.tolerance("out", torch.float32, "torch").holds(out, ref)
    slots = args["slots"].long()
    assert prefill.tolerance("state", torch.float32, "torch").holds(mine["state"][slots], ref_state[slots])


def test_the_rule_names_the_k5_switch():
    b = routing.get(OP, "aiter-vk")
    assert b.library.name == "aiter" and b.rule is aiter_gdn_prefill_vk.RULE and not b.auto
    env = RuleEnv("gfx950", 256)
    one, three = prefill_args([70]), prefill_args([70, 9, 33])
    assert (b.rule.predict(one, 0, env).key, b.rule.predict(three, 0, env).key) == ("k5=hip", "k5=triton")
    assert b.rule.expect("k5=hip", "k5=triton") == "switch"


@pytest.mark.skipif(bool(torch.version.hip), reason="off ROCm only")
def test_unavailable_off_rocm():
    avail, _ = routing.get(OP, "aiter-vk").check(prefill_args([10]))
    assert not avail[0] and "ROCm only" in avail[1]


def test_contract(monkeypatch):
    monkeypatch.setattr(aiter_native, "on_device", lambda args, tensor: (True, ""))
    assert vk.covered(prefill_args([5], heads=(2, 4, 128), dtype=torch.bfloat16))[0]
    ok, why = vk.covered(prefill_args([5], heads=(2, 4, 128), dtype=torch.float16))
    assert not ok and "bfloat16" in why
    ok, why = vk.covered(prefill_args([5], heads=(2, 4, 64), dtype=torch.bfloat16))
    assert not ok and "K = V = 128" in why
    padded = prefill_args([5, 3], heads=(2, 4, 128), dtype=torch.bfloat16)
    padded["slots"] = torch.tensor([-1, 0], dtype=torch.int32)
    ok, why = vk.covered(padded)
    assert not ok and "negative slots" in why
