"""gdn_layer_prefill `triton-fused` and its control `triton-fused-tiles-by-batch`: against the unfused torch
chain, bitwise alone vs batched (outputs, fp8, conv and delta states), and the control caught varying.

On the test device (tests/conftest.py: a GPU, or the CPU under TRITON_INTERPRET=1), on tiny shapes.
"""

from __future__ import annotations

import pytest
import torch

from gdn_lab.device import detect, fp8_dtypes_for
from gdn_lab.ops import spec
from gdn_lab.quant import quantize_groups
from gdn_lab.routing import decide, get

layer_prefill = spec.get("gdn_layer_prefill")

OP = "gdn_layer_prefill"
WIDTH = 4


def sequence(seed: int, length: int, hk: int, hv: int, d: int, dtype: torch.dtype):
    """One sequence's projections and initial states, from its own seed (the same whatever its batch)."""
    g = torch.Generator().manual_seed(seed)
    qkvz = torch.randn(length, hk * (2 * d + 2 * (hv // hk) * d), generator=g)
    ba = torch.randn(length, 2 * hv, generator=g)
    conv = torch.randn(2 * hk * d + hv * d, WIDTH - 1, generator=g)
    delta = 0.1 * torch.randn(hv, d, d, generator=g)
    return qkvz.to(dtype), ba.to(dtype), conv.to(dtype), delta


def layer_args(seeds, lengths, slots, has_init, device, *, hk=2, hv=4, d=32, dtype=torch.float32, bias=True, **kw):
    """Validated gdn_layer_prefill arguments on `device`: sequences in order, states at `slots` of NaN-padded pools."""
    seqs = [sequence(s, n, hk, hv, d, dtype) for s, n in zip(seeds, lengths)]
    g = torch.Generator().manual_seed(4321)
    conv_dim = 2 * hk * d + hv * d
    weight = (0.5 * torch.randn(conv_dim, WIDTH, generator=g)).to(dtype)
    conv_bias = (0.1 * torch.randn(conv_dim, generator=g)).to(dtype) if bias else None
    A_log, dt_bias = torch.randn(hv, generator=g), torch.randn(hv, generator=g)
    norm_weight = (1.0 + 0.1 * torch.randn(d, generator=g)).to(dtype)
    pools = len(lengths) + 2
    conv_state = torch.full((pools, conv_dim, WIDTH - 1), float("nan"), dtype=dtype)
    delta_state = torch.full((pools, hv, d, d), float("nan"))
    for slot, seq in zip(slots, seqs):
        if slot >= 0:
            conv_state[slot], delta_state[slot] = seq[2], seq[3]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    tensors = [
        torch.cat([s[0] for s in seqs]), torch.cat([s[1] for s in seqs]), conv_state, delta_state,
        torch.tensor(slots, dtype=torch.int32), cu, torch.tensor(has_init), weight, conv_bias,
        A_log, dt_bias, norm_weight,
    ]  # fmt: skip
    return layer_prefill.validate(
        *(t.to(device) if t is not None else None for t in tensors), num_k_heads=hk, num_v_heads=hv, head_dim=d, **kw
    )


def run(backend: str, args: dict):
    """((normalized, quantized, scales), conv_state, delta_state) of one call on private copies."""
    mine = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    return get(OP, backend).run(**mine), mine["conv_state"], mine["delta_state"]


def rel_mae(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).abs().mean() / ref.float().abs().mean())


def check_fp8(normalized, quantized, scales, fp8_dtype):
    """The kernel's fp8 is exactly group-128 fp8 of its own normalized output."""
    q, s = quantize_groups(normalized.reshape(normalized.shape[0], -1), fp8_dtype)
    assert quantized.dtype == fp8_dtype
    assert torch.equal(quantized.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(scales, s)


CASES = [
    # hk, hv, d, lengths, slots, has_initial_state, quantize, fp8 dtype, conv bias
    pytest.param(
        1, 2, 16, (1, 5, 63, 64, 65, 130), [3, 0, 5, -1, 1, 2], [True, False, True, True, False, True],
        False, None, True, id="hk1-hv2-d16-edges-pad",
    ),
    pytest.param(4, 4, 32, (2, 70), [1, 0], [True, True], True, torch.float8_e4m3fn, False, id="hk4-hv4-d32-e4m3fn-nobias"),
    pytest.param(1, 8, 16, (66, 3), [0, 1], [False, True], True, torch.float8_e4m3fnuz, True, id="hk1-hv8-d16-e4m3fnuz"),
]  # fmt: skip


@pytest.mark.parametrize("hk,hv,d,lengths,slots,has_init,quantize,fp8,bias", CASES)
def test_fp32_matches_the_unfused_chain(hk, hv, d, lengths, slots, has_init, quantize, fp8, bias, device):
    """fp32 end to end: normalized output and delta state within atol 1e-5 / rtol 1e-4, conv state exact."""
    if fp8 is not None and fp8 not in fp8_dtypes_for(detect(device).arch):
        pytest.skip(f"{fp8} is not an fp8 format of {detect(device).arch}")
    args = layer_args(
        range(len(lengths)),
        lengths,
        slots,
        has_init,
        device,
        hk=hk,
        hv=hv,
        d=d,
        bias=bias,
        quantize_fp8=quantize,
        fp8_dtype=fp8,
    )
    (norm, quant, scales), conv, delta = run("triton-fused", args)
    (ref_norm, _, ref_scales), ref_conv, ref_delta = run("torch", args)
    torch.testing.assert_close(norm, ref_norm, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(delta, ref_delta, atol=1e-5, rtol=1e-4, equal_nan=True)
    torch.testing.assert_close(conv, ref_conv, atol=0, rtol=0, equal_nan=True)  # a copy of inputs: exact
    unowned = sorted(set(range(conv.shape[0])) - set(slots))
    assert conv[unowned].isnan().all() and delta[unowned].isnan().all()  # slots nobody owns stay untouched
    if quantize:
        check_fp8(norm, quant, scales, fp8)
        torch.testing.assert_close(scales, ref_scales, atol=1e-8, rtol=1e-4)
    else:
        assert quant is None and scales is None
    cu = args["cu_seqlens"].tolist()
    for i, slot in enumerate(slots):
        if slot < 0:  # a padding sequence: zero rows
            assert norm[cu[i] : cu[i + 1]].eq(0).all()


def drawn_workload(seed: int) -> tuple[list[int], list[int], list[int], list[bool]]:
    """Seeds, lengths (1-140: both sides of the 64-token chunk), slots and has-initial-state of 2-4 sequences,
    drawn from `seed` alone."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 5, (1,), generator=g))
    lengths = torch.randint(1, 141, (n,), generator=g).tolist()
    slots = torch.randperm(n, generator=g).tolist()
    has_init = (torch.rand(n, generator=g) < 0.5).tolist()
    return [seed * 10 + i for i in range(n)], lengths, slots, has_init


BF16_WORKLOADS = [
    pytest.param(([3, 4], [9, 70], [1, 0], [True, False]), id="fixed"),
    *(pytest.param(drawn_workload(seed), id=f"drawn{seed}") for seed in (11, 12)),
]


@pytest.mark.parametrize("workload", BF16_WORKLOADS)
@pytest.mark.parametrize("hk,hv,d", [(2, 4, 32), (1, 2, 64)], ids=["d32", "d64"])
def test_bf16_close_to_the_unfused_chain(hk, hv, d, workload, device):
    """bf16 activations, fp8 on: output, delta state and fp8 scales each within relMAE 1e-2 of the float32
    torch chain (on a GPU the delta rule's dots take bf16 operands, but the prepare's k k^T at d 32 float32
    ones; T, v_new and the chunk states are stored in bf16); conv state exact; fp8 exact of our own output.

    The scales are bounded on average, like the output, not one by one: a scale is its group's max / 448, and on
    an H100 over 60 workloads like these a few groups of ~4,500 had their max 6-10 bf16 ulps (up to ~4 %) from
    the reference's, with the T-only prepare (4ec52f1) and e37fdf8's w-and-u prepare alike."""
    seeds, lengths, slots, has_init = workload
    args = layer_args(seeds, lengths, slots, has_init, device, hk=hk, hv=hv, d=d, dtype=torch.bfloat16,
                      quantize_fp8=True)  # fmt: skip
    (norm, quant, scales), conv, delta = run("triton-fused", args)
    (ref_norm, _, ref_scales), ref_conv, ref_delta = run("torch", args)
    assert norm.dtype == torch.bfloat16
    assert rel_mae(norm, ref_norm) <= 1e-2
    assert rel_mae(delta[slots], ref_delta[slots]) <= 1e-2
    assert torch.equal(conv[slots], ref_conv[slots])
    check_fp8(norm, quant, scales, args["fp8_dtype"])
    assert rel_mae(scales, ref_scales) <= 1e-2


TARGET_SEED, TARGET_LEN = 99, 130
BATCHES = [  # (seeds, lengths, slots, has_initial_state, target position)
    ([5, TARGET_SEED, 6], [7, TARGET_LEN, 40], [2, 0, 1], [False, True, True], 1),
    ([6, 5, 3, 4, TARGET_SEED], [40, 7, 1, 64, TARGET_LEN], [4, 1, 0, 2, 3], [True, False, True, True, True], 4),
]


def target_view(backend, seeds, lengths, slots, has_init, position, device):
    """The target's normalized, fp8 and scale rows and its conv and delta state slots."""
    args = layer_args(
        seeds, lengths, slots, has_init, device, hk=1, hv=2, d=64, dtype=torch.bfloat16, quantize_fp8=True
    )
    (norm, quant, scales), conv, delta = run(backend, args)
    cu, slot = args["cu_seqlens"].tolist(), slots[position]
    rows = slice(cu[position], cu[position + 1])
    return norm[rows], quant[rows].view(torch.uint8), scales[rows], conv[slot], delta[slot]


def test_bitwise_alone_vs_batched(device):
    """The target's outputs, fp8, scales and final conv and delta states are bitwise the same in any batch."""
    alone = target_view("triton-fused", [TARGET_SEED], [TARGET_LEN], [0], [True], 0, device)
    for seeds, lengths, slots, has_init, pos in BATCHES:
        batched = target_view("triton-fused", seeds, lengths, slots, has_init, pos, device)
        for a, b in zip(alone, batched):
            assert torch.equal(a, b)


def test_control_varies_with_the_batch(device):
    """`triton-fused-tiles-by-batch` chunks by 64 alone and by 32 in a batch of 5: the target's bits change.

    Alone it is the same computation as `triton-fused`; batched it stays close.
    """
    seeds, lengths, slots, has_init, pos = BATCHES[1]
    alone = target_view("triton-fused-tiles-by-batch", [TARGET_SEED], [TARGET_LEN], [0], [True], 0, device)
    fixed = target_view("triton-fused", [TARGET_SEED], [TARGET_LEN], [0], [True], 0, device)
    assert all(torch.equal(a, b) for a, b in zip(alone, fixed))
    norm, _, _, conv, delta = target_view("triton-fused-tiles-by-batch", seeds, lengths, slots, has_init, pos, device)
    assert not torch.equal(delta, alone[4])
    assert torch.equal(conv, alone[3])  # the conv history is a copy of inputs, whatever the chunking
    assert rel_mae(norm, alone[0]) <= 1e-2 and rel_mae(delta, alone[4]) <= 1e-2


@pytest.mark.parametrize("dtype,bias", [(torch.float32, True), (torch.bfloat16, False)], ids=["fp32-bias", "bf16"])
def test_conv_row_and_tile_forms_store_the_same_bits(dtype, bias, device):
    """The conv launch's row form (compiled) and tile form (the interpreter's) store the same bits: a 1- and
    a 2-token sequence with history, one past a chunk edge without, zeros and -0.0 in the inputs. In
    float32 no rounding hides a change in the order of the sums."""
    from gdn_lab.ops.delta_rule_triton import chunked_run
    from gdn_lab.ops.gdn_layer_prefill.triton_kernels import run_conv_kernel

    hk, hv, d, lengths = 1, 2, 16, [1, 2, 65, 5]
    args = layer_args(range(4), lengths, [3, 0, 1, 2], [True, True, False, True], device, hk=hk, hv=hv, d=d,
                      dtype=dtype, bias=bias)  # fmt: skip
    qkvz = args["projected_qkvz"].clone()
    qkvz[10:20] = 0.0
    qkvz[12:14] = -0.0
    T, conv_dim = qkvz.shape[0], 2 * hk * d + hv * d
    plan = chunked_run(args["cu_seqlens"], torch.empty(T, hv, d, device=device), hk, d, 64).plan
    stored = []
    for rows in (True, False):
        mixed = torch.full((T, conv_dim), float("nan"), dtype=dtype, device=device)
        run_conv_kernel(qkvz, args["conv_state"], args["conv_weight"], args["conv_bias"], args["has_initial_state"],
                        args["cu_seqlens"], args["cache_indices"], plan, mixed, hk, hv, d, 64, rows=rows)  # fmt: skip
        assert not mixed.isnan().any()  # every row stored
        stored.append(mixed.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    assert torch.equal(stored[0], stored[1])


def test_coverage_reasons(device):
    """A conv state that cannot hold the inputs exactly, or a non-power-of-two head, is refused with a reason."""
    args = layer_args([0], [3], [0], [True], device)
    args["conv_state"] = args["conv_state"].to(torch.bfloat16)
    d = decide(OP, args, "triton-fused")
    assert d.backend is None and "hold them exactly" in d.reason
    d = decide(OP, layer_args([0], [3], [0], [True], device, d=24), "triton-fused")
    assert d.backend is None and "powers of two" in d.reason


def test_registration():
    assert get(OP, "triton-fused").auto and not get(OP, "triton-fused").variant_control
    control = get(OP, "triton-fused-tiles-by-batch")
    assert control.variant_control and not control.auto
