"""experiments.dispatch_map: the AMD dispatch map from the rules, and FlyDSL's K split on the lab's Triton decode.

The map part needs no kernel. The run part runs in Triton's interpreter on the CPU at a tiny GDN
shape, with the K splits of real mapped shapes: where the map predicts another K split the
target's bits must move, where it predicts the same they must not.
"""

from __future__ import annotations

import pytest
import torch

from gdn_lab import aiter
from gdn_lab.experiments import dispatch_map as dm
from gdn_lab.experiments.aiter_dispatch import MISSES
from gdn_lab.experiments.table import COLUMNS
from gdn_lab.rules import batch_variance_map as bvm

TINY = {"num_k_heads": 1, "num_v_heads": 1, "head_dim": 32}


def config(**kw):
    base = dict(device="cpu", dtype="float32", max_batch=40, include_gemm=False, run_batch_sizes=[], run_shape=TINY)
    return dm.DispatchMapConfig(**{**base, **kw})


def test_config_checks_every_field():
    for field, value, match in [
        ("models", ["Qwen4"], "models"),
        ("tps", [3], "tps"),
        ("arches", ["gfx90a"], "arches"),
        ("max_batch", 0, "max_batch"),
        ("run_batch_sizes", [0], "run_batch_sizes"),
        ("run_shape", {"num_k_heads": 3, "num_v_heads": 4, "head_dim": 32}, "num_k_heads"),
        ("run_shape", {"heads": 2}, "run_shape"),
    ]:
        with pytest.raises(ValueError, match=match):
            config(**{field: value})
    assert config().run_gdn_shape(16, 64).num_v_heads == 1  # the run shape replaces the mapped one
    assert config(run_shape=None).run_gdn_shape(16, 64).head_dim == 128


def test_the_map_covers_every_model_tp_and_arch_with_backend_marks():
    m = dm.map_table(config())
    assert m.groupby(["model", "tp", "arch"]).ngroups == 4 * 4 * 2
    assert list(m.columns) == bvm.MAP_COLUMNS + dm.MAP_EXTRA
    assert not m.measured.any() and m.backend.notna().all()
    if not torch.version.hip:
        assert (m.hardware_note == " (not yet run on AMD hardware)").all()
    ragged = m[m.backend == "aiter"]
    assert set(ragged.op) == {"decode_attention", "prefill_attention"}
    assert not m[m.kernel.str.contains("paged_attention_ragged")].numerics_changes.any()
    # the reference's facts, read back through the map
    dec = m[(m.model == "Qwen3.5-397B-A17B") & (m.tp == 8) & (m.op == "gdn_decode")].set_index("arch")
    assert "24-40: hip" in dec.loc["gfx942"].numerics_keys  # HIP for (2, 8) from batch 24 on gfx942 only
    assert not any(run.endswith(": hip") for run in dec.loc["gfx950"].numerics_keys)
    ck = m[(m.model == "Qwen3-8B") & (m.tp == 1) & (m.op == "prefill_attention")].set_index("arch")
    assert ck.loc["gfx950"].numerics_switch_batch_sizes == [7] and ck.loc["gfx942"].numerics_switch_batch_sizes == [2]


@pytest.mark.skipif(not aiter.probe().installed, reason="amd-aiter is not installed")
def test_the_gemm_joins_the_map_where_aiter_is_installed():
    m = dm.map_table(config(models=["Qwen3-8B"], tps=[1], arches=["gfx950"], max_batch=130, include_gemm=True))
    gemm = m[m.op == "matmul"]
    assert len(gemm) == 2 and (gemm.backend == "aiter-triton-gemm").all() and not m.gemm_note.iloc[0]
    assert all(129 in s for s in gemm.numerics_switch_batch_sizes)


def test_summary_headline_and_conclusion_from_the_map_alone():
    m = dm.map_table(config(models=["Qwen3-8B", "Qwen3.5-27B"]))
    runs = dm.ksplit_runs(config(models=["Qwen3-8B", "Qwen3.5-27B"]))
    assert runs.empty and list(runs.columns[: len(COLUMNS)]) == COLUMNS
    s = dm.summarize(m)
    assert set(s.model) == {"Qwen3-8B", "Qwen3.5-27B"}
    gdn = s[(s.model == "Qwen3.5-27B") & (s.op == "gdn_decode")].iloc[0]
    assert gdn.numerics_follow_batch == 0  # ratio-3 heads: not in FlyDSL's table, WTK 8 throughout
    text = dm.conclusion(m, runs)
    assert "**Qwen3-8B**" in text and "one numerics key for every batch size" in text
    assert ("not yet run on AMD hardware" in text) == (not torch.version.hip)
    assert "maps:" in dm.headline(m, runs)


def test_flydsl_schedules_name_the_shapes_sglang_sends_to_flydsl():
    long = dm.long_table(config(models=["Qwen3.5-397B-A17B"], tps=[8]))
    scheds = {(s["arch"], s["shape"]): s for s in dm.flydsl_schedules(long)}
    assert set(scheds) == {("gfx942", "HK=2 HV=8 K=128 V=128"), ("gfx950", "HK=2 HV=8 K=128 V=128")}
    gfx942 = scheds[("gfx942", "HK=2 HV=8 K=128 V=128")]
    assert gfx942["keys"][24] == "hip" and gfx942["keys"][23].startswith("flydsl:wtk=")
    assert gfx942["used_by"] == ["Qwen3.5-397B-A17B TP8"]


def test_the_k_split_run_moves_the_bits_exactly_where_the_map_says(device):
    # gfx942, (4, 8), fp32 state (Qwen3-Next-80B at TP4): WTK 16, 16, 8, 8 for batch 1..4
    cfg = config(
        models=["Qwen3-Next-80B-A3B"], tps=[4], arches=["gfx942"], run_batch_sizes=[2, 3, 4], device=device.type
    )
    runs = dm.ksplit_runs(cfg)
    assert list(runs.columns[: len(COLUMNS)]) == COLUMNS
    assert (runs.status == "compared").all() and set(runs.tensor) == {"out", "state"}
    assert (
        (runs.arch == "gfx942").all() and (runs.backend == "triton").all() and (runs.stands_for == "aiter-flydsl").all()
    )
    cases = dm.run_cases(runs).set_index("batch_size")
    assert cases.k_split.to_dict() == {1: 16, 2: 16, 3: 8, 4: 8}
    assert cases.expected.to_dict() == {1: "equal", 2: "equal", 3: "switch", 4: "switch"}
    assert cases.moved.to_dict() == {1: False, 2: False, 3: True, 4: True}
    assert not cases.prediction.isin(MISSES).any()
    assert "2/2 predicted switches moved" in dm.headline(dm.map_table(cfg), runs)
    assert "moved at batch 3, 4, as predicted" in dm.conclusion(dm.map_table(cfg), runs)


def test_batch_sizes_sglang_sends_elsewhere_are_rows_saying_so(device):
    cfg = config(models=["Qwen3.5-397B-A17B"], tps=[8], arches=["gfx942"], run_batch_sizes=[24], device=device.type)
    runs = dm.ksplit_runs(cfg)
    at24 = runs[runs.batch_size == 24].iloc[0]
    assert not at24.covered and at24.status == "not covered" and "SGLang takes hip at batch 24" in at24.reason
    assert (runs[runs.batch_size == 1].status == "compared").all()
