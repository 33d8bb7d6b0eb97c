"""SGLang's AiterGDNKernel routing, checked against aiter_contracts.md 3.3 and 3.10.

The FlyDSL keys are checked against an independent read of data/aiter/gdr_decode_tuned.csv, not
against the module's own lookup.
"""

from __future__ import annotations

import csv
import doctest

import pytest
import torch

from gdn_lab.ops import spec
from gdn_lab.rules import flydsl_gdr_decode, sglang_gdn
from gdn_lab.rules.base import EXPECTATIONS, RuleEnv

gdn_decode_op, gdn_prefill_op = spec.get("gdn_decode"), spec.get("gdn_prefill")

BF16, F32 = torch.bfloat16, torch.float32
GFX942, GFX950 = RuleEnv("gfx942", 80), RuleEnv("gfx950", 256)


def _csv_wtk() -> dict[tuple[str, int, int, int, str], int]:
    """(arch, b, HK, HV, state dtype) -> WARP_THREADS_K for bf16, K = V = 128, sq = 1, fast rows."""
    out = {}
    with flydsl_gdr_decode.TABLE_PATH.open() as f:
        for r in csv.DictReader(f):
            fast = float(r["duration"]) < 10000
            if (
                fast
                and r["dtype"] == "torch.bfloat16"
                and r["sq"] == "1"
                and r["head_k_dim"] == r["head_v_dim"] == "128"
            ):
                key = (r["arch"], int(r["b"]), int(r["num_k_heads"]), int(r["num_v_heads"]), r["state_dtype"])
                out[key] = int(r["WARP_THREADS_K"])
    return out


CSV = _csv_wtk()


def test_docstring_examples():
    result = doctest.testmod(sglang_gdn)
    assert result.attempted > 0 and result.failed == 0


# --- decode ---------------------------------------------------------------------------------


@pytest.mark.parametrize("batch, backend", [(1, "flydsl"), (23, "flydsl"), (24, "hip"), (25, "hip"), (256, "hip")])
def test_hip_threshold_on_gfx942(batch, backend):
    """(HK, HV) = (2, 8) on gfx942: HIP iff batch >= 24 (should_use_hip_gdn_decode)."""
    assert sglang_gdn.decode_route(2, 8, batch, "gfx942").backend == backend


@pytest.mark.parametrize(
    "hk, hv, batch, arch, why",
    [
        (2, 8, 24, "gfx950", "HIP is gfx942 only"),
        (2, 8, 500, "gfx950", "HIP is gfx942 only"),
        (4, 8, 24, "gfx942", "(4, 8) is not a HIP shape"),
        (8, 32, 64, "gfx942", "(8, 32) is not a HIP shape"),
        (2, 4, 64, "gfx942", "(2, 4) is not a HIP shape"),
    ],
)
def test_no_hip_outside_its_shape_and_arch(hk, hv, batch, arch, why):
    assert sglang_gdn.decode_route(hk, hv, batch, arch).backend == "flydsl", why


@pytest.mark.parametrize(
    "kwargs, why",
    [
        ({"dtype": torch.float16}, "q/k/v fp16"),
        ({"gate_dtype": F32}, "a/b/dt_bias fp32"),
        ({"head_k_dim": 64}, "K = 64"),
        ({"head_v_dim": 256}, "V = 256"),
        ({"state_dtype": BF16}, "bf16 state"),
        ({"state_contiguous": False}, "non-contiguous state"),
    ],
)
@pytest.mark.parametrize("batch", [23, 24])
def test_runtime_contract_sends_both_paths_to_triton(kwargs, why, batch):
    """HIP and FlyDSL share the runtime contract (bf16, 128 dims, fp32 contiguous state): off it, Triton."""
    route = sglang_gdn.decode_route(2, 8, batch, "gfx942", **kwargs)
    assert (route.backend, route.key) == ("triton", "triton"), why


@pytest.mark.parametrize("hk, hv, backend", [(16, 48, "flydsl"), (8, 8, "flydsl"), (3, 8, "triton"), (8, 4, "triton")])
def test_flydsl_head_rule(hk, hv, backend):
    """FlyDSL iff HK > 0, HV >= HK and HV % HK == 0, whatever the batch."""
    for batch in (1, 24, 300):
        assert sglang_gdn.decode_route(hk, hv, batch, "gfx950").backend == backend


