"""gdn_prefill `triton` (chunked) and its control `triton-chunk-by-batch`: against the torch references,
bitwise alone vs batched, and the control caught varying with the batch.

On the test device (tests/conftest.py: a GPU, or the CPU under TRITON_INTERPRET=1), on tiny shapes.
"""

from __future__ import annotations

import pytest
import torch

from gdn_lab.ops import delta_rule, spec
from gdn_lab.routing import decide, get

prefill = spec.get("gdn_prefill")

OP = "gdn_prefill"


def sequence(seed: int, length: int, hk: int, hv: int, d: int, dtype: torch.dtype, unit_k: bool = False):
    """One sequence's inputs and initial state, from its own seed (the same whatever its batch)."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(length, hk, d, generator=g), torch.randn(length, hk, d, generator=g)
    if unit_k:  # without the in-kernel L2 norm, keep |k| near 1 so the recurrence stays bounded
        q, k = q / d**0.5, k / d**0.5
    v = torch.randn(length, hv, d, generator=g)
    a, b = torch.randn(length, hv, generator=g), torch.randn(length, hv, generator=g)
    h0 = 0.1 * torch.randn(hv, d, d, generator=g)
    return [x.to(dtype) for x in (q, k, v, a, b)] + [h0]


def batch_args(seeds, lengths, slots, device, *, hk=2, hv=4, d=32, dtype=torch.float32, spare=2, unit_k=False, **kw):
    """Validated gdn_prefill arguments on `device`: sequences in order, states at `slots` of a NaN-padded pool."""
    seqs = [sequence(s, n, hk, hv, d, dtype, unit_k) for s, n in zip(seeds, lengths)]
    g = torch.Generator().manual_seed(1234)
    A_log, dt_bias = torch.randn(hv, generator=g), torch.randn(hv, generator=g)
    state = torch.full((len(lengths) + spare, hv, d, d), float("nan"))
    for slot, seq in zip(slots, seqs):
        if slot >= 0:
            state[slot] = seq[5]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    cat = [torch.cat([s[i] for s in seqs]) for i in range(5)]
    tensors = [*cat, A_log, dt_bias, cu, state, torch.tensor(slots, dtype=torch.int32)]
    return prefill.validate(*(t.to(device) for t in tensors), **kw)


def run(backend, args: dict, **kw):
    """(output, state pool after) of one call on private copies; backend: a registered name, or a
    function taking the op's arguments (and `kw`)."""
    fn = get(OP, backend).run if isinstance(backend, str) else backend
    mine = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    return fn(**mine, **kw), mine["state"]


def rel_mae(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).abs().mean() / ref.float().abs().mean())


CASES = [
    pytest.param(1, 2, 16, (1, 5, 63, 64, 65, 130), [3, 0, 5, -1, 1, 2], True, id="hk1-hv2-d16-edges-pad"),
    pytest.param(2, 4, 32, (64, 65), [1, 0], True, id="hk2-hv4-d32"),
    pytest.param(2, 2, 16, (33, 2), [0, 1], False, id="hk2-hv2-d16-no-l2norm"),
]


@pytest.mark.parametrize("hk,hv,d,lengths,slots,l2norm", CASES)
def test_fp32_matches_the_references(hk, hv, d, lengths, slots, l2norm, device):
    """fp32 end to end: within atol 1e-5 / rtol 1e-4 of the token-by-token definition and of the chunked reference."""
    args = batch_args(
        range(len(lengths)), lengths, slots, device, hk=hk, hv=hv, d=d, unit_k=not l2norm, use_qk_l2norm=l2norm
    )
    out, state = run("triton", args)
    for ref_backend in ("torch-recurrent", "torch"):
        ref_out, ref_state = run(ref_backend, args)
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(state, ref_state, atol=1e-5, rtol=1e-4, equal_nan=True)
    pad = [i for i, s in enumerate(slots) if s < 0]
    cu = args["cu_seqlens"].tolist()
    for i in pad:  # a padding sequence: zero output rows
        assert out[cu[i] : cu[i + 1]].eq(0).all()
    unowned = sorted(set(range(state.shape[0])) - set(slots))
    assert state[unowned].isnan().all()  # slots nobody owns stay untouched


@pytest.mark.parametrize("hk,hv,d", [(2, 4, 32), (1, 2, 64)], ids=["d32", "d64"])
def test_bf16_close_to_the_reference(hk, hv, d, device):
    """bf16 inputs and output, fp32 state: relMAE <= 1e-2, exact-rounded output dtype. On a GPU the
    recurrence's and output's dots take bf16 operands, the prepare's TF32 ones at d 32 and bf16 ones
    at d 64 (`prepare_dot_precision`)."""
    args = batch_args([7, 8], [5, 70], [1, 0], device, hk=hk, hv=hv, d=d, dtype=torch.bfloat16)
    out, state = run("triton", args)
    ref_out, ref_state = run("torch", args)
    assert out.dtype == torch.bfloat16
    assert rel_mae(out, ref_out) <= 1e-2
    assert rel_mae(state[:2], ref_state[:2]) <= 1e-2


