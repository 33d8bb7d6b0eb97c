"""The mi350x / mi308x presets reproduce SGLang's two MI350X deterministic-decode experiments in one run.

- its kernel test (gdn_lab.testing.SGLANG_DECODE_CASES): bf16 KV in 01_batch_invariance, fp8 KV in
  07_aiter_triton_on_any_gpu, on the `aiter` backend (paged_attention_ragged);
- its sensitivity check: CK mha_batch_prefill_func with one query token per request over prefixes
  of 4096 and 32768 tokens, with 1/3/15 batchmates, in 07 (against the CK tile rule).
"""

from __future__ import annotations

import pytest

from gdn_lab.experiments import aiter_dispatch, batch_invariance
from gdn_lab.report import presets
from gdn_lab.rules import ck_batch_prefill
from gdn_lab.testing import SGLANG_DECODE_CASES

SGLANG = SGLANG_DECODE_CASES[0]


@pytest.mark.parametrize(("name", "arch"), [("mi350x", "gfx950"), ("mi308x", "gfx942")])
def test_sglangs_kernel_test_and_sensitivity_check_are_in_the_preset(name, arch):
    p = presets.load(name)
    v01 = p.for_notebook("01_batch_invariance")
    dec = v01["op_overrides"]["decode_attention"]
    for key in ("targets", "batch_sizes", "min_context", "max_context"):
        assert dec[key] == SGLANG[key], key
    assert dec["attention"] == SGLANG["attention"] and v01["kv_dtype"] is None and v01["dtype"] == SGLANG["dtype"]
    cfg = next(
        c
        for c in batch_invariance.configs(v01["ops"], v01["op_overrides"], device="cpu", dtype=v01["dtype"])
        if c.op == "decode_attention"
    )
    assert cfg.backends is None  # every decode backend: `aiter` among them

    v07 = p.for_notebook("07_aiter_triton_on_any_gpu")
    assert v07["arch"] == arch and v07["num_cus"] is None
    d07, p07 = v07["ops"]["decode_attention"], v07["ops"]["prefill_attention"]
    assert d07["kv_dtype"] == "fp8" and "aiter" in d07["backends"]
    for key in ("targets", "batch_sizes", "min_context", "max_context"):
        assert d07[key] == SGLANG[key], key
    assert p07["backends"][0] == "aiter" and p07["new_tokens"] == 1 and p07["kv_dtype"] is None
    assert [t - 1 for t in p07["targets"]] == [4096, 32768]  # prefixes before the one new token
    assert [b - 1 for b in p07["batch_sizes"]] == [1, 3, 15]  # batchmates
    common = dict(seed=0, device="cpu", dtype=v07["dtype"], kv_dtype=v07["kv_dtype"], arch=v07["arch"],
                  attention=v07["attention"])  # fmt: skip
    for op, cases in v07["ops"].items():
        c = aiter_dispatch.DispatchConfig(**{**common, **cases, "op": op})
        assert {b.op for b in c.chosen()} == {op} and "aiter" in {b.name for b in c.chosen()}
    heads = v07["attention"]
    assert (heads["num_q_heads"], heads["num_kv_heads"], heads["head_dim"]) == (32, 8, 128)  # Qwen3-8B at TP1


def test_the_ck_rule_predicts_where_the_sensitivity_check_should_differ():
    # one query row per request, 32 heads: small tile iff 32 * batch < 0.8 * CUs
    tiles = {
        cus: [ck_batch_prefill.select_tile(b, 32, 1, 128, cus).variant for b in (1, 2, 4, 16)] for cus in (256, 80)
    }
    assert tiles[256] == ["64x128x64", "64x128x64", "64x128x64", "128x128x32"]  # MI350X: a switch at 16 only
    assert tiles[80] == ["64x128x64", "128x128x32", "128x128x32", "128x128x32"]  # MI308X: at 2, 4 and 16
