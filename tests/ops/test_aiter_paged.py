"""AITER's Triton attention kernels (amd-aiter wheel) as lab backends.

On the CPU they run under Triton's interpreter (conftest sets TRITON_INTERPRET=1) in fp16, with
AITER told it runs on gfx950 (or gfx942). Closeness to the exact (float64) softmax uses
the op's tolerance against "exact" for float16: |out - exact| <= 2^-10 + 2^-10 * |exact|, one fp16 ulp
at 1.0 on each term (the kernels round q * scale and the probabilities to fp16 before each tl.dot,
and the output once). Invariance is torch.equal, with the dispatch rule saying where it must fail.
"""

from __future__ import annotations

import pytest
import torch

from gdn_lab import aiter, routing
from gdn_lab.ops import aiter_paged, spec
from gdn_lab.ops.paged_kv import gather_request
from gdn_lab.rules import aiter_pa_decode, aiter_unified_attention

decode, prefill = spec.get("decode_attention"), spec.get("prefill_attention")
exact_decode_attention = decode.exact
FP16 = decode.tolerance("out", torch.float16, "exact")

pytestmark = pytest.mark.skipif(
    not aiter.probe().installed, reason="amd-aiter is not installed (pip install 'gdn_lab[aiter-triton]')"
)

DECODE = decode.name
PA, UNIFIED = "aiter-triton-pa", "aiter-triton-unified"


def within_fp16_tolerance(out: torch.Tensor, exact: torch.Tensor) -> bool:
    return FP16.holds(out, exact)


def run(backend: str, args: dict) -> torch.Tensor:
    decision = routing.route(DECODE, args, backend)
    return decision.backend.run(**args)


# --- layout conversions (plain torch) -------------------------------------------------------


def test_block_table_lists_each_requests_pages(attention_args):
    args = attention_args(DECODE, [(40, 1), (3, 2), (100, 3)], (4, 2, 16), page_size=16, placement_seed=7)
    table = aiter_paged.block_table(args["kv_indptr"], args["kv_indices"], 3)
    indptr = args["kv_indptr"].tolist()
    assert table.dtype == torch.int32 and table.shape == (3, 7)
    for b in range(3):
        pages = args["kv_indices"][indptr[b] : indptr[b + 1]]
        assert torch.equal(table[b, : pages.numel()], pages)
        assert not table[b, pages.numel() :].any()


def test_head_major_and_zeroed_tails_keep_every_token(attention_args):
    args = attention_args(DECODE, [(40, 1), (16, 2), (1, 3)], (4, 2, 16), page_size=16, placement_seed=3)
    k = args["k_cache"]
    head_major = aiter_paged.to_head_major(k)
    assert head_major.is_contiguous() and head_major.shape == (k.shape[0], 2, 16, 16)
    assert torch.equal(head_major.permute(0, 2, 1, 3).nan_to_num(7.0), k.nan_to_num(7.0))
    zeroed = aiter_paged.zero_unused_slots(k, args["kv_indptr"], args["kv_indices"], args["seq_lens"])
    indptr = args["kv_indptr"].tolist()
    for b, n in enumerate(args["seq_lens"].tolist()):
        pages = args["kv_indices"][indptr[b] : indptr[b + 1]].long()
        tokens = zeroed[pages].reshape(-1, 2, 16)
        assert torch.equal(tokens[:n], gather_request(k, indptr, args["kv_indices"], b, n, None).to(k.dtype))
        assert not tokens[n:].any()  # the kernels read these: zero, not NaN
    assert k.isnan().any()  # the lab's cache is not modified


