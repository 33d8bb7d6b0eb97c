"""Paged caches place each request's K/V so that reading its pages gives them back exactly."""

import pytest
import torch

from gdn_lab.cache import build_paged_kv, conv_state_pool, gdn_state_pool, page_table, random_kv
from gdn_lab.quant import quantize_per_tensor


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("shuffle", [True, False])
def test_page_table_gives_each_request_its_own_pages(page_size, shuffle):
    lens = [1, 16, 17, 300]
    indptr, indices, num_pages = page_table(lens, page_size, seed=3, shuffle=shuffle, spare_pages=4)
    assert [indptr[i + 1] - indptr[i] for i in range(4)] == [-(-n // page_size) for n in lens]
    assert len(set(indices)) == len(indices) == indptr[-1] and num_pages == indptr[-1] + 4
    assert all(0 <= p < num_pages for p in indices)
    assert (indices == sorted(indices)) != shuffle


@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fnuz])
def test_gathering_pages_gives_back_the_requests(kv_dtype):
    kv = [random_kv(n, 2, 8, dtype=torch.bfloat16, device="cpu", seed=n) for n in (5, 33)]
    cache = build_paged_kv([k for k, _ in kv], [v for _, v in kv], page_size=16, kv_dtype=kv_dtype, k_scale=0.5)
    for b, (k, _) in enumerate(kv):
        pages = cache.kv_indices[cache.kv_indptr[b] : cache.kv_indptr[b + 1]].long()
        got_k = cache.k_cache[pages].reshape(-1, 2, 8)
        n = int(cache.seq_lens[b])
        want = k if kv_dtype is None else quantize_per_tensor(k, kv_dtype, 0.5)[0]
        assert torch.equal(got_k[:n].view(torch.uint8), want.view(torch.uint8))
        assert bool(got_k[n:].float().isnan().all())  # the tail of the last page is poison
    if kv_dtype is not None:
        assert float(cache.k_scale) == 0.5 and float(cache.v_scale) == 1.0


def test_same_content_whatever_the_seed_of_placement():
    k, v = random_kv(40, 1, 4, dtype=torch.float32, device="cpu", seed=7)
    a = build_paged_kv([k], [v], page_size=1, seed=1)
    b = build_paged_kv([k], [v], page_size=1, seed=2, spare_pages=10)
    assert not torch.equal(a.kv_indices, b.kv_indices)
    assert torch.equal(a.k_cache[a.kv_indices.long()], b.k_cache[b.kv_indices.long()])


def test_state_pools():
    assert gdn_state_pool(3, 4, 8, 16).shape == (3, 4, 8, 16)
    assert torch.equal(gdn_state_pool(2, 2, 4, 4, seed=1), gdn_state_pool(2, 2, 4, 4, seed=1))
    assert conv_state_pool(2, 10, 4).shape == (2, 10, 3)


def test_bad_cache_input():
    with pytest.raises(ValueError, match="seq_lens: every length must be > 0, but entry 1 is 0"):
        page_table([3, 0], 1)
    with pytest.raises(ValueError, match="keys, values: expected the same non-zero number of requests"):
        build_paged_kv([], [])
    with pytest.raises(ValueError, match=r"kv_dtype: int8 is not accepted"):
        build_paged_kv([torch.ones(2, 1, 4)], [torch.ones(2, 1, 4)], kv_dtype=torch.int8)


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (([5, -1], 2, 8), {}, r"seq_lens: every length must be a positive int, but entry 1 is -1"),
        (([0], 2, 8), {}, r"seq_lens: every length must be a positive int, but entry 0 is 0"),
        (([], 2, 8), {}, r"seq_lens: expected a non-empty list of positive ints, got \[\]"),
        (([2.5], 2, 8), {}, r"seq_lens: every length must be a positive int, but entry 0 is 2.5"),
        ((5, 2, 8), {}, r"seq_lens: expected a non-empty list"),
        (([5], 0, 8), {}, r"num_kv_heads: expected a positive int, got 0"),
        (([5], 2, -8), {}, r"head_dim: expected a positive int, got -8"),
        (([5], 2, 8), {"page_size": 0}, r"page_size: expected a positive int, got 0"),
    ],
)
def test_random_paged_kv_rejects_bad_sizes(args, kwargs, message):
    from gdn_lab.cache import random_paged_kv

    with pytest.raises(ValueError, match=message):
        random_paged_kv(*args, **kwargs)
