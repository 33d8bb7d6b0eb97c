"""fused_moe: the float64 reference against a token-by-token loop, the Triton kernel against the
reference, invariance on token slices drawn at random around the control's switch (M = E), the
control caught exactly where its rule says, the slot plan, and bad input.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from gdn_lab.ops import fused_moe, spec
from gdn_lab.ops.batch import Batch, BuildOptions, MoEShape, Request
from gdn_lab.ops.fused_moe import build
from gdn_lab.ops.fused_moe.reference import fused_moe_torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
IDS = ["fp32", "fp16", "bf16"]
SHAPE = MoEShape(hidden=80, num_experts=8, top_k=3, intermediate=40)


def _args(device, dtype, lengths, shape=SHAPE, seed=0):
    batch = Batch(tuple(Request(n, seed + i) for i, n in enumerate(lengths)), 0, 0)
    return build(batch, shape, BuildOptions(dtype=dtype, device=device))


def _token_loop(x, w1, w2, topk_weights, topk_ids):
    """The op's definition one token and one expert at a time, in float64, rounded where the op rounds."""
    dtype, inter = x.dtype, w2.shape[2]

    def rnd(t):
        return t.to(dtype).double()

    out = torch.empty_like(x)
    for m in range(x.shape[0]):
        total = torch.zeros(x.shape[1], dtype=torch.float64)
        for k in range(topk_ids.shape[1]):
            e = int(topk_ids[m, k])
            gate_up = rnd(torch.mv(w1[e].double().cpu(), x[m].double().cpu()))
            act = rnd(F.silu(gate_up[:inter]) * gate_up[inter:])
            total += rnd(float(topk_weights[m, k]) * torch.mv(w2[e].double().cpu(), act))
        out[m] = total.to(dtype)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_reference_is_the_token_loop(device, dtype):
    a = _args(device, dtype, [5, 3])
    ref = fused_moe_torch(**a)
    loop = _token_loop(**a).to(device)
    # the two float64 sums differ in order only: at most the last bit of a rounding that fell on a tie
    torch.testing.assert_close(ref, loop, atol=0, rtol=torch.finfo(dtype).eps)
    assert ref.dtype == dtype and ref.shape == a["x"].shape


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize(
    ("lengths", "shape"),
    [
        ([1], MoEShape(hidden=40, num_experts=4, top_k=4, intermediate=24)),  # every expert, one token
        ([7, 30], MoEShape(hidden=100, num_experts=8, top_k=3, intermediate=40)),  # H, I off the tiles
        ([50], MoEShape(hidden=64, num_experts=16, top_k=2, intermediate=64)),
    ],
    ids=["1tok-all-experts", "37tok-ragged", "50tok-E16"],
)
def test_triton_matches_reference(device, dtype, lengths, shape):
    a = _args(device, dtype, lengths, shape)
    out = fused_moe(**a, backend="triton")
    ref = fused_moe(**a, backend="torch")
    assert out.dtype == dtype and out.shape == ref.shape
    tol = spec.get("fused_moe").tolerance("out", dtype)
    assert tol.holds(out, ref), f"{tol.name}: {tol.measure(out, ref)}"


def test_strided_inputs_read_as_they_are(device):
    a = _args(device, torch.float32, [9])
    x = torch.cat([a["x"], a["x"]], dim=1)[:, : a["x"].shape[1]]  # rows with a stride of 2H
    w1 = a["w1"].transpose(1, 2).contiguous().transpose(1, 2)  # H-major expert weights
    assert not x.is_contiguous() and not w1.is_contiguous()
    out = fused_moe(x, w1, a["w2"], a["topk_weights"], a["topk_ids"], backend="triton")
    assert torch.equal(out, fused_moe(**a, backend="triton"))


def test_empty_batch(device):
    a = _args(device, torch.float32, [4])
    empty = {**a, "x": a["x"][:0], "topk_weights": a["topk_weights"][:0], "topk_ids": a["topk_ids"][:0]}
    for backend in ("torch", "triton", "triton-atomic-by-batch"):
        assert fused_moe(**empty, backend=backend).shape == (0, a["x"].shape[1])


