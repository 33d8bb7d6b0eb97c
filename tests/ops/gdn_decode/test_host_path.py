"""The eager path's shortcuts keep full validation: a cheaper signature key, slot values checked once
per (tensor, version, pointer), the cached routing order, the Triton wrapper's config checked once
per config, and the cached compiled-kernel launch."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from gdn_lab import routing
from gdn_lab.ops import gdn_decode as gdn_decode_fn
from gdn_lab.ops import spec

SPEC = spec.get("gdn_decode")
gdn_module = __import__("gdn_lab.ops.gdn_decode", fromlist=["validate"])


def _case(B=3, hk=1, hv=2, d=16, slots=(0, 2, -1), device="cpu"):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    return {
        "q": r(B, hk, d), "k": r(B, hk, d), "v": r(B, hv, d), "a": r(B, hv), "b": r(B, hv),
        "A_log": r(hv), "dt_bias": r(hv), "state": torch.zeros(4, hv, d, d, device=device),
        "slots": torch.tensor(slots, dtype=torch.int32, device=device),
    }  # fmt: skip


def test_slot_values_checked_once_per_version(monkeypatch):
    case = _case()
    calls = []
    real = gdn_module.check_slot_values
    monkeypatch.setattr(gdn_module, "check_slot_values", lambda s, n: calls.append(1) or real(s, n))
    gdn_module.forget_checked_slots()
    for _ in range(3):
        SPEC.validate(**case)
    assert len(calls) == 1, "the same unchanged slots tensor is checked once"
    case["slots"][1] = 0  # an in-place write moves the version counter: checked again, and caught
    with pytest.raises(ValueError, match="distinct"):
        SPEC.validate(**case)
    case["slots"][1] = 7
    with pytest.raises(ValueError, match="points outside"):
        SPEC.validate(**case)
    case["slots"][1] = 3
    SPEC.validate(**case)
    # Another tensor with the same values (even at a recycled address) is checked again.
    n = len(calls)
    SPEC.validate(**dict(case, slots=case["slots"].clone()))
    assert len(calls) == n + 1
    # A smaller pool: checked again.
    with pytest.raises(ValueError, match="points outside"):
        SPEC.validate(**dict(case, state=torch.zeros(2, 2, 16, 16)))
    # Writes torch cannot see: forget_checked_slots() makes the next call check again.
    gdn_module.forget_checked_slots()
    SPEC.validate(**case)
    assert len(calls) == n + 3


def test_inference_tensors_have_their_slot_values_checked_at_every_call():
    # An inference tensor keeps no version counter, so nothing shows its values unchanged.
    with torch.inference_mode():
        case = {k: v.clone() for k, v in _case().items()}
        for _ in range(2):
            SPEC.validate(**case)
        case["slots"][1] = 0
        with pytest.raises(ValueError, match="distinct"):
            SPEC.validate(**case)
        case["slots"][1] = 2
        out = gdn_decode_fn(**case, backend="torch")
    want = _case()
    assert torch.equal(out, gdn_decode_fn(**want, backend="torch"))
    assert torch.equal(case["state"], want["state"])


def test_signature_key_rejects_what_the_checks_reject():
    case = _case()
    SPEC.validate(**case)  # accepted: its key is memoised
    bad = [
        dict(case, k=case["k"].double()),  # dtype
        dict(case, v=case["v"][:, :1]),  # shape
        dict(case, a=case["a"].tolist()),  # not a tensor
        dict(case, state=case["state"].half()),
    ]
    for args in bad:
        with pytest.raises(ValueError):
            SPEC.validate(**args)
    with pytest.raises(ValueError, match="use_qk_l2norm"):
        SPEC.validate(**case, use_qk_l2norm=1)  # 1 == True, but not a bool
    with pytest.raises(ValueError, match="scale"):
        SPEC.validate(**case, scale=-1.0)
    assert gdn_module._signature(*case.values(), None, True) != gdn_module._signature(*case.values(), None, 1)
    # An unhashable scale cannot be looked up: the full checks run and name it.
    with pytest.raises(ValueError, match=r"scale: expected a positive finite float or None .*got \[0\.5\]"):
        SPEC.validate(**case, scale=[0.5])


def test_alternating_signatures_each_get_their_own_scale():
    # The last accepted signature is compared first: two that alternate must never swap scales.
    small, large = _case(d=16), _case(d=64)
    for _ in range(3):
        assert SPEC.validate(**small)["scale"] == 16**-0.5
        assert SPEC.validate(**large)["scale"] == 64**-0.5
        assert SPEC.validate(**large, scale=0.25)["scale"] == 0.25


def test_routing_order_follows_registry_changes():
    op = "gdn_decode"
    first = routing.decide(op, SPEC.validate(**_case()), "auto")
    extra = routing.Backend(op, "test-first", lambda **kw: "ran", library=routing.LIBRARY_TORCH, priority=0)
    routing._REGISTRY[op][extra.name] = extra  # as tests that patch the registry do
    try:
        assert routing.decide(op, SPEC.validate(**_case()), "auto").name == "test-first"
    finally:
        routing._REGISTRY[op].pop(extra.name)
    assert routing.decide(op, SPEC.validate(**_case()), "auto").name == first.name


def test_auto_order_follows_a_backend_replaced_under_its_name(monkeypatch):
    """The same names, one replaced by an explicit-only copy: auto skips it and says why."""
    op = "gdn_decode"
    args = SPEC.validate(**_case())
    first = routing.decide(op, args, "auto")
    monkeypatch.setitem(routing._REGISTRY[op], first.name, dataclasses.replace(first.backend, auto=False))
    replaced = routing.decide(op, args, "auto")
    assert replaced.name != first.name
    assert replaced.rejected[first.name] == "runs only when named (not in the auto order)"
    monkeypatch.undo()
    assert routing.decide(op, args, "auto").name == first.name


def test_wrapper_config_checked_as_before_once_cached(device):
    """The config cache keys on types: k_split=True equals 1, but only 1 passes; unhashable values
    reach the checks too."""
    from gdn_lab.ops.gdn_decode.triton_kernels import gdn_decode_triton

    args = SPEC.validate(**_case(device=device))  # the kernel runs once: on the session's device
    gdn_decode_triton(**args, k_split=1)  # cached
    for bad in (True, 1.0, [1], 32):
        expected = rf"k_split: expected a power of two in \[1, 16\] .*got {re.escape(repr(bad))}$"
        with pytest.raises(ValueError, match=expected):
            gdn_decode_triton(**args, k_split=bad)
    with pytest.raises(ValueError, match=r"block_v: expected a power of two in \[1, 1024\] .*got \[8\]"):
        gdn_decode_triton(**args, block_v=[8])


def test_public_path_result_unchanged_by_the_shortcuts(device):
    """Two steps through the public path (the second with memoised checks) match the reference."""
    from gdn_lab.ops.gdn_decode.reference import gdn_decode_torch

    case, ref_case = _case(device=device), _case(device=device)
    for _ in range(2):
        out = gdn_decode_fn(**case, backend="triton")
        ref = gdn_decode_torch(**SPEC.validate(**ref_case))
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(case["state"], ref_case["state"], atol=2e-5, rtol=1e-4)
