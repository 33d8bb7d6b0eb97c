"""Paged attention inputs for the kernel tests here: requests whose content comes from their own seeds.

A request keeps its K/V and queries whatever batch it is placed in, at whatever position and in
whatever pages, so `out_batched[rows of target] == out_alone` is a meaningful invariance check.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from gdn_lab.cache import build_paged_kv, random_kv
from gdn_lab.ops import spec

decode, prefill = spec.get("decode_attention"), spec.get("prefill_attention")

# fp8 caches store x / scale; these scales keep standard-normal K/V inside e4m3fnuz's range (240).
K_SCALE, V_SCALE = 0.05, 0.03


class Req(NamedTuple):
    """One request: `length` cached tokens, the last `new` of them being its queries (decode: 1)."""

    length: int
    seed: int
    new: int = 1


class Heads(NamedTuple):
    """Query heads, KV heads, head dim."""

    hq: int
    hkv: int
    d: int


def build_args(
    op: str,
    reqs: list[tuple[int, ...]],
    heads: tuple[int, int, int],
    *,
    page_size: int = 1,
    dtype: torch.dtype = torch.float32,
    kv_dtype: torch.dtype | None = None,
    placement_seed: int | None = None,
    device: torch.device | str = "cpu",
    causal: bool = True,
) -> dict:
    """Validated arguments of `op` ("decode_attention" or "prefill_attention") for `reqs`.

    reqs are (length, seed) or (length, seed, new) tuples (see Req); heads is (Hq, Hkv, D).

    placement_seed None keeps pages in request order with no spare pages; an int shuffles the
    pages over a pool with 5 unowned (NaN) pages.
    """
    reqs = [Req(*r) for r in reqs]
    heads = Heads(*heads)
    kvs = [random_kv(r.length, heads.hkv, heads.d, dtype=torch.float32, device=device, seed=r.seed) for r in reqs]
    fp8 = kv_dtype is not None and kv_dtype.itemsize == 1
    kv = build_paged_kv(
        [k.to(kv_dtype or dtype) if not fp8 else k for k, _ in kvs],
        [v.to(kv_dtype or dtype) if not fp8 else v for _, v in kvs],
        page_size=page_size,
        kv_dtype=kv_dtype,
        k_scale=K_SCALE if fp8 else None,
        v_scale=V_SCALE if fp8 else None,
        seed=placement_seed or 0,
        shuffle=placement_seed is not None,
        spare_pages=0 if placement_seed is None else 5,
    )
    qs = [
        torch.randn(r.new, heads.hq, heads.d, generator=torch.Generator().manual_seed(10_000 + r.seed)).to(
            device=device, dtype=dtype
        )
        for r in reqs
    ]
    if op == decode.name:
        return decode.validate(torch.cat(qs), **kv.op_kwargs())
    qo = torch.tensor([0] + [r.new for r in reqs], dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    return prefill.validate(
        torch.cat(qs),
        kv.k_cache,
        kv.v_cache,
        qo,
        kv.kv_indptr,
        kv.kv_indices,
        kv.seq_lens,
        page_size=page_size,
        causal=causal,
        k_scale=kv.k_scale,
        v_scale=kv.v_scale,
    )


@pytest.fixture
def attention_args():
    """`build_args` as a fixture: attention_args(op, reqs, heads, **options) -> validated args."""
    return build_args
