"""The batch-variance map: per-rank shapes (aiter_contracts.md 7) and each op's switches, against the reference."""

from __future__ import annotations

import csv
import doctest
import importlib.util

import pytest

from gdn_lab import aiter
from gdn_lab.rules import batch_variance_map as bvm
from gdn_lab.rules import flydsl_gdr_decode

HAS_AITER = importlib.util.find_spec("aiter") is not None
needs_aiter = pytest.mark.skipif(not HAS_AITER, reason=f"aiter is not installed ({aiter.INSTALL_HINT})")


def _map(model, tp, arch, **kw):
    kw.setdefault("include_gemm", False)
    return bvm.batch_variance_map(model, tp, arch, **kw)


def _row(df, op, kernel_part=""):
    rows = df[(df.op == op) & df.kernel.str.contains(kernel_part, regex=False)]
    assert len(rows) == 1, (op, kernel_part, list(df.kernel))
    return rows.iloc[0]


def _csv_wtk(arch, hk, hv):
    """b -> WARP_THREADS_K for bf16, fp32 state, K = V = 128 (an independent read of the CSV)."""
    out = {}
    with flydsl_gdr_decode.TABLE_PATH.open() as f:
        for r in csv.DictReader(f):
            if (r["arch"], r["dtype"], r["state_dtype"], r["sq"]) == (
                arch,
                "torch.bfloat16",
                "torch.float32",
                "1",
            ) and (
                int(r["num_k_heads"]),
                int(r["num_v_heads"]),
            ) == (hk, hv):
                out[int(r["b"])] = int(r["WARP_THREADS_K"])
    return out


@needs_aiter
def test_docstring_examples():
    result = doctest.testmod(bvm)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize(
    "model, attention, gdn",
    [
        ("Qwen3-8B", [(32, 8), (16, 4), (8, 2), (4, 1)], [None] * 4),
        ("Qwen3-Next-80B-A3B", [(16, 2), (8, 1), (4, 1), (2, 1)], [(16, 32), (8, 16), (4, 8), (2, 4)]),
        ("Qwen3.5-27B", [(24, 4), (12, 2), (6, 1), (3, 1)], [(16, 48), (8, 24), (4, 12), (2, 6)]),
        ("Qwen3.5-397B-A17B", [(32, 2), (16, 1), (8, 1), (4, 1)], [(16, 64), (8, 32), (4, 16), (2, 8)]),
    ],
)
def test_local_heads_match_the_reference(model, attention, gdn):
    """aiter_contracts.md 7: TP splits heads evenly, KV heads replicated when H_kv < TP."""
    for tp, att, g in zip(bvm.TPS, attention, gdn):
        s = bvm.local_shape(model, tp)
        assert (s.num_q_heads, s.num_kv_heads) == att
        assert (None if s.num_k_heads is None else (s.num_k_heads, s.num_v_heads)) == g


def test_columns_and_paged_decode():
    df = _map("Qwen3-8B", 1, "gfx950")
    assert list(df.columns) == bvm.MAP_COLUMNS
    assert (df.model == "Qwen3-8B").all() and (df.num_cus == 256).all() and (df.device == "MI350X").all()
    ragged = _row(df, "decode_attention", "paged_attention_ragged")
    assert ragged.switch_batch_sizes == [] and not ragged.numerics_changes
    assert "code reading" in ragged.note and ragged.variants == ["1-512: paged_attention_ragged: 256-token partitions"]


@pytest.mark.parametrize(
    "model, tp, arch, device, switch",
    [
        ("Qwen3-8B", 1, "gfx950", None, 7),  # MI350X: batch <= 6 small tile
        ("Qwen3-8B", 1, "gfx950", "MI355X", 7),
        ("Qwen3-8B", 1, "gfx942", None, 2),  # the emulated MI308X: only batch 1
        ("Qwen3-8B", 1, "gfx942", "MI300X", 8),  # batch <= 7
        ("Qwen3-8B", 2, "gfx950", None, 13),  # Hq 16: 16 x 12 = 192 < 204.8 <= 208
    ],
)
def test_ck_tile_switch(model, tp, arch, device, switch):
    row = _row(_map(model, tp, arch, device=device), "prefill_attention")
    assert row.switch_batch_sizes == [switch] == row.numerics_switch_batch_sizes and row.numerics_changes
    small = "1" if switch == 2 else f"1-{switch - 1}"
    assert row.numerics_keys == [f"{small}: 64x128x64", f"{switch}-512: 128x128x32"]


