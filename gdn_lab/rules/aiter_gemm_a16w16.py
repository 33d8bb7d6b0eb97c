"""AITER's Triton `gemm_a16w16`: which config a launch takes by M, read from the installed wheel's JSON.

Read from amd-aiter 0.1.7.post2.dev18, `aiter/ops/triton/gemm_a16w16.py::gemm_a16w16` and
`aiter/ops/triton/_triton_kernels/gemm_a16w16.py::_get_config` (the kernel beside it):

- the table is `aiter/ops/triton/configs/gemm/{device}-GEMM-A16W16-N={N}-K={K}.json` when that file
  exists, else `{device}-GEMM-A16W16.json`, with device = `arch_info.get_device()`: "MI300X" on
  gfx942 and "MI350X" on gfx950 (the only two archs it maps);
- M picks the first `M_LEQ_<b>` entry, for b in 4, 8, ..., 8192, with M <= b that the table has,
  else the entry "any";
- then `NUM_KSPLIT` defaults to 1, `SPLITK_BLOCK_SIZE = ceil(K / NUM_KSPLIT)`, and a
  `BLOCK_SIZE_K` above `SPLITK_BLOCK_SIZE` becomes next_pow2(SPLITK_BLOCK_SIZE), divided by 4 when
  that is still above it; `BLOCK_SIZE_K` is at least 16.

The tables are read from the installed aiter at run time (never a copy): every answer records the
file and the aiter version it came from. Without an installed aiter the functions raise ImportError
with the install hint.

What a row's bits depend on (`numerics_key`), by reading the kernel: each output element is one
fp32 accumulator that adds `tl.dot` of BLOCK_SIZE_K-wide slices of its K range in order; with
NUM_KSPLIT > 1 the K range is cut into SPLITK_BLOCK_SIZE pieces whose fp32 partials a second kernel
sums (`tl.sum` over a next_pow2(NUM_KSPLIT) axis). So the key holds BLOCK_SIZE_K and the split,
plus the two launch options that choose the matrix instruction (`matrix_instr_nonkdim`, `kpack`):
another MFMA shape sums another number of products per hardware step. Where the instruction is
not fixed by the config (no `matrix_instr_nonkdim`, or a tile smaller than it, as the 1 x 4 tiles
of the MI350X N=128 K=2880 file up to M 16), Triton's AMD backend picks it from the tile (or
falls back to an FMA dot, as triton/backends/amd/compiler.py says), so the key holds the tile
too. Otherwise BLOCK_SIZE_M/N, and always GROUP_SIZE_M, num_warps, num_stages, waves_per_eu and
cache_modifier, only tile, order or cache the work: rows keep their arithmetic. Whether a
BLOCK_SIZE_K change alone moves bits on hardware depends on how the compiler chains the MFMAs
inside a block (not in aiter's source); the key counts it as a change.

Facts of the 0.1.7 wheel worth knowing (see tests/rules/test_aiter_gemm_a16w16.py): no A16W16
table sets NUM_KSPLIT above 1, so BLOCK_SIZE_K (and, in two files, the instruction) is what moves;
`MI350X-GEMM-A16W16-N=256-K=7168.json` names its last entry `M_GEQ_4096`, which `_get_config`
never reads, and has no "any", so M > 2048 at that shape raises KeyError in AITER (here a
LookupError); and `_get_config` caches the default table of the arch of its first call (and its
answers by (M, N, K) alone), so a process that switches the emulated arch keeps the first arch's
default configs. This rule answers for a process that starts on `arch`.

Example:
    >>> c = get_config(64, 4096, 4096, "gfx950")
    >>> c.file_name, c.entry, c.key
    ('MI350X-GEMM-A16W16.json', 'M_LEQ_64', 'bk256/ksplit1/mfma16/kpack1')
    >>> get_config(129, 4096, 4096, "gfx950").key
    'bk128/ksplit1/mfma16/kpack1'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gdn_lab import aiter, checks
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
    "aiter/ops/triton/_triton_kernels/gemm_a16w16.py::_get_config + configs/gemm/{device}-GEMM-A16W16[-N=..-K=..].json"
)
NUMERICS_FIELDS = ("BLOCK_SIZE_K", "NUM_KSPLIT", "SPLITK_BLOCK_SIZE", "matrix_instr_nonkdim", "kpack")
TILING_FIELDS = (
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
    "waves_per_eu",
    "cache_modifier",
)


@dataclass(frozen=True)
class GemmA16W16Constants:
    """The constants of `_get_config` (code, not table data).

    Attributes:
        m_bounds: the `M_LEQ_<b>` bounds it tries, in order.
        fallback_entry: the entry it takes when no bound applies.
        min_block_k: the smallest BLOCK_SIZE_K.
        default_num_ksplit: NUM_KSPLIT when the entry has none.
        default_kpack: Triton's AMD `kpack` option when the entry has none.
    """

    m_bounds: tuple[int, ...] = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
    fallback_entry: str = "any"
    min_block_k: int = 16
    default_num_ksplit: int = 1
    default_kpack: int = 1


CONSTANTS = GemmA16W16Constants()


class NoConfigEntry(LookupError):
    """The table has no entry for this M: AITER's `_get_config` raises KeyError('any') there."""


