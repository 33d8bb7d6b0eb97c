"""prefill_attention `aiter` (AITER's CK mha_batch_prefill_func as SGLang's forward_extend calls it), without AMD hardware.

A test double of `mha_batch_prefill_func` with the documented signature (aiter_contracts.md 2.1)
records the call and computes causal attention from the arguments it received (token pool, token
indptr, the padded kv_indices, descales), so the adapter's output is compared with the op's
reference; the assertions name SGLang's layout: the 3-D token pool, cumsum(seq_lens), and 256
padding entries equal to kv_indices[0].
"""

from __future__ import annotations

import inspect

import pytest
import torch

from gdn_lab import aiter, routing
from gdn_lab.ops import aiter_native, spec
from gdn_lab.ops.prefill_attention import aiter as ck
from gdn_lab.rules import ck_batch_prefill
from gdn_lab.rules.base import RuleEnv

prefill = spec.get("prefill_attention")
OP = prefill.name
HEADS = (8, 2, 64)
REQS = [(40, 1, 5), (3, 2, 3), (300, 3, 1), (17, 4, 17)]


def mha_batch_prefill_func(
    q, k, v, cu_seqlens_q, kv_indptr, kv_page_indices, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
    softmax_scale=None, logits_soft_cap=0.0, causal=False, window_size=(-1, -1), alibi_slopes=None,
    deterministic=False, return_lse=False, return_attn_probs=False, out=None, kv_last_page_lens=None,
    block_table=None, seqlen_k=None, q_descale=None, k_descale=None, v_descale=None, kv_block_descale=None,
    sink_ptr=None, sink_size=0,
):  # fmt: skip
    """The documented signature (aiter/ops/mha.py, aiter_contracts.md 2.1)."""