@pytest.mark.parametrize("model", ["Qwen3-Next-80B-A3B", "Qwen3.5-27B", "Qwen3.5-397B-A17B"])
def test_ck_head_dim_256_never_switches(model):
    for arch in bvm.ARCHS:
        row = _row(_map(model, 1, arch), "prefill_attention")
        assert row.switch_batch_sizes == [] and not row.numerics_changes


def test_gdn_decode_hip_switch_and_every_wtk_change_on_gfx942():
    """Qwen3.5-397B TP8 = (2, 8): FlyDSL with the CSV's WTK below batch 24, HIP from 24 (gfx942)."""
    row = _row(_map("Qwen3.5-397B-A17B", 8, "gfx942"), "gdn_decode")
    wtk = _csv_wtk("gfx942", 2, 8)
    changes = [b for b in range(2, 24) if wtk[b] != wtk[b - 1]]
    assert row.numerics_switch_batch_sizes == changes + [24]
    assert row.numerics_keys[-1] == "24-512: hip"
    assert set(row.numerics_switch_batch_sizes) <= set(row.switch_batch_sizes)


def test_gdn_decode_wtk_changes_on_gfx950():
    """(2, 8) on gfx950 never takes HIP; every WTK change of the CSV is listed, and the fall back to 8 past it."""
    row = _row(_map("Qwen3.5-397B-A17B", 8, "gfx950"), "gdn_decode")
    wtk = _csv_wtk("gfx950", 2, 8)
    changes = [b for b in range(2, 257) if wtk[b] != wtk[b - 1]] + ([257] if wtk[256] != 8 else [])
    assert row.numerics_switch_batch_sizes == changes
    assert not any("hip" in k for k in row.numerics_keys) and row.numerics_keys[-1].endswith("flydsl:wtk=8")


def test_gdn_decode_untuned_shapes_do_not_switch():
    for tp in bvm.TPS:  # Qwen3.5-27B: ratio-3 heads have no tuned rows
        row = _row(_map("Qwen3.5-27B", tp, "gfx950"), "gdn_decode")
        assert row.switch_batch_sizes == [] and row.numerics_keys == ["1-512: flydsl:wtk=8"]


@pytest.mark.parametrize(
    "model, tp, length, switches",
    [
        ("Qwen3-Next-80B-A3B", 4, 4096, [2]),  # HV 8: 4096 tokens needed
        ("Qwen3-Next-80B-A3B", 4, 4095, []),  # Triton at every batch
        ("Qwen3-Next-80B-A3B", 2, 1024, [2]),  # HV 16: 1024 tokens
        ("Qwen3-Next-80B-A3B", 2, 1023, []),
    ],
)
def test_gdn_prefill_single_sequence_switch(model, tp, length, switches):
    row = _row(_map(model, tp, "gfx950", gdn_prefill_len=length), "gdn_prefill")
    assert row.numerics_switch_batch_sizes == switches
    assert row.numerics_keys == (["1: aiter", "2-512: triton"] if switches else ["1-512: triton"])


def test_fused_prefill_only_on_its_shape():
    row = _row(_map("Qwen3-Next-80B-A3B", 4, "gfx950"), "gdn_layer_prefill")
    assert {5, 8, 16, 65} <= set(row.numerics_switch_batch_sizes)  # chunk 64 -> 32 -> 64 -> 32, then uncovered
    assert row.numerics_keys[-1] == "65-512: unfused"
    for model, tp, arch in [
        ("Qwen3-Next-80B-A3B", 4, "gfx942"),
        ("Qwen3-Next-80B-A3B", 2, "gfx950"),
        ("Qwen3.5-27B", 4, "gfx950"),
    ]:
        assert (_map(model, tp, arch).op != "gdn_layer_prefill").all()


def test_fused_prefill_chunk_sizes_by_batch():
    row = _row(_map("Qwen3-Next-80B-A3B", 4, "gfx950", max_batch=64), "gdn_layer_prefill")
    chunk = {}
    for run in row.numerics_keys:
        span, text = run.split(": ", 1)
        lo, _, hi = span.partition("-")
        for b in range(int(lo), int(hi or lo) + 1):
            chunk[b] = int(text.split("chunk=")[1].split()[0])
    assert [chunk[b] for b in (4, 5, 7, 8, 15, 16, 64)] == [64, 32, 32, 64, 64, 32, 32]


