"""Our Triton varlen prefill (`triton`) and its batch-variant control (`triton-tiles-by-batch`).

Closeness: against the exact causal softmax of the torch reference. Invariance: the target's rows
alone equal (torch.equal) its rows among batchmates. Sensitivity: the control's rows differ.
"""

from __future__ import annotations

import math

import pytest
import torch

from gdn_lab.device import detect, fp8_dtypes_for
from gdn_lab.ops.prefill_attention import reference
from gdn_lab.routing import dispatch, get

OP = "prefill_attention"
# (length, seed, new tokens): one token, a whole 255-token prompt, and extends across 256.
REQS = [(1, 0, 1), (255, 1, 255), (256, 2, 9), (257, 3, 40), (300, 4, 17)]
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}

CASES = [
    pytest.param((4, 2, 64), 1, torch.float32, None, True, id="fp32-D64-gqa2-page1-causal"),
    pytest.param((4, 2, 64), 16, torch.float32, None, False, id="fp32-D64-gqa2-page16-full"),
    pytest.param((2, 2, 128), 16, torch.bfloat16, None, True, id="bf16-D128-mha-page16-causal"),
    pytest.param((3, 1, 64), 1, torch.float16, None, True, id="fp16-D64-mqa3-page1-causal"),
    pytest.param((4, 2, 64), 16, torch.float32, torch.float8_e4m3fn, True, id="e4m3fn-D64-page16-causal"),
    pytest.param((2, 1, 128), 1, torch.float32, torch.float8_e4m3fnuz, True, id="e4m3fnuz-D128-page1-causal"),
]


def _target_rows(args, index):
    qo = args["qo_indptr"].tolist()
    return slice(qo[index], qo[index + 1])


@pytest.mark.parametrize(("heads", "page_size", "dtype", "kv_dtype", "causal"), CASES)
def test_matches_reference(attention_args, device, heads, page_size, dtype, kv_dtype, causal):
    if kv_dtype is not None and kv_dtype not in fp8_dtypes_for(detect(device).arch):
        pytest.skip(f"{kv_dtype} is not an fp8 format of {detect(device).arch}")
    args = attention_args(
        OP, REQS, heads, page_size=page_size, dtype=dtype, kv_dtype=kv_dtype, placement_seed=3, device=device,
        causal=causal,
    )  # fmt: skip
    out, decision = dispatch(OP, args, "triton")
    assert decision.name == "triton"
    ref = reference.prefill_attention_torch(**args)
    assert out.dtype == dtype and out.shape == args["q"].shape
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize(
    ("page_size", "dtype", "kv_dtype"),
    [
        pytest.param(1, torch.float32, None, id="fp32-page1"),
        pytest.param(16, torch.float32, torch.float8_e4m3fn, id="e4m3fn-page16"),
    ],
)
def test_triton_is_batch_invariant(attention_args, device, page_size, dtype, kv_dtype):
    heads = (4, 2, 64)
    target = (300, 100, 40)
    mates = [(500, 1, 30), (45, 2, 45), (256, 3, 3), (1, 4, 1)]
    opts = {"page_size": page_size, "dtype": dtype, "kv_dtype": kv_dtype, "device": device}
    alone = attention_args(OP, [target], heads, **opts)
    batched = attention_args(OP, mates[:2] + [target] + mates[2:], heads, placement_seed=11, **opts)
    run = get(OP, "triton").run
    out_alone = run(**alone)
    out_batched = run(**batched)
    assert torch.equal(out_batched[_target_rows(batched, 2)], out_alone)
    assert torch.equal(run(**batched, max_q_len=512), out_batched)


def test_control_differs_alone_vs_batched(attention_args, device):
    from gdn_lab.ops.prefill_attention.triton_kernels import ck_small_tile

    heads = (1, 1, 64)
    target = (300, 100, 40)
    num_sms = detect(device).num_sms
    batch = math.ceil(0.8 * num_sms) + 1  # B * Hq * ceil(max_q / 128) >= 0.8 * SMs: CK's default tile
    assert ck_small_tile(1, heads[0], target[2], num_sms)
    assert not ck_small_tile(batch, heads[0], target[2], num_sms)
    mates = [(1 + 37 * i % 200, i, 1) for i in range(batch - 1)]
    alone = attention_args(OP, [target], heads, device=device)
    batched = attention_args(OP, mates[:1] + [target] + mates[1:], heads, placement_seed=5, device=device)
    rows = _target_rows(batched, 1)
    run = get(OP, "triton-tiles-by-batch").run
    out_alone = run(**alone)
    out_batched = run(**batched)
    assert not torch.equal(out_batched[rows], out_alone)
    ref = reference.prefill_attention_torch(**alone)
    torch.testing.assert_close(out_alone, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_batched[rows], ref, atol=1e-5, rtol=1e-5)
    triton = get(OP, "triton").run
    assert torch.equal(triton(**batched)[rows], triton(**alone))


def test_control_is_registered_as_control():
    from gdn_lab.ops.prefill_attention.triton_kernels import prefill_attention_tiles_by_batch

    b = get(OP, "triton-tiles-by-batch")
    assert b.variant_control and not b.auto
    assert "batch-variant control" in prefill_attention_tiles_by_batch.__doc__


def test_bad_grid_bound(attention_args):
    args = attention_args(OP, [(5, 0, 2)], (2, 1, 64))
    with pytest.raises(ValueError, match="max_q_len"):
        get(OP, "triton").run(**args, max_q_len=-1)
