"""AITER's Triton MoE config by M, against AITER's own `get_optimal_moe_config` and its JSON tables.

Two oracles: the installed aiter's function, loaded through the lab's loader with the arch emulated
(what `aiter-triton-moe` calls), at every M across both thresholds; and the JSON read here
independently of the rule.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from gdn_lab import aiter
from gdn_lab.rules import aiter_triton_moe as moe
from gdn_lab.rules.base import AITER_DEVICES, RuleEnv

_SPEC = importlib.util.find_spec("aiter")
pytestmark = pytest.mark.skipif(_SPEC is None, reason=f"aiter is not installed ({aiter.INSTALL_HINT})")
MS = (1, 2, 100, 255, 256, 257, 1000, 1023, 1024, 1025, 5000)


def _table(device_name: str) -> dict:
    assert _SPEC is not None and _SPEC.submodule_search_locations
    folder = Path(list(_SPEC.submodule_search_locations)[0]) / "ops" / "triton" / "configs" / "moe"
    return json.loads((folder / f"{device_name}-MOE-DEFAULT.json").read_text())


@pytest.mark.filterwarnings("ignore:No MoE configuration found")  # fp32: AITER warns, then takes its default
@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
def test_the_rule_gives_aiters_own_config(arch, dtype):
    utils = aiter.load("moe_config_utils", arch)
    with aiter.shims(arch, 1):
        assert (
            moe.CONSTANTS.small_below,
            moe.CONSTANTS.medium_below,
        ) == (utils.M_THRESHOLD_SMALL, utils.M_THRESHOLD_MEDIUM)
        for m in MS:
            assert dict(moe.get_config(m, arch, dtype).config) == utils.get_optimal_moe_config(dtype, M=m), f"M={m}"


def test_the_tables_read_independently():
    for arch, name in AITER_DEVICES.items():
        table = _table(name)
        for m, entry in ((255, "small_M"), (256, "medium_M"), (1023, "medium_M"), (1024, "large_M")):
            c = moe.get_config(m, arch, torch.bfloat16)
            assert (c.entry, dict(c.config), c.file_name) == (entry, table[entry], f"{name}-MOE-DEFAULT.json")


def test_numerics_keys_and_switches():
    # BLOCK_SIZE_K 64 / 128 / 64 on both archs; MI300X's small_M packs 2 K elements per operand
    assert moe.switch_points("gfx950", torch.bfloat16) == [256, 1024]
    assert moe.switch_points("gfx942", torch.bfloat16) == [256, 1024]
    assert moe.get_config(100, "gfx950", torch.bfloat16).key == moe.get_config(2000, "gfx950", torch.bfloat16).key
    assert moe.get_config(100, "gfx942", torch.bfloat16).key == "bk64/mfma16/kpack2"
    assert moe.get_config(2000, "gfx942", torch.bfloat16).key == "bk64/mfma16/kpack1"
    # fp32: no table, the hard-coded default at every M
    assert moe.switch_points("gfx950", torch.float32, 2048, numerics_only=False) == []
    assert moe.get_config(7, "gfx950", torch.float32).entry == "default"


def test_the_rule_on_a_call():
    x = torch.zeros(300, 8, dtype=torch.bfloat16)
    p = moe.RULE.predict({"x": x}, 299, RuleEnv("gfx950", 256))
    assert p.key == "bk128/mfma16/kpack1" and "M=300" in p.reason and "medium_M" in p.reason
    assert p.variant.startswith("BM128xBN128xBK128")
    alone = moe.RULE.predict({"x": x[:10]}, 0, RuleEnv("gfx950", 256))
    assert moe.RULE.expect(alone.key, p.key) == "switch" and moe.RULE.expect(p.key, p.key) == "equal"
    with pytest.raises(ValueError, match=r"request: expected a token row in \[0, 300\)"):
        moe.RULE.predict({"x": x}, 300, RuleEnv("gfx950", 256))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="arch: 'gfx90a' is not accepted"):
        moe.get_config(1, "gfx90a", torch.bfloat16)
    with pytest.raises(ValueError, match="m: expected a positive int"):
        moe.get_config(0, "gfx950", torch.bfloat16)
