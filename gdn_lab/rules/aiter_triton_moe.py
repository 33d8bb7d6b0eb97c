"""AITER's Triton fused MoE (`moe_op.fused_moe`): which config a launch takes by M, read from the installed wheel's JSON.

Read from amd-aiter 0.1.7.post2.dev18, `aiter/ops/triton/utils/moe_config_utils.py::get_optimal_moe_config`
(the config its callers hand to `aiter/ops/triton/moe_op.py::fused_moe`, which takes no default):

- the table is `aiter/ops/triton/configs/moe/{device}-MOE-{dtype}.json`, device "MI300X" on gfx942
  and "MI350X" on gfx950 (`arch_info.get_device()`; later aiter names the file by the arch,
  `gfx950-MOE-...`, and the rule reads whichever the installed aiter has), dtype "DEFAULT" for
  fp16 and bf16 (and "float32" for fp32, a file no version ships);
- M, the tokens of the launch, picks `small_M` below 256, `medium_M` below 1024, else `large_M`
  (`M_THRESHOLD_SMALL`, `M_THRESHOLD_MEDIUM`);
- without a table, one hard-coded config (256 x 256 x 64, 8 warps).

The tables are read from the installed aiter at run time (never a copy): every answer records the
file and the aiter version it came from. Without an installed aiter the functions raise ImportError
with the install hint.

What a row's bits depend on (`numerics_key`), by reading the kernel (`_fused_moe_kernel`): each
output element is one float32 accumulator that adds `tl.dot` of BLOCK_SIZE_K-wide slices of K in
order, then is rounded to the compute dtype; there is no K split. So the key holds BLOCK_SIZE_K and
the matrix instruction's launch options (`matrix_instr_nonkdim`, `kpack`); BLOCK_SIZE_M/N,
GROUP_SIZE_M, num_warps, num_stages and waves_per_eu tile, order or schedule the work, and a row
keeps its arithmetic (the tile enters the key only where the config does not fix the instruction,
as in `aiter_gemm_a16w16`). Facts of the 0.1.7 tables (tests/rules/test_aiter_triton_moe.py): on
both archs small_M and large_M read K in 64-wide slices and medium_M in 128, so a token's numerics
key changes where its launch crosses 256 tokens and again at 1024; on MI350X 100 tokens and 2000
share a key, on MI300X they do not (its small_M packs 2 K elements per MFMA operand, kpack 2, the
others 1). fp32 has no table: one config at every M.

Where the key's change was seen: Triton's interpreter, where each K slice is a dot of its own
(tests/ops/fused_moe/test_aiter_triton.py). Compiled for an H100 (sm_90, Triton 3.6, bf16, MI350X
tables), a token kept every bit across both switches, M = 1 against 8 to 4096
(data/bench/h100/bench_fused_moe.csv): there the slices chain into one accumulation in k order
whatever their width. So a predicted switch is "may change bits", and on AMD hardware it has not
been run.

Example:
    >>> c = get_config(100, "gfx950", torch.bfloat16)
    >>> c.file_name, c.entry, c.key
    ('MI350X-MOE-DEFAULT.json', 'small_M', 'bk64/mfma16/kpack1')
    >>> switch_points("gfx950", torch.float16, 2048)
    [256, 1024]
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch

from gdn_lab import checks
from gdn_lab.rules.base import (
    AITER_DEVICES,
    Predicted,
    RuleEnv,
    aiter_config_folder,
    check_row,
    equal_or_switch,
    instruction_key,
    switches_by_m,
)

SOURCE = (
    "amd-aiter (installed; written against 0.1.7.post2.dev18), "
    "aiter/ops/triton/utils/moe_config_utils.py::get_optimal_moe_config + configs/moe/{device}-MOE-{dtype}.json"
)
DTYPE_FILES = {torch.float16: "DEFAULT", torch.bfloat16: "DEFAULT", torch.float32: "float32"}


@dataclass(frozen=True)
class MoEConstants:
    """The constants of `get_optimal_moe_config` (code, not table data).

    Attributes:
        small_below, medium_below: M below the first takes small_M, below the second medium_M,
            else large_M (`M_THRESHOLD_SMALL`, `M_THRESHOLD_MEDIUM`).
        default_config: the config without a table.
        default_kpack: Triton's AMD `kpack` option when a config has none.
    """

    small_below: int = 256
    medium_below: int = 1024
    default_config: Mapping[str, Any] = field(
        default_factory=lambda: {
            "BLOCK_SIZE_M": 256,
            "BLOCK_SIZE_N": 256,
            "BLOCK_SIZE_K": 64,
            "GROUP_SIZE_M": 8,
            "num_warps": 8,
            "num_stages": 2,
            "waves_per_eu": 0,
            "matrix_instr_nonkdim": 16,
            "kpack": 1,
        }  # fmt: skip
    )
    default_kpack: int = 1


CONSTANTS = MoEConstants()


@dataclass(frozen=True)
class MoEConfig:
    """The config one launch of AITER's Triton fused MoE takes.

    Attributes:
        m: the launch's tokens.
        arch: "gfx942" or "gfx950".
        file: the table it came from (None: no table, the hard-coded default).
        aiter_version: the installed aiter's version.
        entry: "small_M", "medium_M", "large_M", or "default".
        config: the entry.
    """

    m: int
    arch: str
    file: Path | None
    aiter_version: str | None
    entry: str
    config: Mapping[str, Any]

    @property
    def file_name(self) -> str:
        return self.file.name if self.file is not None else "(no table: the hard-coded default)"

    @property
    def variant(self) -> str:
        """The whole launch config in one string (not the entry's name: two entries holding the
        same config launch the same kernel)."""
        c = self.config
        return (
            f"BM{c['BLOCK_SIZE_M']}xBN{c['BLOCK_SIZE_N']}xBK{c['BLOCK_SIZE_K']}/g{c.get('GROUP_SIZE_M')}"
            f"/w{c.get('num_warps')}/s{c.get('num_stages')}/wpe{c.get('waves_per_eu')}"
            f"/mfma{c.get('matrix_instr_nonkdim', 0)}/kpack{c.get('kpack', CONSTANTS.default_kpack)}"
        )

    @property
    def key(self) -> str:
        """What a row's bits depend on (see the module docstring)."""
        return numerics_key(self.config)


