"""decode_attention `aiter` (AITER's HIP paged_attention_ragged as SGLang calls it), without AMD hardware.

The marshalling is checked against a test double of `paged_attention_ragged`: it has the documented
signature (aiter_contracts.md 1.2), records the call, and computes the documented result from the
arguments it received (token-level or paged, with the k/v scales applied to fp8 caches), so the
adapter's output is compared with the op's exact reference. On the CPU, `available()` says why
the backend cannot run and `covered()` applies the contract (past the GPU check, which the tests
lift with a monkeypatch).
"""

from __future__ import annotations

import math

import pytest
import torch

from gdn_lab import routing
from gdn_lab.ops import aiter_native, spec
from gdn_lab.ops.decode_attention import aiter as pa
from gdn_lab.rules import aiter_pa_ragged
from gdn_lab.rules.base import RuleEnv

decode = spec.get("decode_attention")
OP = decode.name
FP16 = decode.tolerance("out", torch.float16, "exact")
BF16 = decode.tolerance("out", torch.bfloat16, "exact")
HEADS = (8, 2, 64)


def paged_attention_ragged(
    out, workspace_buffer, query, key_cache, value_cache, scale, kv_indptr, kv_page_indices, kv_last_page_lens,
    block_size, max_num_partitions, alibi_slopes, kv_cache_dtype, kv_cache_layout, logits_soft_cap, k_scale,
    v_scale, fp8_out_scale=None, partition_size=256, mtp=1,
):  # fmt: skip
    """The documented signature (aiter/ops/attention.py, aiter_contracts.md 1.2)."""


def emulate_ragged(
    out, workspace_buffer, query, key_cache, value_cache, scale, kv_indptr, kv_page_indices, kv_last_page_lens,
    block_size, max_num_partitions, alibi_slopes, kv_cache_dtype, kv_cache_layout, logits_soft_cap, k_scale,
    v_scale, fp8_out_scale, partition_size, mtp,
):  # fmt: skip
    """What the kernel computes, from its arguments only: softmax attention per sequence over its pages."""
    fp8 = kv_cache_dtype == "fp8_e4m3"
    ks, vs = (float(k_scale[0]), float(v_scale[0])) if fp8 else (1.0, 1.0)
    indptr, pages = kv_indptr.tolist(), kv_page_indices.long()
    hq, hkv = query.shape[1], key_cache.shape[2]
    for i in range(query.shape[0]):
        own = pages[indptr[i] : indptr[i + 1]]
        n = (own.numel() - 1) * block_size + (int(kv_last_page_lens[i]) if block_size > 1 else 1)
        k = key_cache[own].reshape(-1, hkv, key_cache.shape[3])[:n].double() * ks
        v = value_cache[own].reshape(-1, hkv, value_cache.shape[3])[:n].double() * vs
        kh = k.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)  # [Hq, n, D]
        vh = v.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        p = torch.softmax((kh @ query[i].double()[:, :, None])[..., 0] * scale, dim=-1)  # [Hq, n]
        out[i] = (p[:, None, :] @ vh)[:, 0, :].to(out.dtype)
    return out


def double(kernel_double):
    return kernel_double(paged_attention_ragged, emulate_ragged)


REQS = [(1, 1), (255, 2), (257, 3), (40, 4)]


@pytest.mark.parametrize(
    ("dtype", "kv_dtype", "page_size"),
    [
        pytest.param(torch.bfloat16, None, 1, id="bf16-page1"),
        pytest.param(torch.float16, None, 16, id="fp16-page16"),
        pytest.param(torch.bfloat16, torch.float8_e4m3fn, 16, id="fp8-e4m3fn"),
        pytest.param(torch.float16, torch.float8_e4m3fnuz, 1, id="fp8-e4m3fnuz"),
    ],
)
def test_call_is_sglangs_and_the_double_computes_the_reference(
    attention_args, kernel_double, dtype, kv_dtype, page_size
):
    args = attention_args(OP, REQS, HEADS, page_size=page_size, dtype=dtype, kv_dtype=kv_dtype, placement_seed=3)
    fake = double(kernel_double)
    out = pa.decode_attention_aiter(**args, kernel=fake)
    c = fake.call
    B, hq, d = args["q"].shape
    hkv = args["k_cache"].shape[2]
    P = math.ceil(aiter_pa_ragged.DEFAULT_MAX_CONTEXT / 256)
    # SGLang calls positionally: 19 arguments, mtp left at its default
    assert fake.positional == [19] and c["mtp"] == 1
    assert c["out"] is out and out.shape == (B, hq, d) and out.dtype == dtype
    assert c["query"].data_ptr() == args["q"].data_ptr() and c["query"].shape == (B, hq, d)
    # token-level pages: the lab's cache as [num_tokens, 1, Hkv, D], a view (no copy)
    for name, cache in (("key_cache", args["k_cache"]), ("value_cache", args["v_cache"])):
        view = c[name]
        assert view.shape == (cache.shape[0] * page_size, 1, hkv, d) and view.data_ptr() == cache.data_ptr()
        assert view.stride() == (hkv * d, hkv * d, d, 1) and view.dtype == cache.dtype
    lens = args["seq_lens"].long()
    assert c["kv_indptr"].dtype == torch.int32 and c["kv_indptr"].tolist() == [0, *lens.cumsum(0).tolist()]
    assert c["kv_page_indices"].dtype == torch.int32 and c["kv_page_indices"].numel() == int(lens.sum())
    assert c["kv_last_page_lens"].dtype == torch.int32 and c["kv_last_page_lens"].tolist() == [1] * B
    assert c["block_size"] == 1 and c["max_num_partitions"] == P and c["partition_size"] == 256
    assert c["alibi_slopes"] is None and c["kv_cache_layout"] == "NHD" and c["logits_soft_cap"] == 0.0
    assert c["fp8_out_scale"] is None and c["scale"] == args["scale"] and isinstance(c["scale"], float)
    assert c["kv_cache_dtype"] == ("fp8_e4m3" if kv_dtype else "auto")
    # the workspace: SGLang's uint8 buffer for this batch, at least what the kernel uses
    ws = c["workspace_buffer"]
    assert ws.dtype == torch.uint8 and ws.dim() == 1
    assert ws.numel() == B * hq * P * d * 4 + 2 * B * hq * P * 4 == pa.workspace_bytes(B, hq, P, d)
    assert ws.numel() >= B * hq * P * (8 + dtype.itemsize * d)
    # k/v scales: the lab's own for fp8 (SGLang passes 1.0), ones otherwise
    for name, lab in (("k_scale", args["k_scale"]), ("v_scale", args["v_scale"])):
        s = c[name]
        assert s.dtype == torch.float32 and s.numel() >= 1
        assert float(s[0]) == (float(lab[0]) if kv_dtype else 1.0)
    tol = FP16 if dtype == torch.float16 else BF16
    assert tol.holds(out, decode.exact(args))


