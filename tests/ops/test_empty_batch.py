"""An empty batch (B = 0 requests, T = 0 tokens) is a legitimate serving state: every backend that
covers it on the test device returns empty outputs and leaves every state slot untouched."""

from __future__ import annotations

import pytest
import torch

import gdn_lab.ops  # noqa: F401  (registers every op)
from gdn_lab import routing
from gdn_lab.cache import random_paged_kv
from gdn_lab.ops import spec

ROWS = {  # per op: the arguments whose first axis is the batch's requests or tokens
    "decode_attention": ("q", "kv_indices", "seq_lens"),
    "prefill_attention": ("q", "kv_indices", "seq_lens"),
    "gdn_decode": ("q", "k", "v", "a", "b", "slots"),
    "gdn_prefill": ("q", "k", "v", "a", "b", "slots"),
    "gdn_layer_prefill": ("projected_qkvz", "projected_ba", "cache_indices", "has_initial_state"),
    "causal_conv1d_update": ("x", "slots"),
    "matmul": ("x",),
    "rms_norm": ("x",),
}
INDPTR = ("kv_indptr", "qo_indptr", "cu_seqlens")  # prefix sums: [0] for no request


def empty_args(op: str, device: torch.device, dtype: torch.dtype, page_size: int = 1) -> dict:
    ex = dict(spec.get(op).example(device=device, dtype=dtype))
    if op in ("decode_attention", "prefill_attention") and page_size != 1:
        kv = random_paged_kv(
            [5], ex["k_cache"].shape[2], ex["k_cache"].shape[3], page_size=page_size, dtype=dtype, device=device
        )
        ex.update(kv.op_kwargs())
    for name in ROWS[op]:
        ex[name] = ex[name][:0]
    for name in INDPTR:
        if name in ex:
            ex[name] = ex[name][:1]
    return ex


CASES = [pytest.param(op, b.name, id=f"{op}-{b.name}") for op in ROWS for b in routing.backends(op)]


@pytest.mark.parametrize("op, backend", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_every_covered_backend_handles_an_empty_batch(op, backend, dtype, device):
    page = 16 if backend.startswith("aiter") and op.endswith("attention") else 1  # AITER's pages are >= 16
    args = empty_args(op, device, dtype, page)  # the example's validated arguments, cut to no request
    before = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
    decision = routing.decide(op, dict(args), backend)
    if decision.backend is None:
        pytest.skip(f"{backend} does not run here: {decision.reason}")
    mine = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    result = decision.backend.run(**mine)
    for out in result if isinstance(result, tuple) else (result,):
        if out is not None:
            assert out.shape[0] == 0, (backend, tuple(out.shape))
    for state in spec.get(op).states:
        assert torch.equal(mine[state].nan_to_num(7.0), before[state].nan_to_num(7.0)), f"{backend} wrote {state}"
