"""What a dispatch rule answers, so a backend can carry the rule it follows.

A library kernel whose config follows the batch (AITER's pa_decode V1/V2, unified_attention's
2D/3D split, FlyDSL's WARP_THREADS_K, ...) is described by a rule: data read from the library's
source, plus a predictor. A backend that runs such a kernel names its rule (`Backend.rule`), and
an experiment asks it, for one launch, which variant runs and what one request's bits depend on:

- `predict(args, request, env)`: the launch's variant and the request's numerics key;
- `expect(alone_key, batched_key)`: what the request's bits should do between two launches:
  "equal", "switch", or "rounding" (only the last rounding differs: the bits may or may not move).

Example:
    >>> env = RuleEnv(arch="gfx950", num_cus=256)
    >>> Predicted("v2", "partitioned", "4 partitions").variant
    'v2'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gdn_lab import aiter

EXPECTATIONS = ("equal", "switch", "rounding")


@dataclass(frozen=True)
class RuleEnv:
    """What a rule sees of the machine: the arch the library dispatches for and its CU/SM count."""

    arch: str
    num_cus: int


@dataclass(frozen=True)
class Predicted:
    """A rule's answer for one launch.

    Attributes:
        variant: the kernel or config the launch takes ("v1", "3d:16seg", "wtk=8", "hip").
        key: what the request's bits depend on under that variant (two launches with the same key
            give it the same bits, by the rule).
        reason: the condition that decided, in words (the threshold and the values it compared).
    """

    variant: str
    key: str
    reason: str


class DispatchRule(Protocol):
    """The rule a backend follows (see the module docstring).

    Attributes:
        name: short name ("aiter_pa_decode").
        source: the library, version and file::function the rule was read from.
    """

    name: str
    source: str

    def predict(self, args: Mapping[str, Any], request: int, env: RuleEnv) -> Predicted:
        """The launch of the validated call `args`, seen from request index `request`."""
        ...

    def expect(self, alone_key: str, batched_key: str) -> str:
        """One of EXPECTATIONS for a request whose keys alone and batched are given."""
        ...


@dataclass(frozen=True)
class CallRule:
    """A DispatchRule made of a rule module's functions.

    Attributes:
        name: short name.
        source: what the rule was read from.
        launch: (validated args, env) -> the module's prediction of the launch (with `variant` and
            `reason` attributes).
        key: (that prediction, validated args, request index) -> the request's numerics key.
        compare: (alone key, batched key) -> one of EXPECTATIONS.
    """

    name: str
    source: str
    launch: Callable[[Mapping[str, Any], RuleEnv], Any]
    key: Callable[[Any, Mapping[str, Any], int], str]
    compare: Callable[[str, str], str]

    def predict(self, args: Mapping[str, Any], request: int, env: RuleEnv) -> Predicted:
        launch = self.launch(args, env)
        return Predicted(launch.variant, self.key(launch, args, request), launch.reason)

    def expect(self, alone_key: str, batched_key: str) -> str:
        return self.compare(alone_key, batched_key)


# AITER's arch -> device name (arch_info._ARCH_TO_DEVICE): what its 0.1.7 config tables are named by
AITER_DEVICES = {"gfx942": "MI300X", "gfx950": "MI350X"}


def aiter_config_folder(kind: str) -> tuple[Path, str | None]:
    """The installed aiter's `ops/triton/configs/<kind>` folder (the tuned tables its Triton kernels
    read: "gemm", "moe") and the aiter version, found on the file system (aiter is not imported).

    Raises:
        ImportError: aiter is not installed, or has no such folder (the message says how to install it).
    """
    p = aiter.probe()
    if not p.installed or p.location is None:
        raise ImportError(
            f"aiter is not installed; the lab's AITER rules read its {kind} config tables: {aiter.INSTALL_HINT}"
        )
    folder = Path(p.location, "ops", "triton", "configs", kind)
    if not folder.is_dir():
        raise ImportError(
            f"the installed aiter {p.version} at {p.location} has no ops/triton/configs/{kind} folder; "
            f"the lab was written against {aiter.WRITTEN_AGAINST}: {aiter.INSTALL_HINT}"
        )
    return folder, p.version


def switches_by_m(config_at: Callable[[int], Any], max_m: int, numerics_only: bool) -> list[int]:
    """The M in 2..max_m whose config (`config_at(m)`: with `key` and `config` mappings) differs
    from M - 1's: its numerics key, or with numerics_only False the whole config (two entries
    holding the same config are one config)."""
    points, last = [], None
    for m in range(1, max_m + 1):
        cfg = config_at(m)
        now = cfg.key if numerics_only else sorted(cfg.config.items())
        if last is not None and now != last:
            points.append(m)
        last = now
    return points


def check_row(request: object, m: int, what: str) -> None:
    """A rule keyed by a launch's rows sees every row alike: the request is any row in [0, m)."""
    if not isinstance(request, int) or isinstance(request, bool) or not 0 <= request < m:
        raise ValueError(f"request: expected {what} in [0, {m}) (a row of x), got {request!r}")


def equal_or_switch(alone_key: str, batched_key: str) -> str:
    """ "equal" for the same key, else "switch": a rule whose keys name every numerics change."""
    return "equal" if alone_key == batched_key else "switch"


def instruction_key(config: Mapping[str, Any], default_kpack: int) -> str:
    """The matrix-instruction part of an AITER Triton config's numerics key: `mfma{nonkdim}/kpack{k}`,
    plus `/tile{BM}x{BN}` where the config leaves the instruction to the compiler (no nonkdim, or a
    tile narrower than it), which then picks it from the tile."""
    nonkdim = int(config.get("matrix_instr_nonkdim", 0) or 0)
    key = f"mfma{nonkdim}/kpack{config.get('kpack', default_kpack)}"
    bm, bn = int(config["BLOCK_SIZE_M"]), int(config["BLOCK_SIZE_N"])
    if nonkdim == 0 or min(bm, bn) < nonkdim:
        key += f"/tile{bm}x{bn}"
    return key