def test_native_pages_pass_the_lab_table_with_last_page_lengths(attention_args, kernel_double):
    args = attention_args(OP, REQS, HEADS, page_size=16, dtype=torch.float16, placement_seed=5)
    fake = double(kernel_double)
    with aiter_pa_ragged.deployment(max_context=4096, token_pages=False):
        out = pa.decode_attention_aiter(**args, kernel=fake)
    c = fake.call
    assert c["block_size"] == 16 and c["max_num_partitions"] == 16
    assert c["key_cache"] is args["k_cache"] and c["kv_page_indices"] is args["kv_indices"]
    assert c["kv_last_page_lens"].tolist() == [1, 15, 1, 8]  # 1, 255, 257, 40 tokens in pages of 16
    assert FP16.holds(out, decode.exact(args))


def test_max_num_partitions_is_held_by_the_deployment_not_the_batch(attention_args, kernel_double):
    fake = double(kernel_double)
    with aiter_pa_ragged.deployment(max_context=16384):
        for reqs in ([(1, 1)], [(1, 1), (16000, 2)], [(300, 1)] * 3):
            pa.decode_attention_aiter(**attention_args(OP, reqs, (4, 2, 16), dtype=torch.float16), kernel=fake)
    assert [c["max_num_partitions"] for c in fake.calls] == [64, 64, 64]
    env = RuleEnv("gfx950", 256)
    small = attention_args(OP, [(1, 1)], (4, 2, 16), dtype=torch.float16)
    big = attention_args(OP, [(1, 1), (16000, 2)], (4, 2, 16), dtype=torch.float16)
    keys = {aiter_pa_ragged.RULE.predict(a, 0, env).key for a in (small, big)}
    assert len(keys) == 1 and aiter_pa_ragged.RULE.expect(*keys, *keys) == "equal"


def test_registered_with_its_library_and_rule():
    b = routing.get(OP, "aiter")
    assert b.library.name == "aiter" and b.library.amd and not b.auto and b.emulated_arch is None
    assert b.rule is aiter_pa_ragged.RULE and b.rule.name == "aiter_pa_ragged" and b.reproducible
    documented = list(aiter_native.SIGNATURES[(pa.KERNEL, pa.FUNCTION)])
    import inspect

    assert list(inspect.signature(paged_attention_ragged).parameters)[: len(documented)] == documented


@pytest.mark.skipif(bool(torch.version.hip), reason="off ROCm only")
def test_unavailable_off_rocm_with_the_reason(attention_args):
    avail, cov = routing.get(OP, "aiter").check(attention_args(OP, REQS, HEADS, dtype=torch.bfloat16))
    assert not avail[0] and "ROCm only" in avail[1] and cov is None
    d = routing.decide(OP, attention_args(OP, REQS, HEADS, dtype=torch.bfloat16), "aiter")
    assert d.backend is None and "ROCm only" in d.reason


@pytest.fixture
def on_gpu(monkeypatch):
    """Lift the GPU placement check so covered() reaches the rest of the contract on the CPU."""
    monkeypatch.setattr(aiter_native, "on_device", lambda args, tensor: (True, ""))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        pytest.param({"dtype": torch.float32}, "bf16 or fp16", id="fp32-query"),
        pytest.param({"dtype": torch.bfloat16, "kv_dtype": torch.float16}, "q's dtype or fp8", id="mixed-cache"),
    ],
)
def test_outside_the_contract_is_not_covered(attention_args, on_gpu, options, match):
    ok, why = pa.covered(attention_args(OP, REQS, HEADS, **options))
    assert not ok and match in why


def test_contexts_beyond_the_deployment_are_not_covered(attention_args, on_gpu):
    args = attention_args(OP, [(300, 1), (5000, 2)], (4, 2, 16), dtype=torch.bfloat16)
    with aiter_pa_ragged.deployment(max_context=4096):
        ok, why = pa.covered(args)
    assert not ok and "5000 tokens > the deployment's max_context 4096" in why
    ok, why = pa.covered(args)
    assert ok and "max_num_partitions 160 (max_context 40960)" in why and "block_size 1" in why


def test_cpu_tensors_are_not_covered(attention_args):
    ok, why = pa.covered(attention_args(OP, REQS, HEADS, dtype=torch.bfloat16))
    assert not ok and "run on the GPU" in why
