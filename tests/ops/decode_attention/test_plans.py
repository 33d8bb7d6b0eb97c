"""The decode kernel's plans (how work is cut into programs) never change a bit, and the auto plan follows the batch.

A request's numbers are fixed by its blocks (block_n tokens) and nodes (node_blocks blocks); a
plan only decides which program computes and stores what. Every plan on the same inputs must give
the same bits, and a target must keep its bits when its batchmates move the plan from fine to
coarse. Lengths sit at and around every edge the structure names, under the interpreter's config
(64-token blocks, 256-token nodes): 1, 63-65, 255-257, 511-513, and in the first test 1025 and
2049 tokens, whose 5 and 9 nodes take the reduce's 8-row and its BP-row folds (513's 3 nodes its
4-row one).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch

from gdn_lab.device import detect, fp8_dtypes_for
from gdn_lab.ops.decode_attention import reference
from gdn_lab.routing import get

OP = "decode_attention"
EDGES = (1, 63, 64, 65, 255, 256, 257, 513, 1025, 2049)
HEADS = (4, 2, 64)


def _kernels():
    from gdn_lab.ops.decode_attention import triton_kernels

    return triton_kernels


def _plans(cfg, max_len: int) -> list:
    """Every kind of plan: fine with spans of 1..R blocks, coarse with spans of 1, 2 and all nodes."""
    k = _kernels()
    r = cfg.node_blocks
    nodes = -(-max_len // cfg.node_tokens)
    fine = [k.DecodePlan(1, s) for s in sorted({1, 3, r + 1})]
    coarse = [k.DecodePlan(r, r * s) for s in sorted({1, nodes})]
    return fine + coarse


@pytest.mark.parametrize(
    ("page_size", "dtype", "kv_dtype"),
    [
        pytest.param(1, torch.float32, None, id="fp32-page1"),
        pytest.param(16, torch.bfloat16, None, id="bf16-page16"),
        pytest.param(16, torch.float32, torch.float8_e4m3fn, id="e4m3fn-page16"),
    ],
)
def test_every_plan_gives_the_same_bits(attention_args, device, page_size, dtype, kv_dtype):
    if kv_dtype is not None and kv_dtype not in fp8_dtypes_for(detect(device).arch):
        pytest.skip(f"{kv_dtype} is not an fp8 format of {detect(device).arch}")
    k = _kernels()
    reqs = [(n, i) for i, n in enumerate(EDGES)]
    args = attention_args(
        OP, reqs, HEADS, page_size=page_size, dtype=dtype, kv_dtype=kv_dtype, placement_seed=4, device=device
    )
    cfg = k.decode_config(HEADS[2], dtype, args["k_cache"].dtype)
    outs = {plan: k.decode_attention_triton(**args, plan=plan) for plan in _plans(cfg, max(EDGES))}
    first = next(iter(outs.values()))
    for plan, out in outs.items():
        assert torch.equal(out, first), plan
    if dtype == torch.float32:
        ref = reference.decode_attention_torch(**args)
        torch.testing.assert_close(first, ref, atol=1e-5, rtol=1e-5)


def test_auto_plan_follows_the_batch():
    k = _kernels()
    cfg = k.DecodeConfig(64, 16, 4, 3)  # 1024-token nodes, as on the GPU
    # Few nodes for the SMs: fine, a block or a few per program.
    assert k.decode_plan(1, 2, 4096, 132, cfg) == k.DecodePlan(1, 1)
    assert k.decode_plan(8, 2, 4096, 132, cfg).unit_blocks == 1
    # Enough nodes: coarse, one node per program, then several once programs are plentiful.
    assert k.decode_plan(8, 8, 4096, 132, cfg) == k.DecodePlan(16, 16)
    assert k.decode_plan(256, 8, 4096, 132, cfg) == k.DecodePlan(16, 64)
    # Spans never exceed the request (coarse) or a node (fine).
    assert k.decode_plan(4096, 8, 1024, 132, cfg) == k.DecodePlan(16, 16)
    assert k.decode_plan(1, 1, 256 * 1024, 10_000, cfg).span_blocks <= 16


@pytest.mark.parametrize("coarse_fill", [0.5, 1.0])
def test_auto_spans_divide_the_work_and_fill_two_programs_per_sm(coarse_fill):
    k = _kernels()
    cfg = k.DecodeConfig(128, 4, 4, 3, coarse_fill=coarse_fill)  # 512-token nodes
    sms, slots = 132, k.PROGRAMS_PER_SM * 132
    rng = random.Random(0)
    lengths = [1, 127, 128, 511, 512, 513, 1024, 4096, 12345, 16384, 65536] + [
        rng.randrange(1, 70_000) for _ in range(20)
    ]
    rounded = {False: 0, True: 0}  # coarse spans over a node whose slot share rounded down, and up
    for batch, heads, max_len in ((b, h, n) for b in (1, 3, 8, 64, 256) for h in (1, 2, 8) for n in lengths):
        plan = k.decode_plan(batch, heads, max_len, sms, cfg)
        pairs, blocks = batch * heads, -(-max_len // cfg.block_n)
        nodes = -(-blocks // cfg.node_blocks)
        where = f"batch={batch} heads={heads} max_len={max_len}: {plan}"
        if plan.unit_blocks == 1:
            assert pairs * nodes < coarse_fill * sms, where
            assert cfg.node_blocks % plan.span_blocks == 0, where
            programs = pairs * -(-blocks // plan.span_blocks)
            # the fewest blocks per program that keep at most two programs per SM (or a whole node)
            assert programs <= slots or plan.span_blocks == cfg.node_blocks, where
            if plan.span_blocks > 1:
                smaller = max(d for d in range(1, plan.span_blocks) if cfg.node_blocks % d == 0)
                assert pairs * -(-blocks // smaller) > slots, where
        else:
            assert plan.unit_blocks == cfg.node_blocks and pairs * nodes >= coarse_fill * sms, where
            per = plan.span_blocks // cfg.node_blocks
            # the largest divisor of the request's nodes up to the nodes per slot, to the nearest
            share = Fraction(pairs * nodes, slots)
            nearest = max(1, math.floor(share + Fraction(1, 2)))
            assert per == max(d for d in range(1, min(nearest, nodes) + 1) if nodes % d == 0), where
            rounded[share % 1 >= Fraction(1, 2)] += per > 1
    assert rounded[False] and rounded[True], rounded
    # Between the two thresholds the same batch is fine under one config and coarse under the other.
    assert k.decode_plan(8, 8, 1024, sms, cfg).unit_blocks == (1 if coarse_fill == 1.0 else cfg.node_blocks)
    # The H100 cases either side of 1.5 nodes a slot (probe_decode_coarse_rule_dde0bec.log): 1.45, 1.58.
    assert k.decode_plan(12, 8, 2048, sms, cfg) == k.DecodePlan(4, 4)
    assert k.decode_plan(13, 8, 2048, sms, cfg) == k.DecodePlan(4, 8)


def test_bad_plan_is_refused(attention_args, device):
    k = _kernels()
    args = attention_args(OP, [(5, 0)], HEADS, device=device)
    cfg = k.decode_config(HEADS[2], torch.float32, torch.float32)
    with pytest.raises(ValueError, match="unit_blocks"):
        k.decode_attention_triton(**args, plan=k.DecodePlan(2, 2))
    with pytest.raises(ValueError, match="span_blocks"):
        k.decode_attention_triton(**args, plan=k.DecodePlan(cfg.node_blocks, cfg.node_blocks + 1))


@pytest.mark.parametrize("target_len", [1, 63, 64, 65, 255, 256, 257, 511, 512, 513])
def test_target_keeps_its_bits_when_the_plan_moves(attention_args, device, target_len):
    """Alone (fine plan) vs among longer and shorter batchmates at a random position (coarse plan)."""
    k = _kernels()
    rng = random.Random(target_len)
    mates = [(rng.choice([1, 40, 300, 600, 900]), 100 + i) for i in range(3)]
    pos = rng.randrange(len(mates) + 1)
    target = (target_len, 7)
    reqs = mates[:pos] + [target] + mates[pos:]
    opts = {"page_size": 16, "dtype": torch.float32, "device": device}
    alone = attention_args(OP, [target], HEADS, **opts)
    batched = attention_args(OP, reqs, HEADS, placement_seed=target_len, **opts)
    cfg = k.decode_config(HEADS[2], torch.float32, torch.float32)
    sms = 16  # the plan's SM count: the lone target stays fine, the batch turns coarse
    plan_alone = k.decode_plan(1, HEADS[1], target_len, sms, cfg)
    plan_batched = k.decode_plan(len(reqs), HEADS[1], max(n for n, _ in reqs), sms, cfg)
    assert plan_alone.unit_blocks == 1 and plan_batched.unit_blocks == cfg.node_blocks
    run = get(OP, "triton").run
    out_alone = run(**alone, num_sms=sms)
    out_batched = run(**batched, num_sms=sms)
    assert torch.equal(out_batched[pos], out_alone[0])
    # The control on the same two calls changes with the batch whenever its split count moves.
    if k.splits_for_batch(1, HEADS[1], HEADS[2], target_len, sms) != k.splits_for_batch(
        len(reqs), HEADS[1], HEADS[2], max(n for n, _ in reqs), sms
    ) and target_len in (257, 513):
        ctl = get(OP, "triton-splitk-by-batch").run
        assert not torch.equal(ctl(**batched, num_sms=sms)[pos], ctl(**alone, num_sms=sms)[0])
