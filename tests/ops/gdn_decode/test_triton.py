"""gdn_decode's Triton kernel: against the torch reference, bitwise batch invariance, and its controls.

On the test device (tests/conftest.py: a GPU, or the CPU under TRITON_INTERPRET=1), tiny shapes.
"""

import subprocess
import sys

import pytest
import torch

from gdn_lab import routing
from gdn_lab.experiments.compare import compare
from gdn_lab.ops import delta_rule, gdn_decode, spec
from gdn_lab.ops.gdn_decode.triton_kernels import (
    DEFAULT_K_SPLIT,
    control_k_split,
    gdn_decode_triton,
    gdn_decode_triton_ksplit_by_batch,
)

decode = spec.get("gdn_decode")

# Closeness to the reference (a separate question from invariance): the state is fp32 in both, so
# it agrees to fp32 rounding of reordered sums; the output is rounded to q's dtype, so it may land
# one ulp of that dtype apart.
STATE_TOL = {"atol": 2e-5, "rtol": 1e-4}
OUT_TOL = {
    torch.float32: {"atol": 2e-5, "rtol": 1e-4},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
}


def make_case(B, hk, hv, kd, vd, dtype=torch.float32, seed=0, pad=(), l2norm=True, extra_slots=2, device="cpu"):
    """Raw gdn_decode inputs on `device`: distinct shuffled slots in a pool with spare NaN slots; rows in `pad` padded."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q, k = r(B, hk, kd), r(B, hk, kd)
    if not l2norm:  # unnormalized keys of norm ~1 keep the recurrence stable
        q, k = q * kd**-0.5, k * kd**-0.5
    num_slots = B + extra_slots
    state = 0.1 * r(num_slots, hv, vd, kd)
    slots = torch.randperm(num_slots, generator=g)[:B].to(torch.int32)
    used = set(slots.tolist())
    for s in range(num_slots):
        if s not in used:
            state[s] = float("nan")  # a kernel that reads a slot it does not own shows it
    for i in pad:
        slots[i] = -1 - i
    case = {
        "q": q.to(dtype),
        "k": k.to(dtype),
        "v": r(B, hv, vd).to(dtype),
        "a": r(B, hv).to(dtype),
        "b": r(B, hv).to(dtype),
        "A_log": 0.5 * r(hv),
        "dt_bias": 0.5 * r(hv),
        "state": state,
        "slots": slots,
        "use_qk_l2norm": l2norm,
    }
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case.items()}


def copy(case):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in case.items()}


def assert_close_nan(actual, expected, **tol):
    """allclose where NaN must meet NaN (untouched spare slots stay NaN)."""
    torch.testing.assert_close(actual, expected, equal_nan=True, **tol)


FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
# Each shape meets several dtype/l2norm combinations, and every combination occurs (a full product
# would triple the interpreter time for no new code path).
CASES = [
    pytest.param(1, 2, 16, 16, FP32, True, id="hk1-hv2-d16-fp32"),
    pytest.param(1, 2, 16, 16, BF16, False, id="hk1-hv2-d16-bf16-no-l2norm"),
    pytest.param(2, 4, 32, 32, FP16, True, id="hk2-hv4-d32-fp16"),
    pytest.param(2, 4, 32, 32, FP32, False, id="hk2-hv4-d32-fp32-no-l2norm"),
    pytest.param(2, 4, 32, 32, BF16, True, id="hk2-hv4-d32-bf16"),
    pytest.param(2, 6, 64, 64, BF16, True, id="hk2-hv6-d64-bf16"),
    pytest.param(2, 6, 32, 32, FP16, False, id="hk2-hv6-d32-fp16-no-l2norm"),
    pytest.param(2, 4, 24, 40, FP32, True, id="hk2-hv4-k24-v40-fp32-masked"),
    pytest.param(2, 4, 24, 40, BF16, False, id="hk2-hv4-k24-v40-bf16-masked-no-l2norm"),
]


def same_bits(x, y):
    """Bitwise equality in which NaN meets NaN (spare pool slots are NaN)."""
    return compare(x, y)["bitwise_equal"]


@pytest.mark.parametrize("hk, hv, kd, vd, dtype, l2norm", CASES)
def test_matches_reference_over_steps(hk, hv, kd, vd, dtype, l2norm, device):
    """Two steps with a padded row: output and the whole pool against the torch reference."""
    case = make_case(3, hk, hv, kd, vd, dtype, seed=hk * 100 + kd, pad=(1,), l2norm=l2norm, device=device)
    ours, ref = copy(case), copy(case)
    for step in range(2):
        if step:
            for x in (ours, ref):  # a new token for every request, same slots
                x["v"] = (x["v"].float() * 0.5 + step).to(dtype)
        o = gdn_decode(**ours, backend="triton")
        o_ref = gdn_decode(**ref, backend="torch")
        assert o.dtype == dtype and o.shape == (3, hv, vd)
        torch.testing.assert_close(o.float(), o_ref.float(), **OUT_TOL[dtype])
        assert torch.equal(o[1], torch.zeros_like(o[1])), "a padded row's output must be zeros"
        assert_close_nan(ours["state"], ref["state"], **STATE_TOL)


def test_padded_slot_state_untouched(device):
    case = make_case(2, 2, 4, 32, 32, pad=(0,), device=device)
    before = case["state"].clone()
    x = copy(case)
    gdn_decode(**x, backend="triton")
    live = int(case["slots"][1])
    others = [s for s in range(before.shape[0]) if s != live]
    assert torch.equal(x["state"][others].nan_to_num(7.0), before[others].nan_to_num(7.0))


def alone_and_batched(fn, B, pos, device, hk=2, hv=4, d=32, seed=3):
    """The target request alone (its slot 0 of a 1-slot pool) and at `pos` of a B-batch (slot B).

    Returns ((out alone, state alone), (out batched, state batched)) for the target.
    """
    t = make_case(1, hk, hv, d, d, seed=seed, extra_slots=0, device=device)
    t["slots"][0] = 0
    batch = make_case(B, hk, hv, d, d, seed=seed + B, extra_slots=1, device=device)
    for key in ("q", "k", "v", "a", "b"):
        batch[key][pos] = t[key][0]
    batch["A_log"], batch["dt_bias"] = t["A_log"], t["dt_bias"]
    batch["state"][B] = t["state"][0]
    s = batch["slots"]
    holder = (s == B).nonzero().flatten()
    if holder.numel():  # slots stay distinct: the row that drew slot B takes the target row's slot
        s[holder[0]] = s[pos]
    s[pos] = B
    o1, o2 = fn(t), fn(batch)
    return (o1[0], t["state"][0]), (o2[pos], batch["state"][B])


def run_backend(name):
    return lambda x: gdn_decode(**x, backend=name)


def run_wrapper(**cfg):
    return lambda x: gdn_decode_triton(**decode.validate(**x), **cfg)


@pytest.mark.parametrize("B, pos", [(2, 1), (5, 0), (9, 4)])
def test_triton_bitwise_invariant(B, pos, device):
    """The `triton` backend: the target's output and state alone == inside any batch, bit for bit."""
    (o1, s1), (o2, s2) = alone_and_batched(run_backend("triton"), B, pos, device)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


