"""fused_moe `aiter` (AITER's own MoE as vLLM and SGLang call it on ROCm), without AMD hardware.

A test double of `aiter.fused_moe.fused_moe` with the documented signature (aiter_contracts.md 8)
undoes the (16, 16) weight shuffle with a permutation read off AITER's own `shuffle_weight` applied
to element indices, then computes the op's reference from what it received, so a wrong or missing
shuffle, swapped weights or misplaced routing give a wrong answer.
"""

from __future__ import annotations

import pytest
import torch

from gdn_lab import aiter, routing
from gdn_lab.ops import aiter_native
from gdn_lab.ops.batch import Batch, BuildOptions, MoEShape, Request
from gdn_lab.ops.fused_moe import aiter as ck
from gdn_lab.ops.fused_moe import build
from gdn_lab.ops.fused_moe.reference import fused_moe_torch

pytestmark = pytest.mark.skipif(not aiter.probe().installed, reason="amd-aiter is not installed")

OP = "fused_moe"
SHAPE = MoEShape(hidden=64, num_experts=4, top_k=3, intermediate=32)  # w1 [4, 64, 64], w2 [4, 64, 32]


def _args(device, dtype=torch.bfloat16, shape=SHAPE, lengths=(5, 3)):
    batch = Batch(tuple(Request(n, i) for i, n in enumerate(lengths)), 0, 0)
    return build(batch, shape, BuildOptions(dtype=dtype, device=device))


def fused_moe_documented(hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None, activation="Silu",
                         quant_type="No", doweight_stage1=False, w1_scale=None, w2_scale=None, a1_scale=None,
                         a2_scale=None, block_size_M=None, num_local_tokens=None, moe_sorting_dispatch_policy=0,
                         dtype=None, hidden_pad=0, intermediate_pad=0, bias1=None, bias2=None):  # fmt: skip
    """AITER's signature (aiter/fused_moe.py::fused_moe, 0.1.7); its enum defaults as names."""


def _unshuffled(w: torch.Tensor) -> torch.Tensor:
    """The weights before AITER's (16, 16) shuffle: where each element came from, read off
    `shuffle_weight` applied to its indices (a 2-byte type, as bf16, so the same tiles)."""
    e, r, c = w.shape
    index = torch.arange(r * c, dtype=torch.int16).view(1, r, c).expand(e, r, c).contiguous()
    source = aiter.load("shuffle").shuffle_weight(index, (16, 16)).reshape(e, -1).long()
    out = torch.empty_like(w).reshape(e, -1)
    out.scatter_(1, source.to(w.device), w.reshape(e, -1))
    return out.view(e, r, c)


def _emulate(hidden_states, w1, w2, topk_weight, topk_ids, **_):
    assert getattr(w1, "is_shuffled", False) and getattr(w2, "is_shuffled", False)
    return fused_moe_torch(hidden_states, _unshuffled(w1), _unshuffled(w2), topk_weight, topk_ids)


def test_call_is_vllms_and_the_double_computes_the_reference(kernel_double, device):
    a = _args(device)
    fake = kernel_double(fused_moe_documented, _emulate)
    out = ck.fused_moe_aiter(**a, kernel=fake)
    c = fake.call
    assert fake.positional == [5]  # the five tensors, AITER's defaults for the rest
    assert c["hidden_states"] is a["x"] and c["topk_weight"] is a["topk_weights"] and c["topk_ids"] is a["topk_ids"]
    assert c["activation"] == "Silu" and c["quant_type"] == "No" and c["expert_mask"] is None
    assert not torch.equal(c["w1"], a["w1"])  # shuffled, not the weights as given
    assert torch.equal(out, fused_moe_torch(**a))


def test_weights_are_shuffled_once_until_they_change(kernel_double, device):
    a = _args(device)
    fake = kernel_double(fused_moe_documented, _emulate)
    ck.fused_moe_aiter(**a, kernel=fake)
    ck.fused_moe_aiter(**a, kernel=fake)
    first, second = fake.calls
    assert second["w1"] is first["w1"] and second["w2"] is first["w2"]
    a["w1"].mul_(2)  # an in-place write moves the version counter
    out = ck.fused_moe_aiter(**a, kernel=fake)
    third = fake.calls[-1]
    assert third["w1"] is not first["w1"] and third["w2"] is first["w2"]
    assert torch.equal(out, fused_moe_torch(**a))


def test_inference_tensors_are_shuffled_at_every_call(kernel_double, device):
    with torch.inference_mode():
        a = _args(device)
        fake = kernel_double(fused_moe_documented, _emulate)
        outs = [ck.fused_moe_aiter(**a, kernel=fake) for _ in range(2)]
    assert fake.calls[0]["w1"] is not fake.calls[1]["w1"]
    assert all(torch.equal(out, fused_moe_torch(**a)) for out in outs)


def test_registered_not_reproducible_and_without_a_rule():
    b = routing.get(OP, "aiter")
    assert b.library.name == "aiter" and b.rule is None and not b.auto and not b.reproducible
    assert b.emulated_arch is None


@pytest.mark.skipif(bool(torch.version.hip), reason="off ROCm only")
def test_unavailable_off_rocm(device):
    avail, _ = routing.get(OP, "aiter").check(_args(device))
    assert not avail[0] and "ROCm only" in avail[1]


def test_contract(device, monkeypatch):
    monkeypatch.setattr(aiter_native, "on_device", lambda args, tensor: (True, ""))
    assert ck.covered(_args(device))[0]
    assert ck.covered(_args(device, torch.float16))[0]
    ok, why = ck.covered(_args(device, torch.float32))
    assert not ok and "float32" in why
    ok, why = ck.covered(_args(device, shape=MoEShape(hidden=64, num_experts=4, top_k=3, intermediate=24)))
    assert not ok and "multiples of 32" in why and "(4, 48, 64)" in why