def test_availability_falls_through():
    assert sglang_gdn.decode_route(2, 8, 24, "gfx942", hip_available=False).backend == "flydsl"
    assert sglang_gdn.decode_route(2, 8, 23, "gfx942", fly_available=False).backend == "triton"
    assert sglang_gdn.decode_route(2, 8, 24, "gfx942", fly_available=False).backend == "hip"


@pytest.mark.parametrize(
    "arch, hk, hv, last",
    [("gfx942", 2, 8, 23), ("gfx942", 4, 8, 140), ("gfx950", 2, 8, 260), ("gfx950", 16, 64, 260)],
)
def test_flydsl_key_is_the_tuned_wtk(arch, hk, hv, last):
    """The FlyDSL key carries the CSV's WARP_THREADS_K for the batch (8, AITER's default, past the table)."""
    for b in range(1, last + 1):
        want = CSV.get((arch, b, hk, hv, "torch.float32"), 8)
        route = sglang_gdn.decode_route(hk, hv, b, arch)
        assert (route.backend, route.key, route.warp_threads_k) == ("flydsl", f"flydsl:wtk={want}", want), b


def test_gfx942_4_8_wtk_by_batch():
    """aiter_contracts.md / issue 11: FlyDSL gfx942 bf16 (4, 8) WTK 16 -> 8 -> 4 for batch 1, 2, 4 (bf16
    state); SGLang takes FlyDSL only with fp32 state, where the CSV gives 16, 16, 8."""
    assert [flydsl_gdr_decode.warp_threads_k("gfx942", b, 4, 8, 128, 128, BF16, BF16)[0] for b in (1, 2, 4)] == [
        16,
        8,
        4,
    ]
    assert [sglang_gdn.decode_route(4, 8, b, "gfx942", state_dtype=BF16).key for b in (1, 2, 4)] == ["triton"] * 3
    assert (
        [sglang_gdn.decode_route(4, 8, b, "gfx942").key for b in (1, 2, 4)]
        == [f"flydsl:wtk={CSV[('gfx942', b, 4, 8, 'torch.float32')]}" for b in (1, 2, 4)]
        == ["flydsl:wtk=16", "flydsl:wtk=16", "flydsl:wtk=8"]
    )


def test_untuned_shapes_are_batch_invariant():
    """Ratio-3 heads (Qwen3.5-27B) have no tuned rows: FlyDSL with the default WTK 8 at every batch."""
    assert {sglang_gdn.decode_route(2, 6, b, a).key for b in range(1, 300) for a in ("gfx942", "gfx950")} == {
        "flydsl:wtk=8"
    }


# --- prefill --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hv, tokens, backend",
    [(8, 4095, "triton"), (8, 4096, "aiter"), (4, 4096, "aiter"), (16, 1023, "triton"), (16, 1024, "aiter"),
     (9, 1024, "aiter"), (9, 1023, "triton")],
)  # fmt: skip
def test_prefill_token_threshold(hv, tokens, backend):
    """aiter_prefill_min_tokens(HV) = 4096 if HV <= 8 else 1024, for one sequence."""
    hk = 1 if hv == 9 else 2
    assert sglang_gdn.prefill_route(hk, hv, [tokens]).backend == backend


@pytest.mark.parametrize("lens", [[4096, 4096], [8192, 1], [2048, 2048]])
def test_prefill_needs_a_single_sequence(lens):
    route = sglang_gdn.prefill_route(2, 8, lens)
    assert route.backend == "triton" and "sequences" in route.reason


@pytest.mark.parametrize(
    "kwargs, backend",
    [
        ({"dtype": torch.float16}, "triton"),
        ({"head_k_dim": 64}, "triton"),
        ({"state_dtype": BF16}, "aiter"),
        ({"state_dtype": torch.float16}, "triton"),
        ({"state_contiguous": False}, "triton"),
        ({"graph_capture": True}, "triton"),
        ({"has_padding": True}, "triton"),
        ({"chunk_size": 32}, "triton"),
        ({"aiter_available": False}, "triton"),
    ],
)
def test_prefill_runtime_contract(kwargs, backend):
    assert sglang_gdn.prefill_route(2, 8, [8192], **kwargs).backend == backend


