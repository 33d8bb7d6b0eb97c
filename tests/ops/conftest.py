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


class KernelDouble:
    """A test double standing in for one AITER function, passed through an adapter's `kernel=` seam.

    It has the documented signature (a stub function with AITER's parameter list, defaults
    included), binds every call to it, so an argument passed in the wrong position lands on the
    wrong name, records the bound arguments and how many came positionally, and, when given an
    `emulate` function, computes the documented result from those arguments alone (so the
    adapter's output can be compared with the op's reference: wrong marshalling gives a wrong
    answer).
    """

    def __init__(self, documented, emulate=None):
        import inspect

        self.signature = inspect.signature(documented)
        self.emulate = emulate
        self.calls: list[dict] = []
        self.positional: list[int] = []

    def __call__(self, *args, **kwargs):
        bound = self.signature.bind(*args, **kwargs)  # TypeError for an undocumented argument
        bound.apply_defaults()
        self.calls.append(dict(bound.arguments))
        self.positional.append(len(args))
        return self.emulate(**bound.arguments) if self.emulate else None

    @property
    def call(self) -> dict:
        assert len(self.calls) == 1, f"expected one call, got {len(self.calls)}"
        return self.calls[0]


@pytest.fixture
def kernel_double():
    """`KernelDouble` as a fixture: kernel_double(documented_stub, emulate=None)."""
    return KernelDouble


@pytest.fixture
def gdn_decode_args():
    """gdn_decode_args(batch, heads=(HK, HV, D), dtype, bf16_gates=False, seed=0) -> validated arguments.

    bf16_gates: dt_bias stored in bfloat16 (as a bf16 checkpoint holds it); otherwise float32 values
    that bfloat16 represents exactly, so an adapter's cast to bf16 changes nothing.
    """
    from gdn_lab.ops import spec
    from gdn_lab.ops.batch import BuildOptions, GDNShape
    from gdn_lab.workloads import build, make_batch, target_request

    def make(batch, heads=(2, 8, 128), dtype=torch.bfloat16, bf16_gates=False, seed=0):
        hk, hv, d = heads
        target = target_request(1, seed)
        args = build("gdn_decode", make_batch(target, batch, seed=seed, max_len=1), GDNShape(hk, hv, d),
                     BuildOptions(dtype=dtype))  # fmt: skip
        dt = args["dt_bias"].to(torch.bfloat16)
        args["dt_bias"] = dt if bf16_gates else dt.float()
        return spec.get("gdn_decode").validate(**{k: v for k, v in args.items() if k not in ("scale",)})

    return make