def test_gather_contiguous_concatenates_requests(attention_args):
    args = attention_args(prefill.name, [(40, 1, 5), (3, 2, 3), (17, 3, 2)], (4, 2, 16), page_size=16, placement_seed=5)
    flat = aiter_paged.gather_contiguous(args["k_cache"], args["kv_indptr"], args["kv_indices"], args["seq_lens"])
    indptr, lens = args["kv_indptr"].tolist(), args["seq_lens"].tolist()
    parts = [gather_request(args["k_cache"], indptr, args["kv_indices"], b, n, None) for b, n in enumerate(lens)]
    assert torch.equal(flat.float(), torch.cat(parts))
    assert torch.equal(aiter_paged.cu_seqlens(args["seq_lens"]), torch.tensor([0, 40, 43, 60], dtype=torch.int32))


# --- contracts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "heads", "match"),
    [
        pytest.param({"page_size": 1, "dtype": torch.float16}, (4, 2, 16), "power of two", id="page-1"),
        pytest.param({"page_size": 24, "dtype": torch.float16}, (4, 2, 16), "power of two", id="page-24"),
        pytest.param({"page_size": 16, "dtype": torch.float32}, (4, 2, 16), "bf16 or fp16", id="fp32"),
        pytest.param({"page_size": 16, "dtype": torch.float16}, (4, 2, 8), "head_dim 8", id="d8"),
        pytest.param(
            {"page_size": 16, "dtype": torch.float16, "kv_dtype": torch.float8_e4m3fnuz},
            (4, 2, 16),
            "gfx950",
            id="fnuz",
        ),
    ],
)
@pytest.mark.parametrize("backend", [PA, UNIFIED])
def test_calls_outside_the_contract_are_not_covered(attention_args, device, backend, options, heads, match):
    if options.get("kv_dtype") == torch.float8_e4m3fnuz and device.type == "cuda":
        pytest.skip("the lab accepts only the device's own fp8 format on a GPU")
    args = attention_args(DECODE, [(20, 1)], heads, device=device, **options)
    d = routing.decide(DECODE, args, backend)
    assert d.backend is None and match in d.reason


def test_bf16_is_refused_under_the_interpreter(attention_args):
    if torch.cuda.is_available():
        pytest.skip("the interpreter's bf16 tl.dot problem is CPU-only")
    args = attention_args(DECODE, [(20, 1)], (4, 2, 16), page_size=16, dtype=torch.bfloat16)
    assert "interpreter" in routing.decide(DECODE, args, PA).reason


def test_backends_are_never_picked_by_auto(attention_args):
    args = attention_args(DECODE, [(20, 1)], (4, 2, 16), page_size=16, dtype=torch.float16)
    assert routing.decide(DECODE, args).name not in (PA, UNIFIED)


# --- accuracy against the exact softmax -----------------------------------------------------


@pytest.mark.parametrize("page_size", [16, 32])
@pytest.mark.parametrize("backend", [PA, UNIFIED])
def test_matches_the_exact_softmax(attention_args, device, backend, page_size):
    reqs = [(1, 1), (17, 2), (1100, 3), (64, 4)]
    args = attention_args(
        DECODE, reqs, (4, 2, 32), page_size=page_size, dtype=torch.float16, placement_seed=2, device=device
    )
    with aiter.emulate(num_cus=1):  # a small CU count keeps unified's 3D split cheap under the interpreter
        out = run(backend, args)
    assert out.dtype == torch.float16 and within_fp16_tolerance(out, exact_decode_attention(args))


@pytest.mark.parametrize(
    ("arch", "kv_dtype"), [("gfx950", torch.float8_e4m3fn), ("gfx942", torch.float8_e4m3fnuz)], ids=["gfx950", "gfx942"]
)
@pytest.mark.parametrize("backend", [PA, UNIFIED])
def test_fp8_cache_of_the_emulated_arch(attention_args, device, backend, arch, kv_dtype):
    if device.type == "cuda" and kv_dtype == torch.float8_e4m3fnuz:
        pytest.skip("NVIDIA GPUs have no e4m3fnuz")
    reqs = [(700, 1), (30, 2)]
    args = attention_args(DECODE, reqs, (4, 2, 32), page_size=16, dtype=torch.float16, kv_dtype=kv_dtype, device=device)
    with aiter.emulate(arch, num_cus=1):
        out = run(backend, args)
    assert within_fp16_tolerance(out, exact_decode_attention(args))