@pytest.mark.parametrize("k_split", [1, 2, 4, 8, 16, 32])
def test_each_fixed_k_split_bitwise_invariant(k_split, device):
    (o1, s1), (o2, s2) = alone_and_batched(run_wrapper(k_split=k_split), 6, 2, device)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


def test_k_split_changes_bits(device):
    """Known-variant check: another split of the K reductions gives other bits on the same inputs
    (each compared with the default 8; the order, not the math, differs, so values stay close)."""
    case = make_case(4, 2, 4, 32, 32, seed=11, device=device)
    base_args = decode.validate(**copy(case))
    base = gdn_decode_triton(**base_args)
    for k_split in (4, 16):
        args = decode.validate(**copy(case))
        out = gdn_decode_triton(**args, k_split=k_split)
        assert not (torch.equal(out, base) and same_bits(args["state"], base_args["state"])), k_split
        torch.testing.assert_close(out, base, atol=1e-5, rtol=1e-5)


def test_control_differs_alone_vs_batched(device):
    """The control picks k_split from the batch: a batch size whose split differs from B=1's
    changes the target's bits; one whose split is the same does not (it is the same kernel)."""
    ks1 = control_k_split(1, 2, 4, 32, 32, torch.float32)[0]
    splits = {B: control_k_split(B, 2, 4, 32, 32, torch.float32)[0] for B in range(2, 40)}
    differ = next(B for B, ks in splits.items() if ks != ks1)
    same = next(B for B, ks in splits.items() if ks == ks1)
    (o1, s1), (o2, s2) = alone_and_batched(run_backend("triton-ksplit-by-batch"), differ, differ // 2, device)
    assert not (torch.equal(o1, o2) and torch.equal(s1, s2)), f"k_split {ks1} alone vs {splits[differ]} at B={differ}"
    (o1, s1), (o2, s2) = alone_and_batched(run_backend("triton-ksplit-by-batch"), same, 0, device)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


def test_control_follows_the_emulated_arch(device):
    """gfx942's table picks other splits than gfx950's for some batch: the arch is a parameter."""
    picks = {arch: [control_k_split(B, 4, 8, 128, 128, torch.bfloat16, arch)[0] for B in range(1, 65)] for arch in ("gfx942", "gfx950")}  # fmt: skip
    assert picks["gfx942"] != picks["gfx950"]
    case = decode.validate(**make_case(1, 2, 4, 32, 32, device=device))
    with pytest.raises(ValueError, match="arch"):
        gdn_decode_triton_ksplit_by_batch(**case, arch="gfx90a")


def test_default_k_split_is_fixed(device):
    assert DEFAULT_K_SPLIT == 8
    x = make_case(3, 2, 4, 32, 32, seed=5, device=device)
    a, b = copy(x), copy(x)
    o_default = gdn_decode_triton(**decode.validate(**a))
    o_eight = gdn_decode_triton(**decode.validate(**b), k_split=8)
    assert torch.equal(o_default, o_eight) and same_bits(a["state"], b["state"])


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"k_split": 3}, "k_split"),
        ({"k_split": 64}, "k_split"),
        ({"k_split": True}, "k_split"),
        ({"block_v": 0}, "block_v"),
        ({"num_warps": 3}, "num_warps"),
    ],
)
def test_bad_config(cfg, match, device):
    args = decode.validate(**make_case(1, 2, 4, 32, 32, device=device))
    with pytest.raises(ValueError, match=match):
        gdn_decode_triton(**args, **cfg)


