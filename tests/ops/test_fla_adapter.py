"""The fla backends on the test device (a GPU, or fused_recurrent under the CPU interpreter) against the
torch reference; availability.

fla-core is an optional dependency (the `gpu` extra). The tests that run fla skip when it is not
installed; its chunk op needs a GPU (it fails under TRITON_INTERPRET), so the `fla` prefill
backend is checked here only for its reason.
"""

import importlib.util

import pytest
import torch

from gdn_lab import routing
from gdn_lab.ops import fla_support as fla_backends
from gdn_lab.ops import gdn_decode, gdn_prefill

HAS_FLA = importlib.util.find_spec("fla") is not None
needs_fla = pytest.mark.skipif(not HAS_FLA, reason="fla-core is not installed (pip install 'fla-core>=0.6.0')")

STATE_TOL = {"atol": 2e-5, "rtol": 1e-4}
OUT_TOL = {torch.float32: {"atol": 2e-5, "rtol": 1e-4}, torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2}}


def rnd(g, *shape):
    return torch.randn(*shape, generator=g)


def on(device, case):
    return {k: v.to(device) for k, v in case.items()}


def decode_case(B, hk, hv, d, dtype, device, seed=0, pad=()):
    g = torch.Generator().manual_seed(seed)
    state = 0.1 * rnd(g, B + 1, hv, d, d)
    state[B] = float("nan")  # nobody's slot
    slots = torch.randperm(B, generator=g).to(torch.int32)
    for i in pad:
        slots[i] = -1
    return on(device, {
        "q": rnd(g, B, hk, d).to(dtype),
        "k": rnd(g, B, hk, d).to(dtype),
        "v": rnd(g, B, hv, d).to(dtype),
        "a": rnd(g, B, hv).to(dtype),
        "b": rnd(g, B, hv).to(dtype),
        "A_log": 0.5 * rnd(g, hv),
        "dt_bias": 0.5 * rnd(g, hv),
        "state": state,
        "slots": slots,
    })  # fmt: skip


def prefill_case(lengths, hk, hv, d, device, seed=0, pad=()):
    g = torch.Generator().manual_seed(seed)
    T, n = sum(lengths), len(lengths)
    state = 0.1 * rnd(g, n + 1, hv, d, d)
    slots = (torch.arange(n, dtype=torch.int32) + 1).flip(0)
    for i in pad:
        slots[i] = -1
    return on(device, {
        "q": rnd(g, T, hk, d),
        "k": rnd(g, T, hk, d),
        "v": rnd(g, T, hv, d),
        "a": rnd(g, T, hv),
        "b": rnd(g, T, hv),
        "A_log": 0.5 * rnd(g, hv),
        "dt_bias": 0.5 * rnd(g, hv),
        "cu_seqlens": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32),
        "state": state,
        "slots": slots,
    })  # fmt: skip


def copy(case):
    return {k: v.clone() for k, v in case.items()}


@needs_fla
@pytest.mark.parametrize(
    "B, hk, hv, d, dtype, l2norm, pad",
    [
        pytest.param(3, 2, 4, 32, torch.float32, True, (1,), id="hk2-hv4-fp32-padded"),
        pytest.param(2, 1, 2, 16, torch.bfloat16, True, (), id="hk1-hv2-bf16"),
        pytest.param(2, 2, 6, 16, torch.float32, False, (), id="hk2-hv6-no-l2norm"),
    ],
)
def test_fla_decode_matches_reference(B, hk, hv, d, dtype, l2norm, pad, device):
    case = decode_case(B, hk, hv, d, dtype, device, pad=pad)
    if not l2norm:
        case["q"], case["k"] = case["q"] * d**-0.5, case["k"] * d**-0.5
    ours, ref = copy(case), copy(case)
    for _ in range(2):
        o = gdn_decode(**ours, use_qk_l2norm=l2norm, backend="fla")
        o_ref = gdn_decode(**ref, use_qk_l2norm=l2norm, backend="torch")
        torch.testing.assert_close(o.float(), o_ref.float(), **OUT_TOL[dtype])
        torch.testing.assert_close(ours["state"], ref["state"], equal_nan=True, **STATE_TOL)
    for i in pad:
        assert torch.equal(o[i], torch.zeros_like(o[i]))


