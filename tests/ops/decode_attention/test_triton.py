"""Our Triton paged decode (`triton`) and its batch-variant control (`triton-splitk-by-batch`).

Closeness: both against the exact-softmax torch reference, with a tolerance per output dtype.
Invariance: the target request's row alone equals (torch.equal) its row among batchmates of other
lengths, at another position, in shuffled pages. Sensitivity: the control's row differs.
"""

from __future__ import annotations

import math

import pytest
import torch

from gdn_lab.device import detect, fp8_dtypes_for
from gdn_lab.ops.decode_attention import reference
from gdn_lab.routing import dispatch, explain, get

OP = "decode_attention"
LENGTHS = (1, 255, 256, 257, 300)  # partition edges: one token, one short of, at and past 256
# (atol, rtol) per output dtype. The interpreter computes in float32; on the GPU bf16/fp16 calls
# round P to the operand dtype before the PV product, as flash attention does.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}

CASES = [
    pytest.param((4, 2, 64), 1, torch.float32, None, id="fp32-D64-gqa2-page1"),
    pytest.param((4, 2, 64), 16, torch.float32, None, id="fp32-D64-gqa2-page16"),
    pytest.param((6, 2, 128), 16, torch.float32, None, id="fp32-D128-gqa3-page16"),
    pytest.param((2, 2, 128), 1, torch.bfloat16, None, id="bf16-D128-mha-page1"),
    pytest.param((4, 1, 64), 16, torch.float16, None, id="fp16-D64-mqa4-page16"),
    pytest.param((8, 1, 256), 16, torch.bfloat16, None, id="bf16-D256-gqa8-page16"),
    pytest.param((2, 1, 80), 1, torch.float32, None, id="fp32-D80-gqa2-page1"),
    pytest.param((4, 2, 64), 16, torch.float32, torch.float8_e4m3fn, id="e4m3fn-D64-gqa2-page16"),
    pytest.param((4, 2, 128), 1, torch.float32, torch.float8_e4m3fnuz, id="e4m3fnuz-D128-gqa2-page1"),
    pytest.param((4, 2, 64), 1, torch.bfloat16, torch.float8_e4m3fn, id="bf16-e4m3fn-D64-page1"),
]


def _skip_unstored_fp8(kv_dtype, device):
    if kv_dtype is not None and kv_dtype.itemsize == 1 and kv_dtype not in fp8_dtypes_for(detect(device).arch):
        pytest.skip(f"{kv_dtype} is not an fp8 format of {detect(device).arch}")


# The control shares the kernels; a few cases check its split arithmetic.
CONTROL_CASES = [CASES[0], CASES[2], CASES[8]]


@pytest.mark.parametrize(
    ("backend", "heads", "page_size", "dtype", "kv_dtype"),
    [pytest.param("triton", *c.values, id=f"triton-{c.id}") for c in CASES]
    + [pytest.param("triton-splitk-by-batch", *c.values, id=f"control-{c.id}") for c in CONTROL_CASES],
)
def test_matches_reference(attention_args, device, backend, heads, page_size, dtype, kv_dtype):
    _skip_unstored_fp8(kv_dtype, device)
    reqs = [(n, i) for i, n in enumerate(LENGTHS)]
    args = attention_args(
        OP, reqs, heads, page_size=page_size, dtype=dtype, kv_dtype=kv_dtype, placement_seed=3, device=device
    )
    out, decision = dispatch(OP, args, backend)
    assert decision.name == backend
    ref = reference.decode_attention_torch(**args)
    assert out.dtype == dtype and out.shape == args["q"].shape
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


INVARIANCE = [
    pytest.param(1, torch.float32, None, id="fp32-page1"),
    pytest.param(16, torch.bfloat16, None, id="bf16-page16"),
    pytest.param(16, torch.float32, torch.float8_e4m3fn, id="e4m3fn-page16"),
    pytest.param(1, torch.float32, torch.float8_e4m3fnuz, id="e4m3fnuz-page1"),
]


