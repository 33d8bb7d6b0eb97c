"""The attention references against a dense softmax over the requests' own (unpaged) K/V."""

import pytest
import torch
import torch.nn.functional as F

from gdn_lab.cache import build_paged_kv, random_kv
from gdn_lab.ops import decode_attention, prefill_attention
from gdn_lab.quant import quantize_per_tensor


def dense_attention(q, k, v, scale, causal_offset=None):
    """Float64 softmax attention. q [Lq, Hq, D]; k, v [L, Hkv, D]; query i sits at causal_offset + i."""
    group = q.shape[1] // k.shape[1]
    qh = q.double().transpose(0, 1)  # [Hq, Lq, D]
    kh = k.double().repeat_interleave(group, dim=1).transpose(0, 1)
    vh = v.double().repeat_interleave(group, dim=1).transpose(0, 1)
    mask = None
    if causal_offset is not None:
        pos = torch.arange(q.shape[0])[:, None] + causal_offset
        mask = torch.arange(k.shape[0])[None, :] <= pos
    return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale).transpose(0, 1)


def requests(lengths, hkv, d, dtype, seed=0):
    return [random_kv(n, hkv, d, dtype=dtype, device="cpu", seed=seed + i) for i, n in enumerate(lengths)]


CASES = [
    pytest.param([1, 255, 256, 257], 1, 4, 2, 64, id="page1-gqa2-partition-edges"),
    pytest.param([17, 300, 33], 16, 8, 2, 128, id="page16-gqa4"),
    pytest.param([5, 40], 16, 3, 3, 64, id="page16-mha"),
]


@pytest.mark.parametrize("lengths, page_size, hq, hkv, d", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decode_matches_dense_softmax(lengths, page_size, hq, hkv, d, dtype):
    kv = requests(lengths, hkv, d, dtype)
    cache = build_paged_kv([k for k, _ in kv], [v for _, v in kv], page_size=page_size, seed=3)
    q = torch.randn(len(lengths), hq, d, generator=torch.Generator().manual_seed(9)).to(dtype)
    out = decode_attention(q, **cache.op_kwargs(), backend="torch")
    tol = 1e-5 if dtype == torch.float32 else 2**-8
    for b, (k, v) in enumerate(kv):
        ref = dense_attention(q[b : b + 1], k, v, d**-0.5)[0]
        torch.testing.assert_close(out[b].double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz], ids=["e4m3fn", "e4m3fnuz"])
def test_decode_fp8_cache_matches_dense_softmax_of_dequantized_kv(fp8):
    kv = requests([7, 300], 2, 64, torch.bfloat16)
    cache = build_paged_kv(
        [k for k, _ in kv], [v for _, v in kv], page_size=16, kv_dtype=fp8, k_scale=0.05, v_scale=0.02
    )
    assert cache.k_cache.dtype == fp8 and float(cache.k_scale) == pytest.approx(0.05)
    q = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    out = decode_attention(q, **cache.op_kwargs(), backend="torch")
    for b, (k, v) in enumerate(kv):
        kd = quantize_per_tensor(k, fp8, 0.05)[0].double() * 0.05
        vd = quantize_per_tensor(v, fp8, 0.02)[0].double() * 0.02
        ref = dense_attention(q[b : b + 1], kd, vd, 64**-0.5)[0]
        torch.testing.assert_close(out[b].double(), ref, atol=2**-8, rtol=2**-8)


@pytest.mark.parametrize("causal", [True, False])
def test_prefill_matches_dense_causal_softmax(causal):
    lengths, new = [9, 300, 1], [4, 37, 1]
    kv = requests(lengths, 2, 64, torch.float32)
    cache = build_paged_kv([k for k, _ in kv], [v for _, v in kv], page_size=16, seed=5)
    q = torch.randn(sum(new), 6, 64, generator=torch.Generator().manual_seed(2))
    qo = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    out = prefill_attention(
        q, cache.k_cache, cache.v_cache, qo, cache.kv_indptr, cache.kv_indices, cache.seq_lens,
        page_size=16, causal=causal, backend="torch",
    )  # fmt: skip
    for b, (k, v) in enumerate(kv):
        rows = slice(int(qo[b]), int(qo[b + 1]))
        ref = dense_attention(q[rows], k, v, 64**-0.5, lengths[b] - new[b] if causal else None)
        torch.testing.assert_close(out[rows].double(), ref, atol=1e-5, rtol=1e-5)


def test_prefill_of_one_new_token_is_decode():
    kv = requests([50, 3], 2, 32, torch.float32)
    cache = build_paged_kv([k for k, _ in kv], [v for _, v in kv], page_size=1)
    q = torch.randn(2, 4, 32)
    dec = decode_attention(q, **cache.op_kwargs(), backend="torch")
    qo = torch.tensor([0, 1, 2], dtype=torch.int32)
    pre = prefill_attention(q, cache.k_cache, cache.v_cache, qo, cache.kv_indptr, cache.kv_indices, cache.seq_lens)
    torch.testing.assert_close(pre, dec, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_partitioned_is_within_bf16_rounding_of_the_exact_softmax(kv_dtype):
    """Partials rounded to bf16 then merged: |err| <= 2^-9 (max|v| + |out|), one rounding each."""
    lengths = [1, 255, 256, 257, 1000]
    kv = requests(lengths, 2, 64, torch.bfloat16, seed=11)
    cache = build_paged_kv([k for k, _ in kv], [v for _, v in kv], page_size=16, kv_dtype=kv_dtype)
    q = torch.randn(len(lengths), 4, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    part = decode_attention(q, **cache.op_kwargs(), backend="torch-partitioned")
    if kv_dtype is None:
        for b, (k, v) in enumerate(kv):
            exact = dense_attention(q[b : b + 1], k, v, 64**-0.5)[0]
            vmax = v.double().abs().amax()
            bound = 2**-9 * (vmax + exact.abs()) * 1.01
            assert bool(((part[b].double() - exact).abs() <= bound).all()), b
    else:
        # fp8 probabilities (3 mantissa bits) before PV: a relative error of 2^-4 per weight.
        exact = decode_attention(q, **cache.op_kwargs(), backend="torch").double()
        vmax = max(float(v.abs().max()) for _, v in kv)
        assert float((part.double() - exact).abs().max()) <= 2**-4 * vmax


@pytest.mark.parametrize("backend", ["torch", "torch-partitioned"])
def test_reference_is_bitwise_equal_alone_and_batched(backend):
    """The target (257 tokens) alone, then between batchmates, in other pages."""
    mates = requests([3, 1000, 70], 2, 64, torch.bfloat16, seed=50)
    (target,) = requests([257], 2, 64, torch.bfloat16, seed=7)
    q_t = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q_m = torch.randn(3, 4, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    alone = build_paged_kv([target[0]], [target[1]], page_size=16, seed=1)
    ks = [mates[0][0], target[0], mates[1][0], mates[2][0]]
    vs = [mates[0][1], target[1], mates[1][1], mates[2][1]]
    batched = build_paged_kv(ks, vs, page_size=16, seed=2, spare_pages=5)
    q = torch.cat([q_m[:1], q_t, q_m[1:]])
    a = decode_attention(q_t, **alone.op_kwargs(), backend=backend)
    b = decode_attention(q, **batched.op_kwargs(), backend=backend)
    assert torch.equal(a[0], b[1])