def emulate_batch_prefill(**a):
    """What the kernel computes, from its arguments only: causal varlen attention over the token pool."""
    q, k, v = a["q"], a["k"], a["v"]
    scale = a["softmax_scale"] if a["softmax_scale"] is not None else q.shape[-1] ** -0.5
    qd, kd, vd = (1.0 if a[n] is None else float(a[n][0]) for n in ("q_descale", "k_descale", "v_descale"))
    qo, kvp, idx = a["cu_seqlens_q"].tolist(), a["kv_indptr"].tolist(), a["kv_page_indices"].long()
    hq, hkv = q.shape[1], k.shape[1]
    out = torch.empty(q.shape, dtype=torch.bfloat16 if q.element_size() == 1 else q.dtype)
    for b in range(len(qo) - 1):
        tokens = idx[kvp[b] : kvp[b + 1]]
        kb = (k[tokens].double() * kd).repeat_interleave(hq // hkv, dim=1).transpose(0, 1)  # [Hq, Lk, D]
        vb = (v[tokens].double() * vd).repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        qb = (q[qo[b] : qo[b + 1]].double() * qd).transpose(0, 1)  # [Hq, Lq, D]
        lq, lk = qb.shape[1], kb.shape[1]
        s = qb @ kb.transpose(1, 2) * scale
        if a["causal"]:  # bottom-right aligned: query j sees keys up to lk - lq + j
            allowed = torch.arange(lk)[None, :] <= (lk - lq + torch.arange(lq))[:, None]
            s = s.masked_fill(~allowed, float("-inf"))
        out[qo[b] : qo[b + 1]] = (torch.softmax(s, -1) @ vb).transpose(0, 1).to(out.dtype)
    return out


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_call_is_sglangs_and_the_double_computes_the_reference(attention_args, kernel_double, dtype, page_size):
    args = attention_args(OP, REQS, HEADS, page_size=page_size, dtype=dtype, placement_seed=2)
    fake = kernel_double(mha_batch_prefill_func, emulate_batch_prefill)
    out = ck.prefill_attention_aiter(**args, kernel=fake)
    c = fake.call
    T, hq, d = args["q"].shape
    hkv = args["k_cache"].shape[2]
    assert fake.positional == [8]  # q, k, v, cu_seqlens_q, kv_indptr, kv_page_indices, max_seqlen_q, max_seqlen_k
    assert c["q"].shape == (T, hq, d) and c["q"].is_contiguous() and c["q"].dtype == dtype
    for name, cache in (("k", args["k_cache"]), ("v", args["v_cache"])):  # SGLang's 3-D token pool, a view
        assert c[name].shape == (cache.shape[0] * page_size, hkv, d) and c[name].data_ptr() == cache.data_ptr()
    lens = args["seq_lens"].long()
    assert c["cu_seqlens_q"] is args["qo_indptr"]
    assert c["kv_indptr"].dtype == torch.int32 and c["kv_indptr"].tolist() == [0, *lens.cumsum(0).tolist()]
    indices = c["kv_page_indices"]
    total = int(lens.sum())
    assert indices.dtype == torch.int32 and indices.numel() == total + 256
    assert (indices[total:] == indices[0]).all()  # SGLang's 256 padding entries
    assert c["max_seqlen_q"] == 17 and c["max_seqlen_k"] == 300
    assert c["causal"] is True and c["logits_soft_cap"] == 0.0 and c["window_size"] == (-1, -1)
    assert c["alibi_slopes"] is None and c["return_lse"] is False and c["return_attn_probs"] is False
    assert c["sink_ptr"] is None and c["q_descale"] is c["k_descale"] is c["v_descale"] is None
    assert c["softmax_scale"] is None  # SGLang leaves the default, 1/sqrt(D)
    assert c["deterministic"] is False and c["dropout_p"] == 0.0 and c["kv_last_page_lens"] is None
    assert out.dtype == dtype
    ref = routing.get(OP, "torch").run(**args)
    assert prefill.tolerance("out", dtype, "torch").holds(out, ref)


def test_fp8_cache_casts_q_and_passes_the_lab_scales(attention_args, kernel_double):
    args = attention_args(OP, REQS, HEADS, dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fnuz, placement_seed=1)
    fake = kernel_double(mha_batch_prefill_func, emulate_batch_prefill)
    out = ck.prefill_attention_aiter(**args, kernel=fake)
    c = fake.call
    assert c["q"].dtype == torch.float8_e4m3fnuz  # SGLang: q.to(fp8_dtype), unscaled
    assert float(c["q_descale"][0]) == 1.0  # SGLang passes layer.k_scale here (1.0 by default)
    assert float(c["k_descale"][0]) == float(args["k_scale"][0]) and float(c["v_descale"][0]) == float(
        args["v_scale"][0]
    )
    assert out.dtype == torch.bfloat16
    # the reference on the same fp8-rounded queries
    q8 = args["q"].to(torch.float8_e4m3fnuz).to(torch.bfloat16)
    ref = routing.get(OP, "torch").run(**{**args, "q": q8})
    assert prefill.tolerance("out", torch.bfloat16, "torch").holds(out, ref)


def test_another_scale_is_passed(attention_args, kernel_double):
    args = attention_args(OP, REQS[:1], HEADS, dtype=torch.float16)
    fake = kernel_double(mha_batch_prefill_func, emulate_batch_prefill)
    ck.prefill_attention_aiter(**{**args, "scale": 0.1}, kernel=fake)
    assert fake.call["softmax_scale"] == 0.1


def test_registered_with_the_ck_tile_rule(attention_args):
    b = routing.get(OP, "aiter")
    assert b.library.name == "aiter" and b.rule is ck_batch_prefill.RULE and not b.auto
    documented = list(aiter_native.SIGNATURES[(ck.KERNEL, ck.FUNCTION)])
    assert list(inspect.signature(mha_batch_prefill_func).parameters)[: len(documented)] == documented
    # the rule on a Qwen3-8B-like call: one query token per request, hdim 128, MI350X's 256 CUs
    one = attention_args(OP, [(20, s, 1) for s in range(6)], (32, 8, 128), dtype=torch.bfloat16)
    seven = attention_args(OP, [(20, s, 1) for s in range(7)], (32, 8, 128), dtype=torch.bfloat16)
    env = RuleEnv("gfx950", 256)
    assert (b.rule.predict(one, 0, env).key, b.rule.predict(seven, 0, env).key) == ("64x128x64", "128x128x32")


@pytest.mark.skipif(bool(torch.version.hip), reason="off ROCm only")
def test_unavailable_off_rocm(attention_args):
    avail, _ = routing.get(OP, "aiter").check(attention_args(OP, REQS, HEADS, dtype=torch.bfloat16))
    assert not avail[0] and "ROCm only" in avail[1] and "mha_batch_prefill_func" in avail[1]


@pytest.fixture
def on_gpu(monkeypatch):
    monkeypatch.setattr(aiter_native, "on_device", lambda args, tensor: (True, ""))


@pytest.mark.parametrize(
    ("heads", "options", "arch", "match"),
    [
        pytest.param(HEADS, {"dtype": torch.float32}, "gfx950", "bf16 or fp16", id="fp32"),
        pytest.param((4, 2, 20), {"dtype": torch.bfloat16}, "gfx950", "multiple of 8", id="d20"),
        pytest.param(
            (4, 2, 256), {"dtype": torch.bfloat16, "kv_dtype": torch.float8_e4m3fn}, "gfx950",
            "flash_attn_varlen_fp8_pertensor_func", id="gfx950-fp8-d256",
        ),
    ],
)  # fmt: skip
def test_outside_the_contract_is_not_covered(attention_args, on_gpu, heads, options, arch, match):
    with aiter.emulate(arch):
        ok, why = ck.covered(attention_args(OP, [(20, 1, 2)], heads, **options))
    assert not ok and match in why


def test_fp8_with_head_dim_256_is_covered_on_gfx942(attention_args, on_gpu):
    args = attention_args(OP, [(20, 1, 2)], (4, 2, 256), dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fnuz)
    with aiter.emulate("gfx942"):
        ok, why = ck.covered(args)
    assert ok and "fp8bf16" in why and "256 padding entries" in why
