"""gdn_decode `aiter-flydsl` (AITER's FlyDSL flydsl_gdr_decode as SGLang's adapter calls it), without AMD hardware.

A test double of `flydsl_gdr_decode` with the documented signature (aiter_contracts.md 3.3)
checks the call: [B, 1, H, D] contiguous q/k/v, [B, 1, HV] gates, dt_bias in q's dtype, the VK pool
as it is (need_shuffle_state=False), a preallocated output; it computes the step from what it
received (scale 1/sqrt(K) of its own, negative indices skipped), so the output and state are
compared with the torch reference. The tuned WARP_THREADS_K rule the backend carries is checked
against the reference's facts.
"""

from __future__ import annotations

import pytest
import torch

from gdn_lab import routing
from gdn_lab.ops import aiter_native, spec
from gdn_lab.ops.delta_rule import gates, prepare_qk, step
from gdn_lab.ops.gdn_decode import flydsl
from gdn_lab.rules import flydsl_gdr_decode
from gdn_lab.rules.base import RuleEnv

decode = spec.get("gdn_decode")
OP = decode.name


def flydsl_gdr_decode_stub(
    query, key, value, a, b, dt_bias, A_log, indices, state, out, use_qk_l2norm, need_shuffle_state, stream=None,
    read_indices=None, write_indices=None,
):  # fmt: skip
    """The documented signature (aiter/ops/flydsl/linear_attention_kernels.py, aiter_contracts.md 3.3)."""


def emulate_flydsl(query, key, value, a, b, dt_bias, A_log, indices, state, out, use_qk_l2norm,
                   need_shuffle_state, stream, read_indices, write_indices):  # fmt: skip
    """The step per row from the arguments only; a negative index skips the row (out not written)."""
    scale = query.shape[-1] ** -0.5
    for i, slot in enumerate(indices.tolist()):
        if slot < 0:
            continue
        g, beta = gates(a[i, 0], b[i, 0], A_log, dt_bias)
        qh, kh = prepare_qk(query[i, 0], key[i, 0], value.shape[2], scale, use_qk_l2norm)
        o, state[slot] = step(state[slot].float(), qh, kh, value[i, 0].float(), g, beta)
        out[i, 0] = o.to(out.dtype)


@pytest.mark.parametrize("heads", [(2, 8, 128), (4, 8, 128)])
def test_call_is_sglangs_and_the_double_computes_the_reference(gdn_decode_args, kernel_double, heads):
    args = gdn_decode_args(5, heads=heads)
    args["slots"] = args["slots"].clone()
    args["slots"][2] = -1  # a padded row: FlyDSL skips it, the adapter zeroes its output
    mine = {**args, "state": args["state"].clone()}
    fake = kernel_double(flydsl_gdr_decode_stub, emulate_flydsl)
    out = flydsl.gdn_decode_aiter_flydsl(**mine, kernel=fake)
    c = fake.call
    B, hk, d = args["q"].shape
    hv = args["v"].shape[1]
    assert fake.positional == [10]  # ten positional, then use_qk_l2norm and need_shuffle_state by keyword
    for name, h in (("query", hk), ("key", hk), ("value", hv)):
        assert c[name].shape == (B, 1, h, d) and c[name].is_contiguous() and c[name].dtype == torch.bfloat16
    assert c["a"].shape == (B, 1, hv) and c["b"].shape == (B, 1, hv)
    assert c["dt_bias"].dtype == torch.bfloat16 and c["A_log"].dtype == torch.float32
    assert c["indices"] is mine["slots"] and c["state"] is mine["state"] and c["need_shuffle_state"] is False
    assert c["out"].shape == (B, 1, hv, d) and c["out"].dtype == torch.bfloat16 and c["use_qk_l2norm"] is True
    ref_state = args["state"].clone()
    ref = routing.get(OP, "torch").run(**{**args, "state": ref_state})
    assert decode.tolerance("out", torch.bfloat16, "torch").holds(out, ref)
    assert not out[2].any()
    live = args["slots"][args["slots"] >= 0].long()
    assert decode.tolerance("state", torch.bfloat16, "torch").holds(mine["state"][live], ref_state[live])


def test_the_rule_it_carries_reads_the_tuned_table():
    b = routing.get(OP, "aiter-flydsl")
    assert b.library.name == "flydsl" and b.rule is flydsl_gdr_decode.RULE and not b.auto
    env = RuleEnv("gfx942", 80)

    def key(batch, state_dtype):
        q, v = torch.empty(batch, 4, 128, dtype=torch.bfloat16), torch.empty(batch, 8, 128, dtype=torch.bfloat16)
        args = {"q": q, "v": v, "state": torch.empty(1, 8, 128, 128, dtype=state_dtype)}
        return b.rule.predict(args, 0, env).key

    # the reference's facts: gfx942, bf16 state, (4, 8): WARP_THREADS_K 16 -> 8 -> 4 at batch 1, 2, 4
    assert [key(n, torch.bfloat16) for n in (1, 2, 4)] == ["wtk=16", "wtk=8", "wtk=4"]
    assert [key(n, torch.float32) for n in (1, 2, 4)] == ["wtk=16", "wtk=16", "wtk=8"]  # the fp32-state rows
    assert b.rule.expect("wtk=16", "wtk=8") == "switch" and b.rule.expect("wtk=8", "wtk=8") == "equal"


@pytest.mark.skipif(bool(torch.version.hip), reason="off ROCm only")
def test_unavailable_off_rocm(gdn_decode_args):
    avail, _ = routing.get(OP, "aiter-flydsl").check(gdn_decode_args(2))
    assert not avail[0] and "ROCm only" in avail[1] and "flydsl_gdr_decode" in avail[1]


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setattr(aiter_native, "on_device", lambda args, tensor: (True, ""))


def test_contract(gdn_decode_args, on_gpu):
    ok, why = flydsl.covered(gdn_decode_args(2))
    assert ok and "need_shuffle_state=False" in why
    assert flydsl.covered(gdn_decode_args(2, dtype=torch.float16))[0]
    ok, why = flydsl.covered(gdn_decode_args(2, dtype=torch.float32))
    assert not ok and "bf16 or fp16" in why
    ok, why = flydsl.covered(gdn_decode_args(2, heads=(2, 8, 64)))
    assert not ok and "K = V = 128" in why
    ok, why = flydsl.covered({**gdn_decode_args(2), "scale": 0.1})
    assert not ok and "1/sqrt(K)" in why