def target_rows_and_state(backend, seeds, lengths, slots, position, device, d=16):
    args = batch_args(seeds, lengths, slots, device, hk=1, hv=2, d=d, dtype=torch.bfloat16)
    out, state = run(backend, args)
    cu = args["cu_seqlens"].tolist()
    return out[cu[position] : cu[position + 1]], state[slots[position]]


TARGET_SEED, TARGET_LEN = 99, 130  # three chunks at 64, five at 32
BATCHES = [  # (seeds, lengths, slots, target position): the target among batchmates, in several orders
    ([5, TARGET_SEED, 6], [7, TARGET_LEN, 40], [2, 0, 1], 1),
    ([6, 5, 3, 4, TARGET_SEED], [40, 7, 1, 64, TARGET_LEN], [4, 1, 0, 2, 3], 4),
]


@pytest.mark.parametrize("d", [16, 64])
def test_bitwise_alone_vs_batched(device, d):
    """The target's output rows and final state are bitwise the same alone and in any batch (d 64:
    on a GPU the prepare's dots on bf16 operands too)."""
    alone_out, alone_state = target_rows_and_state("triton", [TARGET_SEED], [TARGET_LEN], [0], 0, device, d)
    for seeds, lengths, slots, pos in BATCHES:
        out, state = target_rows_and_state("triton", seeds, lengths, slots, pos, device, d)
        assert torch.equal(out, alone_out)
        assert torch.equal(state, alone_state)


def test_control_varies_with_the_batch(device):
    """`triton-chunk-by-batch` chunks by 64 alone and by 32 in a batch of 5: the target's bits change.

    Alone it is the same computation as `triton` (chunk 64), and batched it stays close to the reference.
    """
    seeds, lengths, slots, pos = BATCHES[1]
    alone_out, alone_state = target_rows_and_state("triton-chunk-by-batch", [TARGET_SEED], [TARGET_LEN], [0], 0, device)
    fixed_out, fixed_state = target_rows_and_state("triton", [TARGET_SEED], [TARGET_LEN], [0], 0, device)
    assert torch.equal(alone_out, fixed_out) and torch.equal(alone_state, fixed_state)
    out, state = target_rows_and_state("triton-chunk-by-batch", seeds, lengths, slots, pos, device)
    assert not torch.equal(state, alone_state)
    assert rel_mae(out, alone_out) <= 1e-2 and rel_mae(state, alone_state) <= 1e-2


# the parallel recurrence on tiny shapes: sequences of more than 40 tokens cut into 32-token segments
SEGMENTED = {"chunk_size": 16, "segment_chunks": 2, "segment_from": 40}


def chunked(args: dict, **sizes):
    """`run` of gdn_prefill_chunked at the given chunk and segment sizes."""
    from gdn_lab.ops.delta_rule_triton import gdn_prefill_chunked

    return run(gdn_prefill_chunked, args, **sizes)


def test_segment_parallel_recurrence_matches_the_token_by_token_reference(device):
    """Sequences of one segment (up to 40 tokens, of 1 to 3 chunks) and of 2 and 5 segments, a padding
    row, nonzero initial states: fp32 within the fp32 tolerance of the token-by-token recurrence."""
    lengths, slots = (1, 31, 40, 33, 64, 150, 7), [6, 0, 5, 1, -1, 2, 3]
    args = batch_args(range(len(lengths)), lengths, slots, device, hk=1, hv=2, d=16, spare=1)
    out, state = chunked(args, **SEGMENTED)
    ref_out, ref_state = run("torch-recurrent", args)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(state, ref_state, atol=1e-5, rtol=1e-4, equal_nan=True)
    assert state[4].isnan().all(), "the unowned slot stays untouched"


