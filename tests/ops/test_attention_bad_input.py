"""Bad input to the attention ops: a ValueError naming the parameter, before any backend runs."""

import importlib

import pytest
import torch

from gdn_lab import routing
from gdn_lab.cache import random_paged_kv
from gdn_lab.ops import decode_attention, prefill_attention


@pytest.fixture
def no_run(monkeypatch):
    """Fail if any backend runs: validation must reject before computation."""
    import gdn_lab.ops  # noqa: F401

    def boom(*a, **k):
        raise AssertionError("a backend ran on bad input")

    monkeypatch.setattr(routing, "dispatch", boom)
    for op in ("decode_attention", "prefill_attention"):  # the op modules call the name they imported
        monkeypatch.setattr(importlib.import_module(f"gdn_lab.ops.{op}"), "dispatch", boom)


def decode_args(**over):
    kv = random_paged_kv([5, 20], 2, 32, page_size=16, dtype=torch.float32)
    args = dict(q=torch.randn(2, 4, 32), **kv.op_kwargs())
    args.update(over)
    return args


@pytest.mark.usefixtures("no_run")
@pytest.mark.parametrize(
    "over, message",
    [
        (dict(q=torch.randn(2, 32)), r"q: expected 3 dims \[B, Hq, D\], got shape \(2, 32\)"),
        (dict(q=torch.randn(3, 4, 32)), r"kv_indptr: expected shape \[B\+1\] with B\+1=4 \(B=3 from q\)"),
        (
            dict(q=torch.randn(2, 4, 16)),
            r"k_cache: expected shape \[P, page, Hkv, D\] with D=16 \(from q\), got \(3, 16, 2, 32\)",
        ),
        (dict(q=torch.randn(2, 3, 32)), r"Hq \(=3\) must be divisible by Hkv \(=2\)"),
        (dict(q=torch.randn(2, 0, 32)), r"Hq: expected at least 1 \(a multiple of Hkv \(=2\)\), got 0"),
        (
            dict(q=torch.randn(2, 4, 32, dtype=torch.float64)),
            r"q: dtype float64 is not accepted; expected one of bfloat16",
        ),
        (dict(kv_indptr=torch.tensor([0, 1, 2])), r"kv_indptr: dtype int64 is not accepted; expected one of int32"),
        (
            dict(seq_lens=torch.tensor([0, 20], dtype=torch.int32)),
            r"seq_lens: every length must be > 0, but entry 0 is 0",
        ),
        (
            dict(seq_lens=torch.tensor([5, 40], dtype=torch.int32)),
            r"seq_lens: request 1 has 40 tokens but 2 pages of 16",
        ),
        (dict(kv_indices=torch.tensor([0, 1, 99], dtype=torch.int32)), r"kv_indices: entry 99 points outside"),
        (dict(kv_indices=torch.tensor([0, -1, 2], dtype=torch.int32)), r"kv_indices: entry -1 points outside"),
        (dict(kv_indptr=torch.tensor([0, 2, 1], dtype=torch.int32)), r"kv_indptr: must be non-decreasing"),
        (dict(page_size=1), r"page_size: 1 does not match k_cache's dim 1 \(=16"),
        (dict(scale=-1.0), r"scale: expected a positive finite float or None"),
        (dict(k_scale=torch.ones(1)), r"k_scale: only for fp8 KV caches"),
    ],
)
def test_decode_bad_input(over, message):
    with pytest.raises(ValueError, match=message):
        decode_attention(**decode_args(**over), backend="torch")


def test_unknown_backend_is_rejected_before_running():
    with pytest.raises(
        ValueError, match=r"backend: 'aiter-hip-v9' is not a backend of decode_attention; accepted: auto, "
    ):
        decode_attention(**decode_args(), backend="aiter-hip-v9")


def test_fp8_cache_needs_scales_and_an_arch_that_has_the_format(monkeypatch):
    kv = random_paged_kv([5], 2, 32, dtype=torch.float32, kv_dtype=torch.float8_e4m3fn)
    q = torch.randn(1, 4, 32)
    args = kv.op_kwargs()
    with pytest.raises(ValueError, match=r"k_scale: required for an fp8 KV cache"):
        decode_attention(q, **{**args, "k_scale": None})
    import gdn_lab.ops.paged_kv as paged
    from gdn_lab.device import DeviceInfo

    gfx942 = DeviceInfo("rocm", "MI308X", "gfx942", 80, torch.float8_e4m3fnuz)
    monkeypatch.setattr(paged, "detect", lambda device: gfx942)
    with pytest.raises(
        ValueError, match=r"k_cache: float8_e4m3fn is not an fp8 format of arch gfx942; accepted: float8_e4m3fnuz"
    ):
        decode_attention(q, **args)


@pytest.mark.usefixtures("no_run")
def test_prefill_bad_input():
    kv = random_paged_kv([5, 20], 2, 32, dtype=torch.float32)
    q = torch.randn(7, 4, 32)
    base = dict(
        k_cache=kv.k_cache, v_cache=kv.v_cache, kv_indptr=kv.kv_indptr, kv_indices=kv.kv_indices, seq_lens=kv.seq_lens
    )
    with pytest.raises(ValueError, match=r"qo_indptr: request 0 has 6 new tokens; accepted: 1..seq_lens\[0\] \(=5\)"):
        prefill_attention(q, qo_indptr=torch.tensor([0, 6, 7], dtype=torch.int32), **base)
    with pytest.raises(ValueError, match=r"qo_indptr: last entry 6 must equal q.shape\[0\] \(T\) \(=7\)"):
        prefill_attention(q, qo_indptr=torch.tensor([0, 2, 6], dtype=torch.int32), **base)
    with pytest.raises(ValueError, match=r"causal: expected a bool"):
        prefill_attention(q, qo_indptr=torch.tensor([0, 2, 7], dtype=torch.int32), causal=1, **base)