@dataclass(frozen=True)
class ConfigFile:
    """The table one (arch, N, K) reads.

    Attributes:
        path: the file in the installed aiter.
        specific: True for the `-N={N}-K={K}` file, False for the device's default table.
        aiter_version: the installed aiter's version.
    """

    path: Path
    specific: bool
    aiter_version: str | None


@dataclass(frozen=True)
class GemmConfig:
    """The config one launch of `gemm_a16w16` takes.

    Attributes:
        m, n, k: the launch (x [M, K], w [N, K]).
        arch: "gfx942" or "gfx950".
        file: the table it came from.
        entry: the table entry ("M_LEQ_64", "any").
        config: the entry after `_get_config`'s adjustments (NUM_KSPLIT, SPLITK_BLOCK_SIZE, BLOCK_SIZE_K).
    """

    m: int
    n: int
    k: int
    arch: str
    file: ConfigFile
    entry: str
    config: Mapping[str, Any]

    @property
    def file_name(self) -> str:
        return self.file.path.name

    @property
    def num_ksplit(self) -> int:
        return int(self.config["NUM_KSPLIT"])

    @property
    def splitk_block_size(self) -> int:
        return int(self.config["SPLITK_BLOCK_SIZE"])

    @property
    def actual_ksplit(self) -> int:
        """The K pieces the reduce sums (`ACTUAL_KSPLIT = ceil(K / SPLITK_BLOCK_SIZE)`)."""
        return -(-self.k // self.splitk_block_size)

    @property
    def block_size_k(self) -> int:
        return int(self.config["BLOCK_SIZE_K"])

    @property
    def variant(self) -> str:
        """The whole launch config in one string, tiling included (not the entry's name: two entries
        holding the same config launch the same kernel)."""
        c = self.config
        return (
            f"BM{c['BLOCK_SIZE_M']}xBN{c['BLOCK_SIZE_N']}xBK{c['BLOCK_SIZE_K']}"
            f"/ksplit{c['NUM_KSPLIT']}/g{c.get('GROUP_SIZE_M')}/w{c.get('num_warps')}/s{c.get('num_stages')}"
            f"/wpe{c.get('waves_per_eu')}/mfma{c.get('matrix_instr_nonkdim', 0)}/kpack{c.get('kpack', CONSTANTS.default_kpack)}"
            f"/{c.get('cache_modifier') or 'nocache'}"
        )

    @property
    def key(self) -> str:
        """What a row's bits depend on (see the module docstring)."""
        return numerics_key(self)


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def config_file(arch: str, n: int, k: int) -> ConfigFile:
    """The table `_get_config` reads for (arch, N, K): the N/K file if it exists, else the default.

    Example:
        >>> config_file("gfx950", 2880, 4096).path.name, config_file("gfx942", 2880, 4096).path.name
        ('MI350X-GEMM-A16W16-N=2880-K=4096.json', 'MI300X-GEMM-A16W16.json')
    """
    checks.check_choice("arch", arch, tuple(AITER_DEVICES))
    checks.check_positive("n", n)
    checks.check_positive("k", k)
    folder, version = aiter_config_folder("gemm")
    device = AITER_DEVICES[arch]
    specific = folder / f"{device}-GEMM-A16W16-N={n}-K={k}.json"
    if specific.is_file():
        return ConfigFile(specific, True, version)
    default = folder / f"{device}-GEMM-A16W16.json"
    if not default.is_file():
        raise ImportError(f"the installed aiter {version} has no {default.name} in {folder}: {aiter.INSTALL_HINT}")
    return ConfigFile(default, False, version)


@cache
def load_table(path: str | Path) -> dict[str, dict[str, Any]]:
    """One config table: entry name -> config (read once per path)."""
    with Path(path).open(encoding="utf-8") as f:
        table = json.load(f)
    if not isinstance(table, dict):
        raise ValueError(f"path: {path} does not hold a JSON object of config entries")
    return table


def select_entry(table: Mapping[str, Any], m: int, constants: GemmA16W16Constants = CONSTANTS) -> str:
    """The entry `_get_config` takes for M: the first `M_LEQ_<b>` present with M <= b, else "any".

    Raises:
        NoConfigEntry: neither applies (AITER raises KeyError('any') there).

    Example:
        >>> select_entry({"M_LEQ_64": {}, "M_LEQ_256": {}, "any": {}}, 65)
        'M_LEQ_256'
    """
    checks.check_positive("m", m)
    for bound in constants.m_bounds:
        if m <= bound and f"M_LEQ_{bound}" in table:
            return f"M_LEQ_{bound}"
    if constants.fallback_entry in table:
        return constants.fallback_entry
    raise NoConfigEntry(
        f"m: {m} is above every M_LEQ_<b> entry of the table and it has no {constants.fallback_entry!r} entry "
        f"(entries: {', '.join(table)}); AITER's _get_config raises KeyError there"
    )


def _adjusted(entry: Mapping[str, Any], k: int, constants: GemmA16W16Constants) -> dict[str, Any]:
    cfg = dict(entry)
    cfg.setdefault("NUM_KSPLIT", constants.default_num_ksplit)
    split = -(-k // int(cfg["NUM_KSPLIT"]))
    cfg["SPLITK_BLOCK_SIZE"] = split
    if cfg["BLOCK_SIZE_K"] > split:
        bk = _next_pow2(split)
        cfg["BLOCK_SIZE_K"] = bk // 4 if bk > split else bk
    cfg["BLOCK_SIZE_K"] = max(cfg["BLOCK_SIZE_K"], constants.min_block_k)
    return cfg


def config_from(
    file: ConfigFile, m: int, n: int, k: int, arch: str, constants: GemmA16W16Constants = CONSTANTS
) -> GemmConfig:
    """The config for M in an already chosen table (`config_file`), with AITER's adjustments."""
    table = load_table(file.path)
    entry = select_entry(table, m, constants)
    return GemmConfig(m, n, k, arch, file, entry, _adjusted(table[entry], k, constants))


def get_config(m: int, n: int, k: int, arch: str, constants: GemmA16W16Constants = CONSTANTS) -> GemmConfig:
    """The config AITER's `gemm_a16w16` launches for x [M, K] @ w[N, K].T on `arch`.

    Args:
        m, n, k: the launch's sizes (M: rows of x, tokens).
        arch: "gfx942" (MI300X tables) or "gfx950" (MI350X tables).
        constants: the rule's constants.

    Returns:
        A GemmConfig (its `file` names the table and the aiter version it came from).

    Raises:
        ImportError: aiter is not installed.
        NoConfigEntry: the table has no entry for M (AITER raises KeyError there).
    """
    return config_from(config_file(arch, n, k), m, n, k, arch, constants)


def numerics_key(config: GemmConfig) -> str:
    """What a row's bits depend on: BLOCK_SIZE_K, the K split, the matrix instruction (see the module docstring).

    Example:
        >>> get_config(2048, 2880, 512, "gfx950").key
        'bk128/ksplit1/mfma16/kpack1'
    """
    split = f"ksplit{config.num_ksplit}" + (f":{config.splitk_block_size}" if config.num_ksplit > 1 else "")
    return f"bk{config.block_size_k}/{split}/{instruction_key(config.config, CONSTANTS.default_kpack)}"


def switch_points(n: int, k: int, arch: str, max_m: int = 8193, numerics_only: bool = False) -> list[int]:
    """The M in 2..max_m whose config (or, with `numerics_only`, numerics key) differs from M - 1's.

    Two entries holding the same config are one config: a new entry name alone is no switch.

    Example:
        >>> switch_points(4096, 4096, "gfx950", 1024), switch_points(4096, 4096, "gfx950", 1024, True)
        ([65, 129, 257, 513], [129, 257])
    """
    checks.check_positive("max_m", max_m)
    file = config_file(arch, n, k)
    return switches_by_m(lambda m: config_from(file, m, n, k, arch), max_m, numerics_only)


@dataclass(frozen=True)
class GemmA16W16Rule:
    """The DispatchRule of `gemm_a16w16`'s config by M, for a validated matmul call.

    The launch is x [M, K] @ w [K, N] (AITER's w is the lab's w transposed, [N, K]); every row of
    one launch shares its config, so the request (a row index) only has to lie in [0, M).
    """

    name: str = "aiter_gemm_a16w16"
    source: str = SOURCE

    def predict(self, args: Mapping[str, Any], request: int, env: RuleEnv) -> Predicted:
        """The config of the call `args` (matmul's validated arguments), seen from row `request`."""
        x, w = args["x"], args["w"]
        m, k, n = x.shape[0], w.shape[0], w.shape[1]
        check_row(request, m, "a row index")
        cfg = get_config(m, n, k, env.arch)
        reason = f"M={m}: {cfg.file_name} entry {cfg.entry} (aiter {cfg.file.aiter_version})"
        return Predicted(cfg.variant, cfg.key, reason)

    def expect(self, alone_key: str, batched_key: str) -> str:
        """ "equal" for the same key, else "switch"."""
        return equal_or_switch(alone_key, batched_key)


RULE = GemmA16W16Rule()