@pytest.mark.parametrize(("page_size", "dtype", "kv_dtype"), INVARIANCE)
def test_triton_is_batch_invariant(attention_args, device, page_size, dtype, kv_dtype):
    _skip_unstored_fp8(kv_dtype, device)
    heads = (4, 2, 64)
    target = (300, 100)
    mates = [(700, 1), (45, 2), (256, 3), (1, 4)]
    opts = {"page_size": page_size, "dtype": dtype, "kv_dtype": kv_dtype, "device": device}
    alone = attention_args(OP, [target], heads, **opts)
    batched = attention_args(OP, mates[:2] + [target] + mates[2:], heads, placement_seed=11, **opts)
    run = get(OP, "triton").run
    out_alone = run(**alone)
    out_batched = run(**batched)
    assert torch.equal(out_batched[2], out_alone[0])
    # A looser grid bound (as a CUDA graph captured for longer contexts would use) changes nothing.
    assert torch.equal(run(**batched, max_seq_len=2048), out_batched)


def test_control_differs_alone_vs_batched(attention_args, device):
    from gdn_lab.ops.decode_attention.triton_kernels import splits_for_batch

    heads = (2, 1, 64)
    target = (300, 100)
    num_sms = detect(device).num_sms
    # FA2's rule: one split once B * Hkv >= 0.8 * (2 * SMs); alone, a 300-token context splits.
    batch = math.ceil(1.6 * num_sms) + 1
    assert splits_for_batch(1, 1, heads[2], target[0], num_sms) > 1
    assert splits_for_batch(batch, 1, heads[2], target[0], num_sms) == 1
    mates = [(1 + 37 * i % 200, i) for i in range(batch - 1)]
    alone = attention_args(OP, [target], heads, device=device)
    batched = attention_args(OP, mates[:1] + [target] + mates[1:], heads, placement_seed=5, device=device)
    run = get(OP, "triton-splitk-by-batch").run
    out_alone = run(**alone)
    out_batched = run(**batched)
    assert not torch.equal(out_batched[1], out_alone[0])
    torch.testing.assert_close(out_batched[1], out_alone[0], atol=1e-5, rtol=1e-5)
    # The invariant kernel on the same two calls agrees with itself.
    triton = get(OP, "triton").run
    assert torch.equal(triton(**batched)[1], triton(**alone)[0])


def test_num_splits_heuristic():
    from gdn_lab.ops.decode_attention.triton_kernels import num_splits_heuristic

    # FA2's own example: 48 (batch x heads) programs on 108 SMs give 2 splits.
    assert num_splits_heuristic(48, 108, 64) == 2
    assert num_splits_heuristic(87, 108, 64) == 1  # >= 80 % of the SMs: no split
    assert num_splits_heuristic(1, 8, 3) == 3  # capped by the key blocks
    assert num_splits_heuristic(1, 8, 1) == 1


def test_registration(attention_args, device):
    heads = (4, 2, 64)
    args = attention_args(OP, [(5, 0), (300, 1)], heads, device=device)
    rows = {r["backend"]: r for r in explain(OP, args)}
    assert rows["triton"]["covered"] and rows["triton"]["auto"] and not rows["triton"]["variant_control"]
    control = rows["triton-splitk-by-batch"]
    assert control["variant_control"] and not control["auto"]
    from gdn_lab.ops.decode_attention.triton_kernels import decode_attention_splitk_by_batch

    assert "batch-variant control" in decode_attention_splitk_by_batch.__doc__


def test_bad_grid_bound(attention_args):
    run = get(OP, "triton").run
    args = attention_args(OP, [(5, 0)], (2, 1, 64))
    with pytest.raises(ValueError, match="max_seq_len"):
        run(**args, max_seq_len=0)


def test_reduce_across_chunks(attention_args, device, monkeypatch):
    """The reduce's running-max rescale between chunks of partitions (BP = 2 here; 32+ on a GPU)."""
    from gdn_lab.ops.decode_attention import triton_kernels as triton_decode

    monkeypatch.setattr(triton_decode, "_REDUCE_TILE", 128)  # BP = 128 // 64 = 2 partitions
    heads = (4, 2, 64)
    args = attention_args(OP, [(1100, 0), (300, 1), (513, 2)], heads, placement_seed=2, device=device)
    out = get(OP, "triton").run(**args)
    torch.testing.assert_close(out, reference.decode_attention_torch(**args), atol=1e-5, rtol=1e-5)
    alone = attention_args(OP, [(1100, 0)], heads, device=device)
    assert torch.equal(get(OP, "triton").run(**alone)[0], out[0])