def test_routing_and_coverage(device):
    args = decode.validate(**make_case(2, 2, 4, 32, 32, device=device))
    assert routing.route("gdn_decode", args).name == "triton"
    control = routing.get("gdn_decode", "triton-ksplit-by-batch")
    assert control.variant_control and not control.auto
    assert "CONTROL" in control.description
    assert "control" in gdn_decode_triton_ksplit_by_batch.__doc__.splitlines()[0].lower()
    strided = dict(args, state=args["state"].transpose(-1, -2))
    d = routing.decide("gdn_decode", strided, "triton")
    assert not d.covered and "contiguous" in d.reason
    with pytest.raises(ValueError, match="state"):
        gdn_decode_triton(**strided)


def test_zero_batch(device):
    x = make_case(1, 2, 4, 32, 32, device=device)
    x = {k: (v[:0] if k in ("q", "k", "v", "a", "b", "slots") else v) for k, v in x.items()}
    assert gdn_decode(**x, backend="triton").shape == (0, 4, 32)


def test_registration_imports_no_kernel_module():
    code = (
        "import sys, gdn_lab.ops, gdn_lab.routing as r; r.explain('gdn_decode'); r.explain('gdn_prefill');"
        "bad = [m for m in ('gdn_lab.ops.gdn_decode.triton_kernels', 'gdn_lab.ops.fla_adapter', 'fla')"
        " if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_validation_memo_still_rejects(device):
    """Accepted signatures skip the shape checks; a new bad signature and bad slot values still fail."""
    x = make_case(2, 2, 4, 32, 32, device=device)
    decode.validate(**x)
    with pytest.raises(ValueError, match="k: dtype"):
        decode.validate(**dict(x, k=x["k"].half()))
    with pytest.raises(ValueError, match="use_qk_l2norm"):
        decode.validate(**dict(x, use_qk_l2norm=1))
    with pytest.raises(ValueError, match="slots"):
        decode.validate(**dict(x, slots=torch.tensor([0, 99], dtype=torch.int32, device=device)))
    with pytest.raises(ValueError, match="distinct"):
        decode.validate(**dict(x, slots=torch.tensor([1, 1], dtype=torch.int32, device=device)))
    decode.validate(**dict(x, slots=torch.tensor([1, 1], dtype=torch.int32, device=device)), check_indices=False)


def test_reference_is_independent_of_the_kernel(device):
    """Sanity of the oracle: the reference's step equals a direct formula on one row."""
    x = make_case(1, 1, 2, 16, 16, seed=9, device=device)
    ref = copy(x)
    o = gdn_decode(**ref, backend="torch")
    slot = int(x["slots"][0])
    q, k = delta_rule.prepare_qk(x["q"][0], x["k"][0], 2, 16**-0.5, True)
    g, beta = delta_rule.gates(x["a"][0], x["b"][0], x["A_log"], x["dt_bias"])
    S = x["state"][slot] * torch.exp(g)[:, None, None]
    S = S + (beta[:, None] * (x["v"][0] - (S * k[:, None, :]).sum(-1)))[:, :, None] * k[:, None, :]
    torch.testing.assert_close(o[0], (S * q[:, None, :]).sum(-1), atol=1e-6, rtol=1e-5)
