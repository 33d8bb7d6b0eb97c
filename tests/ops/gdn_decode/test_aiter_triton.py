"""gdn_decode `aiter-triton` (AITER's Triton fused_sigmoid_gating_delta_rule_update), with a test double and, where it imports, for real.

The double has the documented signature (aiter_contracts.md 3.5) and reads the state in the
kernel's hard-coded "KV" layout [slots, HV, K, V]: it asserts that what it receives is the lab's
VK pool transposed, computes the step (a negative index: a zero state, no write-back), and the
adapter's output and VK state are compared with the torch reference. The amd-aiter 0.1.7 wheel
has no GDN kernels, so the real kernel runs only with an aiter built from source.
"""

from __future__ import annotations

import pytest
import torch

from gdn_lab import aiter, routing
from gdn_lab.ops import spec
from gdn_lab.ops.delta_rule import gates, prepare_qk, step
from gdn_lab.ops.gdn_decode import aiter_triton

decode = spec.get("gdn_decode")
OP = decode.name


def fused_sigmoid_gating_delta_rule_update(
    A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, initial_state_source, initial_state_indices,
    scale=None, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
):  # fmt: skip
    """The documented signature (aiter_contracts.md 3.5)."""


def emulate_triton(A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, initial_state_source,
                   initial_state_indices, scale, use_qk_l2norm_in_kernel, cu_seqlens):  # fmt: skip
    """The kernel's step over SGLang's varlen layout with a KV state [N, HV, K, V], from its arguments only."""
    o = q.new_empty((1, *v.shape))
    cu = cu_seqlens.tolist()
    for n, slot in enumerate(initial_state_indices.tolist()):
        S = (
            initial_state_source[slot].transpose(-1, -2)
            if slot >= 0
            else torch.zeros(v.shape[2], v.shape[3], q.shape[3])
        )
        for t in range(cu[n], cu[n + 1]):
            g, beta = gates(a[t], b[t], A_log, dt_bias)
            qh, kh = prepare_qk(q[0, t], k[0, t], v.shape[2], scale, use_qk_l2norm_in_kernel)
            out, S = step(S.float(), qh, kh, v[0, t].float(), g, beta)
            o[0, 0, t] = out.to(o.dtype)
        if slot >= 0:
            initial_state_source[slot] = S.transpose(-1, -2)
    return o.squeeze(0)


def test_layouts_are_converted_explicitly(gdn_decode_args, kernel_double):
    args = gdn_decode_args(4, heads=(2, 4, 32), dtype=torch.float32)
    args["slots"] = args["slots"].clone()
    args["slots"][1] = -1
    mine = {**args, "state": args["state"].clone()}
    before = mine["state"].clone()
    fake = kernel_double(fused_sigmoid_gating_delta_rule_update, emulate_triton)
    out = aiter_triton.gdn_decode_aiter_triton(**mine, kernel=fake)
    c = fake.call
    assert fake.positional == [0]
    kv = c["initial_state_source"]
    assert kv.shape == (before.shape[0], 4, 32, 32) and kv.is_contiguous()
    assert kv.data_ptr() != mine["state"].data_ptr()  # a converted copy, not the lab's pool
    assert c["q"].shape == (1, 4, 2, 32) and c["v"].shape == (1, 4, 4, 32) and c["a"].shape == (4, 4)
    assert c["cu_seqlens"].tolist() == [0, 1, 2, 3, 4] and c["softplus_beta"] == 1.0 and c["softplus_threshold"] == 20.0
    ref_state = args["state"].clone()
    ref = routing.get(OP, "torch").run(**{**args, "state": ref_state})
    assert decode.tolerance("out", torch.float32, "torch").holds(out, ref) and not out[1].any()
    slots = args["slots"]
    live = slots[slots >= 0].long()
    assert decode.tolerance("state", torch.float32, "torch").holds(mine["state"][live], ref_state[live])
    untouched = torch.ones(before.shape[0], dtype=torch.bool)
    untouched[live] = False
    assert torch.equal(mine["state"][untouched].nan_to_num(3.0), before[untouched].nan_to_num(3.0))


def test_registered_as_a_portable_triton_backend():
    b = routing.get(OP, "aiter-triton")
    assert b.library.name == "aiter-triton" and b.library.amd and b.rule is None and not b.auto
    assert b.emulated_arch is not None


def test_availability_says_why(gdn_decode_args, device):
    ok, why = routing.get(OP, "aiter-triton").available()
    if not aiter.probe().installed:
        assert not ok and "not installed" in why
    elif not ok:
        assert "does not import here" in why  # amd-aiter 0.1.7 ships no gated_delta_rule kernels


def test_the_real_kernel_where_it_imports(gdn_decode_args, device):
    ok, why = aiter.kernel_available(aiter_triton.KERNEL, device)
    if not ok:
        pytest.skip(f"AITER's Triton GDN decode is unavailable here: {why}")
    args = gdn_decode_args(3, heads=(2, 4, 32), dtype=torch.float32)
    args = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    mine = {**args, "state": args["state"].clone()}
    out = routing.route(OP, mine, "aiter-triton").backend.run(**mine)
    ref_state = args["state"].clone()
    ref = routing.get(OP, "torch").run(**{**args, "state": ref_state})
    assert decode.tolerance("out", torch.float32, "torch").holds(out, ref)
