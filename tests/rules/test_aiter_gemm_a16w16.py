"""AITER Triton gemm_a16w16's config by M, checked against the installed wheel's own JSON tables.

The oracle is the JSON read here independently (the installed aiter's configs/gemm folder), and
`_get_config`'s documented selection: the first M_LEQ_<b> entry present with M <= b, else "any".
"""

from __future__ import annotations

import doctest
import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from gdn_lab import aiter
from gdn_lab.ops import spec
from gdn_lab.rules import aiter_gemm_a16w16 as gemm
from gdn_lab.rules.base import RuleEnv

matmul_op = spec.get("matmul")

_SPEC = importlib.util.find_spec("aiter")
pytestmark = pytest.mark.skipif(_SPEC is None, reason=f"aiter is not installed ({aiter.INSTALL_HINT})")
BOUNDS = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
MI350 = RuleEnv("gfx950", 256)


def _folder() -> Path:
    assert _SPEC is not None and _SPEC.submodule_search_locations
    return Path(list(_SPEC.submodule_search_locations)[0]) / "ops" / "triton" / "configs" / "gemm"


def _table(name: str) -> dict:
    return json.loads((_folder() / name).read_text())


def _present_bounds(table: dict) -> list[int]:
    return [b for b in BOUNDS if f"M_LEQ_{b}" in table]


def test_docstring_examples():
    result = doctest.testmod(gemm)
    assert result.attempted > 0 and result.failed == 0


def test_reads_the_installed_wheel_and_records_it():
    cfg = gemm.get_config(1, 4096, 4096, "gfx950")
    assert cfg.file.path == _folder() / "MI350X-GEMM-A16W16.json"
    assert cfg.file.aiter_version == importlib.metadata.version("amd-aiter")
    assert not cfg.file.specific
    repo = Path(gemm.__file__).parents[2]
    for copy in (repo / "gdn_lab", repo / "data"):  # the installed wheel's file, not a copy in the repository
        assert not cfg.file.path.is_relative_to(copy)
    assert gemm.get_config(1, 4096, 4096, "gfx942").file_name == "MI300X-GEMM-A16W16.json"


@pytest.mark.parametrize(
    "arch, n, k, name",
    [
        ("gfx950", 4096, 4096, "MI350X-GEMM-A16W16.json"),
        ("gfx942", 4096, 4096, "MI300X-GEMM-A16W16.json"),
        ("gfx950", 2880, 4096, "MI350X-GEMM-A16W16-N=2880-K=4096.json"),
        ("gfx950", 5120, 2880, "MI350X-GEMM-A16W16-N=5120-K=2880.json"),
        ("gfx942", 5120, 2880, "MI300X-GEMM-A16W16.json"),  # no MI300X N/K files in the wheel
        ("gfx950", 2880, 4097, "MI350X-GEMM-A16W16.json"),
    ],
)
def test_file_choice(arch, n, k, name):
    f = gemm.config_file(arch, n, k)
    assert f.path.name == name and f.specific == ("-N=" in name)