@needs_fla
def test_fla_decode_bitwise_invariant(device):
    """fla's fused_recurrent, through the lab's wrapper: row 0 alone == row 0 of a batch."""
    case = decode_case(4, 2, 4, 32, torch.float32, device, seed=5)
    case["slots"] = torch.arange(4, dtype=torch.int32, device=device)
    alone = {k: (v[:1].clone() if k not in ("A_log", "dt_bias") else v.clone()) for k, v in case.items()}
    batch = copy(case)
    o1 = gdn_decode(**alone, backend="fla")
    o4 = gdn_decode(**batch, backend="fla")
    assert torch.equal(o1[0], o4[0]) and torch.equal(alone["state"][0], batch["state"][0])


@needs_fla
def test_fla_state_layout_conversion(monkeypatch, device):
    """The explicit transpose path (for an fla without state_v_first) agrees with the VK path."""
    from gdn_lab.ops import fla_adapter as lab_fla

    case = decode_case(2, 2, 4, 16, torch.float32, device, seed=2)
    vk, kv = copy(case), copy(case)
    o_vk = gdn_decode(**vk, backend="fla")
    monkeypatch.setitem(lab_fla._V_FIRST, lab_fla.fused_recurrent_gated_delta_rule, None)
    o_kv = gdn_decode(**kv, backend="fla")
    torch.testing.assert_close(o_kv, o_vk, **STATE_TOL)
    torch.testing.assert_close(kv["state"], vk["state"], equal_nan=True, **STATE_TOL)
    assert lab_fla._V_FIRST[lab_fla.chunk_gated_delta_rule] == "state_v_first"


@needs_fla
def test_fla_recurrent_prefill_matches_reference(device):
    """Varlen prefill through fla's fused_recurrent: states gathered and written back, a padded
    sequence gets zeros and leaves its slot alone."""
    case = prefill_case([5, 9, 3], 2, 4, 16, device, pad=(1,))
    ours, ref = copy(case), copy(case)
    o = gdn_prefill(**ours, backend="fla-recurrent")
    o_ref = gdn_prefill(**ref, backend="torch-recurrent")
    torch.testing.assert_close(o, o_ref, **OUT_TOL[torch.float32])
    torch.testing.assert_close(ours["state"], ref["state"], **STATE_TOL)
    assert torch.equal(o[5:14], torch.zeros_like(o[5:14]))
    assert torch.equal(ours["state"][0], case["state"][0])  # slot 0 belongs to nobody


@needs_fla
def test_dispatch_pinned_off():
    import os

    from gdn_lab.ops import fla_adapter as lab_fla

    assert os.environ.get(lab_fla.DISPATCH_ENV) == "1"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the reason applies to a machine without a GPU")
def test_chunk_prefill_unavailable_on_cpu_with_reason():
    ok, reason = fla_backends.available_chunk()
    assert not ok and ("TRITON_INTERPRET" in reason or "not installed" in reason)
    rows = {r["backend"]: r for r in routing.explain("gdn_prefill")}
    assert rows["fla"]["available"] is False and rows["fla-recurrent"]["auto"] is False


def test_missing_fla_is_a_reason(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fla" else real(name, *a))
    fla_backends._probe.cache_clear()
    try:
        assert fla_backends.available_recurrent() == (False, fla_backends.INSTALL_HINT)
        assert routing.decide("gdn_decode", {"q": torch.zeros(1, 1, 16)}, "fla").reason.startswith("not available")
    finally:
        monkeypatch.undo()
        fla_backends._probe.cache_clear()