def test_triton_decode_alternatives():
    df = _map("Qwen3-8B", 1, "gfx950")
    pa = _row(df, "decode_attention", "pa_decode")
    assert pa.numerics_switch_batch_sizes == [17]  # 4096 tokens: V2 up to 16 x 32 = 512 rows
    unified = _row(df, "decode_attention", "unified_attention")
    assert unified.numerics_changes and unified.numerics_keys[-1].endswith(": 2d")


@needs_aiter
def test_gemm_rows():
    df = bvm.batch_variance_map("Qwen3-8B", 1, "gfx950")
    mm = df[df.op == "matmul"]
    assert list(mm["shape"]) == ["attn.qkv_proj N=6144 K=4096", "attn.o_proj N=4096 K=4096"]
    for _, row in mm.iterrows():
        assert row.switch_batch_sizes == [65, 129, 257] and row.numerics_switch_batch_sizes == [129, 257]
        assert "MI350X-GEMM-A16W16.json" in row.rule_source
    mi300 = bvm.batch_variance_map("Qwen3-8B", 1, "gfx942", max_batch=600)
    assert all(r == [513] for r in mi300[mi300.op == "matmul"].numerics_switch_batch_sizes)
    hybrid = bvm.batch_variance_map("Qwen3-Next-80B-A3B", 4, "gfx950")
    assert list(hybrid[hybrid.op == "matmul"]["shape"]) == [
        "attn.qkv_proj N=1536 K=2048", "attn.o_proj N=2048 K=1024", "gdn.in_proj_qkvz N=3072 K=2048",
        "gdn.in_proj_ba N=16 K=2048", "gdn.out_proj N=2048 K=1024",
    ]  # fmt: skip
    gated = bvm.batch_variance_map("Qwen3.5-27B", 1, "gfx950")
    assert "attn.qkv_proj N=14336 K=5120" in set(gated["shape"])  # (2 x 24 + 2 x 4) x 256: the output gate


def test_missing_aiter_says_how_to_skip_gemm(monkeypatch):
    missing = aiter.Probe(False, None, None, None, "aiter is not installed")
    monkeypatch.setattr(aiter, "probe", lambda: missing)
    with pytest.raises(ImportError, match="include_gemm=False"):
        bvm.batch_variance_map("Qwen3-8B", 1, "gfx950", include_gemm=True)
    assert len(bvm.batch_variance_map("Qwen3-8B", 1, "gfx950", include_gemm=False)) == 4


def test_long_form_agrees_with_the_map():
    long = bvm.batch_variance_long("Qwen3.5-397B-A17B", 8, "gfx942", max_batch=40, include_gemm=False)
    assert list(long.columns) == bvm.LONG_COLUMNS
    df = _map("Qwen3.5-397B-A17B", 8, "gfx942", max_batch=40)
    assert len(long) == 40 * len(df)
    for _, row in df.iterrows():
        sub = long[(long.op == row.op) & (long.kernel == row.kernel) & (long["shape"] == row["shape"])]
        assert list(sub.batch_size) == list(range(1, 41))
        keys = list(sub.key)
        assert [b for b in range(2, 41) if keys[b - 1] != keys[b - 2]] == row.numerics_switch_batch_sizes


def test_deterministic():
    a = _map("Qwen3-Next-80B-A3B", 4, "gfx950")
    b = _map("Qwen3-Next-80B-A3B", 4, "gfx950")
    assert a.equals(b)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"model": "Qwen3-9B"}, r"model: 'Qwen3-9B' is not accepted; expected one of 'Qwen3-8B'"),
        ({"tp": 3}, r"tp: 3 is not accepted; expected one of 1, 2, 4, 8"),
        ({"arch": "gfx90a"}, r"arch: 'gfx90a' is not accepted; expected one of 'gfx942', 'gfx950'"),
        ({"device": "MI300X"}, r"device: MI300X is a gfx942 device, not gfx950"),
        ({"device": "H200"}, r"device: 'H200' is not accepted"),
        ({"max_batch": 0}, "max_batch"),
        ({"context_len": -1}, "context_len"),
        ({"extend_len": 0}, "extend_len"),
        ({"include_gemm": "yes"}, "include_gemm"),
    ],
)
def test_bad_parameters(kwargs, match):
    call = dict(model="Qwen3-8B", tp=1, arch="gfx950", include_gemm=False)
    call.update(kwargs)
    with pytest.raises(ValueError, match=match):
        bvm.batch_variance_map(**call)
    with pytest.raises(ValueError, match=match):
        bvm.batch_variance_long(**call)