# --- the DispatchRule on validated calls ----------------------------------------------------


def _decode_args(batch: int, hk: int = 2, hv: int = 8, dtype=BF16, d: int = 128):
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    return gdn_decode_op.validate(
        rnd(batch, hk, d),
        rnd(batch, hk, d),
        rnd(batch, hv, d),
        rnd(batch, hv),
        rnd(batch, hv),
        torch.zeros(hv),
        rnd(hv),
        torch.zeros(batch, hv, d, d),
        torch.arange(batch, dtype=torch.int32),
    )


def _prefill_args(lens, hk: int = 2, hv: int = 8, dtype=BF16, d: int = 128):
    t, n = sum(lens), len(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return gdn_prefill_op.validate(
        torch.zeros(t, hk, d, dtype=dtype),
        torch.zeros(t, hk, d, dtype=dtype),
        torch.zeros(t, hv, d, dtype=dtype),
        torch.zeros(t, hv, dtype=dtype),
        torch.zeros(t, hv, dtype=dtype),
        torch.zeros(hv),
        torch.zeros(hv, dtype=dtype),
        cu,
        torch.zeros(n, hv, d, d),
        torch.arange(n, dtype=torch.int32),
    )


def test_decode_rule_on_validated_calls():
    alone = sglang_gdn.RULE.predict(_decode_args(23), 0, GFX942)
    batched = sglang_gdn.RULE.predict(_decode_args(24), 0, GFX942)
    assert (alone.variant, alone.key) == ("flydsl:wtk=8", "flydsl:wtk=8")
    assert (batched.variant, batched.key) == ("hip", "hip")
    assert sglang_gdn.RULE.expect(alone.key, batched.key) == "switch"
    assert (
        sglang_gdn.DECODE_RULE.predict(_decode_args(24), 5, GFX950).key
        == f"flydsl:wtk={CSV[('gfx950', 24, 2, 8, 'torch.float32')]}"
    )
    assert sglang_gdn.RULE.predict(_decode_args(24, dtype=F32), 0, GFX942).key == "triton"  # fp32 q/k/v
    assert sglang_gdn.RULE.predict(_decode_args(4, 2, 4, d=32), 0, GFX942).key == "triton"  # K = V = 32


def test_prefill_rule_on_validated_calls():
    one = sglang_gdn.RULE.predict(_prefill_args([4096]), 0, GFX950)
    two = sglang_gdn.RULE.predict(_prefill_args([2048, 2048]), 1, GFX950)
    short = sglang_gdn.PREFILL_RULE.predict(_prefill_args([4095]), 0, GFX950)
    assert (one.key, two.key, short.key) == ("aiter", "triton", "triton")
    assert sglang_gdn.RULE.expect(one.key, two.key) == "switch" and sglang_gdn.RULE.expect("aiter", "aiter") == "equal"
    assert sglang_gdn.RULE.predict(_prefill_args([1024], 2, 16), 0, GFX950).key == "aiter"  # HV 16: 1024 tokens


def test_rule_protocol_fields():
    for rule in (sglang_gdn.RULE, sglang_gdn.DECODE_RULE, sglang_gdn.PREFILL_RULE):
        assert rule.name.startswith("sglang_gdn") and "gdn_aiter.py" in rule.source
        assert rule.expect("a", "b") in EXPECTATIONS


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: sglang_gdn.decode_route(2, 8, 24, "gfx90a"), "arch"),
        (lambda: sglang_gdn.decode_route(2, 8, 0, "gfx942"), "batch_size"),
        (lambda: sglang_gdn.decode_route(0, 8, 1, "gfx942"), "num_k_heads"),
        (lambda: sglang_gdn.decode_route(2, 8, 1, "gfx942", dtype="bf16"), "q"),
        (lambda: sglang_gdn.prefill_route(2, 8, []), "seq_lens"),
        (lambda: sglang_gdn.prefill_route(2, 8, [10, 0]), r"seq_lens\[1\]"),
        (lambda: sglang_gdn.RULE.predict(_decode_args(3), 3, GFX942), "request"),
        (lambda: sglang_gdn.RULE.predict(_decode_args(3), 0, RuleEnv("sm_90", 132)), "arch"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