def numerics_key(config: Mapping[str, Any]) -> str:
    """BLOCK_SIZE_K and the matrix instruction (the tile too where the config leaves the instruction open).

    Example:
        >>> numerics_key({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "matrix_instr_nonkdim": 16})
        'bk128/mfma16/kpack1'
    """
    return f"bk{int(config['BLOCK_SIZE_K'])}/{instruction_key(config, CONSTANTS.default_kpack)}"


def table_file(arch: str, dtype: torch.dtype) -> tuple[Path | None, str | None]:
    """The installed table `get_optimal_moe_config` reads for (arch, dtype), or None where there is
    none, and the aiter version.

    Raises:
        ImportError: aiter is not installed, or has no configs/moe folder.
    """
    checks.check_choice("arch", arch, tuple(AITER_DEVICES))
    checks.check_choice("dtype", dtype, tuple(DTYPE_FILES))
    folder, version = aiter_config_folder("moe")
    for name in (AITER_DEVICES[arch], arch):
        path = folder / f"{name}-MOE-{DTYPE_FILES[dtype]}.json"
        if path.is_file():
            return path, version
    return None, version


@cache
def load_table(path: Path) -> dict[str, dict[str, Any]]:
    """One config table: entry name -> config (read once per path)."""
    with path.open(encoding="utf-8") as f:
        table = json.load(f)
    missing = {"small_M", "medium_M", "large_M"} - set(table) if isinstance(table, dict) else {"every entry"}
    if missing:
        raise ValueError(f"path: {path} lacks {', '.join(sorted(missing))}, the entries get_optimal_moe_config reads")
    return table


def select_entry(m: int, constants: MoEConstants = CONSTANTS) -> str:
    """The entry for M tokens.

    Example:
        >>> [select_entry(m) for m in (1, 255, 256, 1023, 1024)]
        ['small_M', 'small_M', 'medium_M', 'medium_M', 'large_M']
    """
    checks.check_positive("m", m)
    if m < constants.small_below:
        return "small_M"
    return "medium_M" if m < constants.medium_below else "large_M"


def get_config(m: int, arch: str, dtype: torch.dtype, constants: MoEConstants = CONSTANTS) -> MoEConfig:
    """The config AITER's `get_optimal_moe_config(dtype, M=m)` hands to `fused_moe` on `arch`.

    Raises:
        ImportError: aiter is not installed.
    """
    path, version = table_file(arch, dtype)
    if path is None:
        return MoEConfig(m, arch, None, version, "default", dict(constants.default_config))
    entry = select_entry(m, constants)
    return MoEConfig(m, arch, path, version, entry, dict(load_table(path)[entry]))


def switch_points(arch: str, dtype: torch.dtype, max_m: int = 4096, numerics_only: bool = True) -> list[int]:
    """The M in 2..max_m whose numerics key (or, with numerics_only False, config) differs from M - 1's."""
    checks.check_positive("max_m", max_m)
    return switches_by_m(lambda m: get_config(m, arch, dtype), max_m, numerics_only)


@dataclass(frozen=True)
class AiterTritonMoERule:
    """The DispatchRule of AITER's Triton fused MoE config by M, for a validated fused_moe call.

    Both GEMM launches of a call take the config of its M tokens, and every slot of a launch shares
    it, so the request (a token row) only has to lie in [0, M).
    """

    name: str = "aiter_triton_moe"
    source: str = SOURCE

    def predict(self, args: Mapping[str, Any], request: int, env: RuleEnv) -> Predicted:
        """The config of the call `args` (fused_moe's validated arguments), seen from token `request`."""
        x = args["x"]
        m = x.shape[0]
        check_row(request, m, "a token row")
        cfg = get_config(m, env.arch, x.dtype)
        reason = f"M={m}: {cfg.file_name} entry {cfg.entry} (aiter {cfg.aiter_version})"
        return Predicted(cfg.variant, cfg.key, reason)

    def expect(self, alone_key: str, batched_key: str) -> str:
        """ "equal" for the same key, else "switch"."""
        return equal_or_switch(alone_key, batched_key)


RULE = AiterTritonMoERule()