# --- the dispatch rule shows in the bits ----------------------------------------------------


def target_out(backend: str, attention_args, reqs, heads, device, seed) -> tuple[torch.Tensor, dict]:
    """Request 0's output and the call's arguments (pages shuffled by `seed`)."""
    args = attention_args(DECODE, reqs, heads, page_size=16, dtype=torch.float16, placement_seed=seed, device=device)
    return run(backend, args)[0], args


def test_pa_v1_v2_switch_shows_in_the_bits(attention_args, device):
    heads = (32, 2, 16)  # 32 query heads: V1 from 17 requests (17 * 32 > 512)
    target, mate = (1100, 1), (5, 9)
    small, a_small = target_out(PA, attention_args, [target, mate], heads, device, 1)
    small2, a_small2 = target_out(PA, attention_args, [target, mate, mate], heads, device, 2)
    big, a_big = target_out(PA, attention_args, [target] + [mate] * 16, heads, device, 3)
    p = {n: aiter_pa_decode.predict_call(a) for n, a in (("2", a_small), ("3", a_small2), ("17", a_big))}
    assert (p["2"].variant, p["3"].variant, p["17"].variant) == ("v2", "v2", "v1")
    assert torch.equal(small, small2)  # predicted stable: both V2
    assert not torch.equal(small, big)  # predicted switch: V2 -> V1
    short, a_short = target_out(PA, attention_args, [(300, 1)], heads, device, 4)
    short_v2, a_short_v2 = target_out(PA, attention_args, [(300, 1), (2000, 5)], heads, device, 5)
    p_alone, p_v2 = aiter_pa_decode.predict_call(a_short), aiter_pa_decode.predict_call(a_short_v2)
    assert (p_alone.variant, p_v2.variant) == ("v1", "v2")
    assert aiter_pa_decode.numerics_key(p_alone, 300) == aiter_pa_decode.numerics_key(p_v2, 300)
    assert torch.equal(short, short_v2)  # one partition: V2 stores V1's bits, as the rule's key says


def test_unified_2d_3d_switch_shows_in_the_bits(attention_args, device):
    heads = (4, 2, 16)  # BLOCK_Q = 8: num_2d_prgms = (B // 8 + B) * 2 against 4 x num_cus
    target, mate = (600, 1), (5, 9)
    with aiter.emulate(num_cus=1):
        alone, a_alone = target_out(UNIFIED, attention_args, [target], heads, device, 1)
        three, a_three = target_out(UNIFIED, attention_args, [target, mate, mate], heads, device, 2)
        four, a_four = target_out(UNIFIED, attention_args, [target, mate, mate, mate], heads, device, 3)
    variants = [aiter_unified_attention.predict_call(a, 1).variant for a in (a_alone, a_three, a_four)]
    assert variants == ["3d:16seg", "2d", "2d"]
    assert not torch.equal(alone, three)  # predicted switch: 3D -> 2D
    assert torch.equal(three, four)  # predicted stable: 2D both times


# --- prefill: flash_attn_varlen_func ---------------------------------------------------------


def test_mha_matches_the_reference_where_it_imports(attention_args, device):
    ok, reason = aiter.kernel_available("mha", device)
    if not ok:
        pytest.skip(f"aiter-triton-mha is unavailable here: {reason}")
    dtype = torch.float16
    reqs = [(40, 1, 40), (70, 2, 9), (5, 3, 1)]
    args = attention_args(prefill.name, reqs, (4, 2, 32), page_size=16, dtype=dtype, placement_seed=4, device=device)
    out = routing.route(prefill.name, args, "aiter-triton-mha").backend.run(**args)
    ref = routing.get(prefill.name, "torch").run(**{**args, "q": args["q"].float()})
    atol, rtol = FP16.atol, FP16.rtol
    assert ((out.double() - ref.double()).abs() <= 2 * atol + rtol * ref.double().abs()).all()