@pytest.mark.parametrize(
    "arch, n, k, name",
    [
        ("gfx950", 4096, 4096, "MI350X-GEMM-A16W16.json"),
        ("gfx942", 4096, 4096, "MI300X-GEMM-A16W16.json"),
        ("gfx950", 2880, 4096, "MI350X-GEMM-A16W16-N=2880-K=4096.json"),
        ("gfx950", 640, 2880, "MI350X-GEMM-A16W16-N=640-K=2880.json"),
    ],
)
def test_config_changes_at_each_bound_on_both_sides(arch, n, k, name):
    """M = b takes M_LEQ_b; M = b + 1 the next entry present (or "any"): both sides of every threshold."""
    table = _table(name)
    bounds = _present_bounds(table)
    entries = [f"M_LEQ_{b}" for b in bounds] + ["any"]
    for i, b in enumerate(bounds):
        below, above = gemm.get_config(b, n, k, arch), gemm.get_config(b + 1, n, k, arch)
        assert (below.entry, above.entry) == (entries[i], entries[i + 1])
        for cfg, entry in ((below, entries[i]), (above, entries[i + 1])):
            raw = table[entry]
            for field in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "GROUP_SIZE_M", "num_warps"):
                assert cfg.config[field] == raw[field]
            assert cfg.block_size_k == raw["BLOCK_SIZE_K"]  # K is large: no BLOCK_SIZE_K clamp here
            assert cfg.num_ksplit == raw.get("NUM_KSPLIT", 1) and cfg.splitk_block_size == -(-k // cfg.num_ksplit)
    assert gemm.get_config(1, n, k, arch).entry == entries[0]
    assert gemm.get_config(10**6, n, k, arch).entry == "any"


def test_mi350x_default_thresholds():
    """MI350X-GEMM-A16W16.json: BLOCK_SIZE_K 256 up to M 128, 128 up to 256, 64 above; BLOCK_SIZE_M 64 -> 128 at 65."""
    bk = {m: gemm.get_config(m, 4096, 4096, "gfx950").block_size_k for m in (1, 64, 65, 128, 129, 256, 257, 8193)}
    assert bk == {1: 256, 64: 256, 65: 256, 128: 256, 129: 128, 256: 128, 257: 64, 8193: 64}
    c64, c65 = gemm.get_config(64, 4096, 4096, "gfx950"), gemm.get_config(65, 4096, 4096, "gfx950")
    assert (c64.config["BLOCK_SIZE_M"], c65.config["BLOCK_SIZE_M"]) == (64, 128)
    assert c64.variant != c65.variant and c64.key == c65.key  # a tiling-only switch
    assert gemm.switch_points(4096, 4096, "gfx950", 9000, numerics_only=True) == [129, 257]
    assert gemm.switch_points(4096, 4096, "gfx950", 9000) == [65, 129, 257, 513, 2049]


def test_mi300x_default_thresholds():
    """MI300X-GEMM-A16W16.json: BLOCK_SIZE_K 128 up to M 512, then 64; M_LEQ_128 and M_LEQ_256 are one config."""
    assert gemm.get_config(512, 4096, 4096, "gfx942").block_size_k == 128
    assert gemm.get_config(513, 4096, 4096, "gfx942").block_size_k == 64
    assert gemm.switch_points(4096, 4096, "gfx942", 9000, numerics_only=True) == [513]
    assert 129 not in gemm.switch_points(4096, 4096, "gfx942", 9000)


@pytest.mark.parametrize(
    "arch, n, k", [("gfx950", 4096, 4096), ("gfx942", 4096, 4096), ("gfx950", 2880, 4096), ("gfx950", 5120, 2880),
                   ("gfx950", 2880, 512), ("gfx950", 256, 7168)],
)  # fmt: skip
def test_key_changes_exactly_where_the_k_arithmetic_changes(arch, n, k):
    """Between consecutive M, the key changes iff BLOCK_SIZE_K, the K split or the MFMA choice changes."""

    def numerics(c):
        cfg = c.config
        return (cfg["BLOCK_SIZE_K"], cfg["NUM_KSPLIT"], cfg["SPLITK_BLOCK_SIZE"], cfg.get("matrix_instr_nonkdim"),
                cfg.get("kpack", 1), min(cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"]) < cfg.get("matrix_instr_nonkdim", 0))  # fmt: skip

    top = 2048 if (n, k) == (256, 7168) else 8193
    file = gemm.config_file(arch, n, k)
    configs = [gemm.config_from(file, m, n, k, arch) for m in range(1, top + 1)]
    for a, b in zip(configs, configs[1:]):
        assert (a.key != b.key) == (numerics(a) != numerics(b)), (a.m, b.m)
        if a.block_size_k != b.block_size_k or a.num_ksplit != b.num_ksplit:
            assert gemm.RULE.expect(a.key, b.key) == "switch"


def test_instruction_change_is_in_the_key():
    """N=256 K=7168 (MI350X): M 129 moves BLOCK_SIZE_K 512 -> 64 and matrix_instr_nonkdim 16 -> 32."""
    a, b = gemm.get_config(128, 256, 7168, "gfx950"), gemm.get_config(129, 256, 7168, "gfx950")
    assert (a.block_size_k, b.block_size_k) == (512, 64)
    assert (a.config["matrix_instr_nonkdim"], b.config["matrix_instr_nonkdim"]) == (16, 32)
    assert "mfma16" in a.key and "mfma32" in b.key


def test_tiles_below_the_instruction_carry_the_tile():
    """N=128 K=2880 (MI350X) tiles rows by 1 x 4 up to M 16: the compiler picks the dot, so the tile is in the key."""
    a, b = gemm.get_config(16, 128, 2880, "gfx950"), gemm.get_config(17, 128, 2880, "gfx950")
    assert (a.config["BLOCK_SIZE_M"], a.config["BLOCK_SIZE_N"]) == (1, 4)
    assert a.block_size_k == b.block_size_k == 512
    assert a.key.endswith("/tile1x4") and "tile" not in b.key


def test_entry_without_any_raises_like_aiter():
    """MI350X N=256 K=7168 has M_GEQ_4096 (never read) and no "any": M > 2048 has no config."""
    table = _table("MI350X-GEMM-A16W16-N=256-K=7168.json")
    assert "any" not in table and "M_GEQ_4096" in table
    assert gemm.get_config(2048, 256, 7168, "gfx950").entry == "M_LEQ_2048"
    with pytest.raises(gemm.NoConfigEntry, match="any"):
        gemm.get_config(2049, 256, 7168, "gfx950")
    assert issubclass(gemm.NoConfigEntry, LookupError)


@pytest.mark.parametrize(
    "entry, k, bk, split",
    [
        ({"BLOCK_SIZE_K": 256}, 4096, 256, 4096),
        ({"BLOCK_SIZE_K": 256, "NUM_KSPLIT": 4}, 4096, 256, 1024),
        ({"BLOCK_SIZE_K": 256, "NUM_KSPLIT": 4}, 1000, 64, 250),  # next_pow2(250) = 256 > 250: / 4
        ({"BLOCK_SIZE_K": 128}, 100, 32, 100),
        ({"BLOCK_SIZE_K": 128}, 64, 64, 64),  # next_pow2(64) = 64
        ({"BLOCK_SIZE_K": 64}, 8, 16, 8),  # at least 16
    ],
)
def test_block_k_adjustments(tmp_path, entry, k, bk, split):
    """`_get_config`'s NUM_KSPLIT default, SPLITK_BLOCK_SIZE and BLOCK_SIZE_K clamp, on a table written here."""
    base = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "matrix_instr_nonkdim": 16}
    path = tmp_path / f"t{k}-{bk}-{entry.get('NUM_KSPLIT', 1)}.json"
    path.write_text(json.dumps({"any": {**base, **entry}}))
    cfg = gemm.config_from(gemm.ConfigFile(path, False, "test"), 8, 64, k, "gfx950")
    assert (cfg.block_size_k, cfg.splitk_block_size, cfg.num_ksplit) == (bk, split, entry.get("NUM_KSPLIT", 1))
    assert cfg.actual_ksplit == -(-k // split)


def test_split_k_is_in_the_key(tmp_path):
    path = tmp_path / "split.json"
    conf = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "matrix_instr_nonkdim": 16}
    path.write_text(json.dumps({"M_LEQ_16": {**conf, "NUM_KSPLIT": 4}, "any": {**conf, "NUM_KSPLIT": 1}}))
    f = gemm.ConfigFile(path, False, "test")
    a, b = gemm.config_from(f, 16, 64, 4096, "gfx950"), gemm.config_from(f, 17, 64, 4096, "gfx950")
    assert a.block_size_k == b.block_size_k and a.key != b.key
    assert "ksplit4:1024" in a.key and "ksplit1" in b.key


def test_rule_on_validated_calls():
    def args(m):
        return matmul_op.validate(
            torch.zeros(m, 256, dtype=torch.bfloat16), torch.zeros(256, 256, dtype=torch.bfloat16)
        )

    p64, p65, p128, p129 = (gemm.RULE.predict(args(m), 0, MI350) for m in (64, 65, 128, 129))
    assert p64.key == p65.key and p64.variant != p65.variant
    assert p128.key != p129.key and gemm.RULE.expect(p128.key, p129.key) == "switch"
    assert "MI350X-GEMM-A16W16.json" in p129.reason and importlib.metadata.version("amd-aiter") in p129.reason
    assert gemm.RULE.predict(args(129), 128, RuleEnv("gfx942", 80)).key == "bk128/ksplit1/mfma16/kpack1"
    with pytest.raises(ValueError, match="request"):
        gemm.RULE.predict(args(4), 4, MI350)
    with pytest.raises(ValueError, match="arch"):
        gemm.RULE.predict(args(4), 0, RuleEnv("sm_90", 132))


def test_missing_aiter_names_the_install_hint(monkeypatch):
    missing = aiter.Probe(False, None, None, None, "aiter is not installed")
    monkeypatch.setattr(aiter, "probe", lambda: missing)
    with pytest.raises(ImportError, match="aiter-triton"):
        gemm.get_config(1, 4096, 4096, "gfx950")
    with pytest.raises(ImportError) as info:
        gemm.config_file("gfx942", 1, 1)
    assert aiter.INSTALL_HINT in str(info.value)


def test_aiter_without_tables(monkeypatch, tmp_path):
    bare = aiter.Probe(True, "9.9", str(tmp_path), "init-bypass", "")
    monkeypatch.setattr(aiter, "probe", lambda: bare)
    with pytest.raises(ImportError, match="configs/gemm"):
        gemm.get_config(1, 4096, 4096, "gfx950")


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: gemm.get_config(1, 64, 64, "gfx90a"), "arch"),
        (lambda: gemm.get_config(0, 64, 64, "gfx950"), "m"),
        (lambda: gemm.get_config(1, 0, 64, "gfx950"), "n"),
        (lambda: gemm.switch_points(64, 64, "gfx950", 0), "max_m"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