def _slice(a, lo, hi):
    return {**a, "x": a["x"][lo:hi], "topk_weights": a["topk_weights"][lo:hi], "topk_ids": a["topk_ids"][lo:hi]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_triton_is_batch_invariant(device, dtype):
    """A token's row is the same in any slice of the batch: slices shorter and longer than the
    number of experts (the control's switch), at random positions, and in the batch reversed."""
    a = _args(device, dtype, [12, 25, 3])  # 40 tokens, E = 8
    full = fused_moe(**a, backend="triton")
    rng = random.Random(0)
    spans = [(0, 1), (39, 40), (0, 8), (0, 9)] + [tuple(sorted(rng.sample(range(41), 2))) for _ in range(8)]
    for lo, hi in spans:
        assert torch.equal(fused_moe(**_slice(a, lo, hi), backend="triton"), full[lo:hi]), f"tokens {lo}:{hi}"
    rev = {k: (v.flip(0) if k in ("x", "topk_weights", "topk_ids") else v) for k, v in a.items()}
    assert torch.equal(fused_moe(**rev, backend="triton").flip(0), full)


def test_control_varies_where_its_rule_switches(device):
    """The control sums atomic-style above E tokens: a token's bits change between a launch of at
    most E tokens and one of more, never between two launches on the same side."""
    a = _args(device, torch.float32, [20, 20], MoEShape(hidden=64, num_experts=8, top_k=4, intermediate=32))
    small, large, larger = (fused_moe(**_slice(a, 0, n), backend="triton-atomic-by-batch") for n in (8, 20, 40))
    assert not torch.equal(small, large[:8])  # 8 tokens (reduce) against 20 (atomic)
    assert torch.equal(large, larger[:20])  # 20 and 40: both atomic
    assert torch.equal(small, fused_moe(**_slice(a, 0, 8), backend="triton"))  # at most E: the invariant kernel


def test_control_needs_three_experts_per_token(device):
    from gdn_lab.routing import NotCovered

    a = _args(device, torch.float32, [10], MoEShape(hidden=32, num_experts=4, top_k=2, intermediate=16))
    with pytest.raises(NotCovered, match="top_k=2"):
        fused_moe(**a, backend="triton-atomic-by-batch")


def test_plan_cuts_each_experts_slots_into_blocks(device):
    from gdn_lab.ops.fused_moe.triton_kernels import plan

    g = torch.Generator().manual_seed(3)
    ids = torch.stack([torch.randperm(6, generator=g)[:3] for _ in range(23)]).to(torch.int32)
    p = plan(ids.to(device), 6, 4)
    order, expert, first, rows = (t.cpu().tolist() for t in (p.order, p.block_expert, p.block_first, p.block_rows))
    flat = ids.flatten().tolist()
    assert order == sorted(range(len(flat)), key=lambda s: (flat[s], s))  # by expert, then by slot
    covered = []
    for e, f, n in zip(expert, first, rows):
        assert 0 <= n <= 4
        covered += [(order[i], e) for i in range(f, f + n)]
    assert sorted(covered) == sorted((s, flat[s]) for s in range(len(flat)))  # every slot once, in its expert's blocks
    assert len(rows) == -(-len(flat) // 4) + 6 and rows[-1] == 0  # the grid's bound; the spare blocks do nothing


def test_expert_counts_are_the_slots_per_expert(device):
    from gdn_lab.ops.fused_moe.triton_kernels import expert_counts

    g = torch.Generator().manual_seed(4)
    for dtype in (torch.int32, torch.int64):
        ids = torch.randint(1, 7, (40,), generator=g).to(dtype)  # experts 0 and 7..8 get no slot
        counts = expert_counts(ids.sort().values.to(device), 9).cpu().tolist()
        assert counts == [ids.tolist().count(e) for e in range(9)]


def test_no_host_sync_so_a_cuda_graph_replays_it(device):
    """The backends route, plan and launch without reading the device (check_indices=False): a
    CUDA graph captures a call and its replay gives the eager bits."""
    if device.type != "cuda":
        pytest.skip("host synchronisation and CUDA graphs need a CUDA device")
    a = _args(device, torch.bfloat16, [9, 4, 20])
    from gdn_lab.routing import decide

    backends = ["triton", "triton-atomic-by-batch"]
    if decide("fused_moe", a, "aiter-triton-moe").covered:  # the amd-aiter wheel is installed
        backends.append("aiter-triton-moe")
    for name in backends:
        eager = fused_moe(**a, backend=name, check_indices=False)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            fused_moe(**a, backend=name, check_indices=False)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fused_moe(**a, backend=name, check_indices=False)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager), name


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: {**a, "topk_ids": a["topk_ids"].long()}, "topk_ids: dtype int64 is not accepted"),
        (lambda a: {**a, "topk_weights": a["topk_weights"].double()}, "topk_weights: dtype float64"),
        (lambda a: {**a, "w1": a["w1"][:, :-1]}, r"w1: expected shape \[E, 2\*I, H\] with 2\*I=80"),
        (lambda a: {**a, "w2": a["w2"][:5]}, r"w2: expected shape \[E, H, I\] with E=8"),
        (lambda a: {**a, "w1": a["w1"].half()}, "w1: dtype float16 is not accepted"),
        (lambda a: {**a, "topk_ids": a["topk_ids"].clone().fill_(8)}, r"topk_ids: entry 8 points outside E"),
        (lambda a: {**a, "topk_ids": a["topk_ids"][:, [0, 0, 1]].contiguous()}, "routes to an expert twice"),
        (lambda a: {**a, "topk_weights": a["topk_weights"][:-1]}, "topk_weights: expected shape"),
        (lambda a: {**a, "x": a["x"][:, :0]}, r"w1: expected shape \[E, N, H\] with H=0 \(from x\)"),
        (lambda a: {**a, "x": a["x"][:, :0], "w1": a["w1"][:, :, :0], "w2": a["w2"][:, :0]}, "H: must be > 0"),
    ],
    ids=[
        "ids-int64",
        "weights-f64",
        "w1-rows",
        "w2-experts",
        "w1-dtype",
        "id-range",
        "id-repeat",
        "weights-rows",
        "x-H",
        "H-0",
    ],  # fmt: skip
)
def test_bad_input_is_named(device, change, match):
    a = _args(device, torch.float32, [4])
    with pytest.raises(ValueError, match=match):
        fused_moe(**change(a), backend="torch")


def test_more_experts_per_token_than_experts(device):
    a = _args(device, torch.float32, [2], MoEShape(hidden=16, num_experts=2, top_k=2, intermediate=8))
    with pytest.raises(ValueError, match="3 experts per token, more than E=2"):
        fused_moe(**{**a, "topk_ids": torch.zeros(2, 3, dtype=torch.int32, device=device),
                     "topk_weights": torch.zeros(2, 3, device=device)})  # fmt: skip
    with pytest.raises(ValueError, match="check_indices: expected a bool"):
        fused_moe(**a, check_indices=1)