@pytest.mark.parametrize("d", [16, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_the_segmented_run_stays_inside_its_tensors(device, dtype, d):
    """Under the interpreter every address the segmented run loads or stores (the chunk plans, the
    prepare, the segments' maps and entering states, the state and output launches) lies inside
    its tensors: sequences of one segment and of two and five, partial last chunks, a padding slot
    and a spare pool slot. (The delta rule's bounds test covers the unsegmented launches.)"""
    from gdn_lab.ops.triton_support import interpreting
    from gdn_lab.out_of_bounds import out_of_bounds

    if not interpreting():
        pytest.skip("the interpreter's hooks (a CPU session)")
    lengths, slots = (1, 40, 7, 64, 150), [4, 0, 1, -1, 2]  # a cut sequence last: its maps end the buffer
    args = batch_args(range(len(lengths)), lengths, slots, device, hk=1, hv=2, d=d, dtype=dtype, spare=1)
    with out_of_bounds() as found:
        out, _ = chunked(args, **SEGMENTED)
    assert found == [] and out.isfinite().all()


def test_only_sequences_past_the_threshold_are_cut(device):
    """A sequence of up to `segment_from` tokens (three chunks here, more than a segment) is one
    segment and runs the serial recurrence: bitwise the uncut run. A longer one is cut into segments
    of `segment_chunks` chunks and goes through their maps (rounding of their own, close)."""
    from gdn_lab.ops.delta_rule_triton import chunked_run

    args = batch_args([3, 4], [40, 150], [0, 1], device, hk=1, hv=2, d=16, dtype=torch.bfloat16)
    run = chunked_run(args["cu_seqlens"], torch.empty_like(args["v"]), 1, 16, **SEGMENTED)
    assert run.segments.chunk_cu.tolist() == [0, 1, 6]  # 40 tokens: one segment; 150: five of 32
    seg_out, seg_state = chunked(args, **SEGMENTED)
    one_out, one_state = chunked(args, **{**SEGMENTED, "segment_from": 10**6})
    assert torch.equal(seg_out[:40], one_out[:40]) and torch.equal(seg_state[0], one_state[0])
    assert rel_mae(seg_out[40:], one_out[40:]) <= 1e-2 and rel_mae(seg_state[1], one_state[1]) <= 1e-2


def test_the_default_cut_follows_the_shape(device, monkeypatch):
    """By default a sequence past SEGMENT_FROM tokens is cut only where its heads leave the GPU idle
    (value heads x V tiles below SERIAL_FILLS_AT programs); with more heads it runs the serial
    recurrence, bitwise. Qwen3-Next's value heads at TP4 (8) cut, at TP2 (16) and TP1 (32) do not."""
    import sys

    from gdn_lab.ops import delta_rule_triton as D

    assert D.segment_from_of(8, 128, 128) == D.SEGMENT_FROM
    assert D.segment_from_of(16, 128, 128) == D.segment_from_of(32, 128, 128) == sys.maxsize
    monkeypatch.setattr(D, "SEGMENT_FROM", SEGMENTED["segment_from"])
    monkeypatch.setattr(D, "SERIAL_FILLS_AT", 4)
    assert D.segment_from_of(1, 64, 64) == SEGMENTED["segment_from"] and D.segment_from_of(1, 128, 128) == sys.maxsize
    sizes = {"chunk_size": SEGMENTED["chunk_size"], "segment_chunks": SEGMENTED["segment_chunks"]}
    for hv, cut in ((2, True), (4, False)):  # d 16: one V tile per head
        args = batch_args([3, 4], [40, 200], [0, 1], device, hk=1, hv=hv, d=16, dtype=torch.bfloat16)
        out, state = chunked(args, **sizes)
        cut_out, cut_state = chunked(args, **SEGMENTED)
        serial_out, serial_state = chunked(args, **sizes, segment_from=10**6)
        assert not torch.equal(cut_state[1], serial_state[1]), "the cut and the serial run round otherwise"
        want_out, want_state = (cut_out, cut_state) if cut else (serial_out, serial_state)
        assert torch.equal(out, want_out) and torch.equal(state[:2], want_state[:2]), f"hv {hv}"  # [2:]: NaN spares


@pytest.mark.parametrize("target", [130, 37], ids=["five-segments", "one-segment"])
def test_segment_parallel_recurrence_is_bitwise_alone_vs_batched(device, target):
    """Segments start at each sequence's own first token: the target's bits do not follow its batch,
    among batchmates shorter and longer than it, of one segment and of several, at any position. A
    target of one segment runs from its pool state alone (no sequence of that call can be cut) and
    through the entering-state launch when batched."""

    def target_bits(seeds, lengths, pos):
        slots = list(range(len(lengths)))[::-1]
        args = batch_args(seeds, lengths, slots, device, hk=1, hv=2, d=16, dtype=torch.bfloat16)
        out, state = chunked(args, **SEGMENTED)
        cu = args["cu_seqlens"].tolist()
        return out[cu[pos] : cu[pos + 1]], state[slots[pos]]

    alone_out, alone_state = target_bits([TARGET_SEED], [target], 0)
    for seeds, lengths, pos in [([5, TARGET_SEED, 6], [7, target, 200], 1), ([6, 5, TARGET_SEED], [90, 33, target], 2)]:
        out, state = target_bits(seeds, lengths, pos)
        assert torch.equal(out, alone_out) and torch.equal(state, alone_state)


def test_coverage_reasons(device):
    """Shapes and layouts the kernels do not take are refused with a reason, before any launch."""
    args = batch_args([0], [3], [0], device, d=24)
    d = decide(OP, args, "triton")
    assert d.backend is None and "powers of two" in d.reason
    args = batch_args([0], [3], [0], device)
    args["state"] = args["state"].transpose(2, 3)
    d = decide(OP, args, "triton")
    assert d.backend is None and "contiguous" in d.reason


def test_registration():
    assert get(OP, "triton").auto and not get(OP, "triton").variant_control
    control = get(OP, "triton-chunk-by-batch")
    assert control.variant_control and not control.auto
    assert "CONTROL" in control.description
    assert delta_rule.CHUNK_SIZE == 64  # the backend's chunk is the reference's
