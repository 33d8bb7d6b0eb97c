"""Which AMD device AITER's dispatch is told about off ROCm: the arch and the CU count.

Off ROCm, AITER's Triton kernels ask two questions a non-AMD machine answers wrongly: the arch
(compared with gfx names at import and when picking configs) and the CU count (its split
heuristics). The lab answers both from one setting, the *emulation*: by default gfx950 (MI350X)
with the GPU's own CU count, or the emulated device's on the CPU. `emulate()` changes it for a
`with` block (blocks nest; the outer setting is restored on every exit). On ROCm AITER asks the
real device and the emulation is ignored.

Example:
    >>> with emulate("gfx942"):
    ...     current_emulation().arch
    'gfx942'
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from gdn_lab import checks
from gdn_lab.aiter.probe import on_rocm
from gdn_lab.device import detect


@dataclass(frozen=True)
class EmulatedDevice:
    """An AMD device whose AITER dispatch the lab reproduces off ROCm.

    Attributes:
        arch: the gfx name AITER is told.
        name: the device whose CU count is used.
        num_cus: its compute units (public specs).
    """

    arch: str
    name: str
    num_cus: int


# gfx942 is emulated as the MI308X (80 CUs), the lab's gfx942 target; AITER's own config files
# for gfx942 are named MI300X (304 CUs) and are the ones it reads either way.
EMULATED_DEVICES = {
    "gfx950": EmulatedDevice("gfx950", "MI350X", 256),
    "gfx942": EmulatedDevice("gfx942", "MI308X", 80),
}
DEFAULT_ARCH = "gfx950"


@dataclass(frozen=True)
class Emulation:
    """Which AMD device AITER's dispatch is told about off ROCm.

    Attributes:
        arch: "gfx950" or "gfx942".
        num_cus: the CU count AITER's split heuristics see; None: the GPU's own count, or the
            emulated device's on the CPU.
    """

    arch: str = DEFAULT_ARCH
    num_cus: int | None = None

    def __post_init__(self) -> None:
        checks.check_choice("arch", self.arch, tuple(EMULATED_DEVICES))
        if self.num_cus is not None:
            checks.check_positive("num_cus", self.num_cus)


DEFAULT = Emulation()
_EMULATION: list[Emulation] = [DEFAULT]


@contextlib.contextmanager
def emulate(arch: str = DEFAULT_ARCH, num_cus: int | None = None) -> Iterator[Emulation]:
    """Within the block, AITER backends run as on `arch` with `num_cus` CUs (off ROCm).

    Args:
        arch: the emulated arch, "gfx950" (MI350X) or "gfx942" (MI308X).
        num_cus: the CU count AITER's heuristics see; None for the default (see `Emulation`).

    Raises:
        ValueError: an arch other than gfx950/gfx942, or num_cus < 1.
    """
    setting = Emulation(arch, num_cus)
    _EMULATION.append(setting)
    try:
        yield setting
    finally:
        _EMULATION.pop()


def current_emulation() -> Emulation:
    """The innermost `emulate()` setting, or the default (gfx950, the device's CUs) outside any block."""
    return _EMULATION[-1]


def emulating() -> bool:
    """True inside an `emulate()` block; False when the default emulation applies."""
    return len(_EMULATION) > 1


def effective_arch(device: torch.device | str | None = None) -> str:
    """The arch AITER dispatches for: the device's own on ROCm, else the emulated one."""
    if on_rocm():
        return detect(device).arch
    return current_emulation().arch


def effective_num_cus(device: torch.device | str | None = None) -> int:
    """The CU/SM count AITER's heuristics see: the override, else the GPU's own, else the emulated device's."""
    setting = current_emulation()
    if setting.num_cus is not None:
        return setting.num_cus
    dev = torch.device(device) if device is not None else None
    if (dev is None or dev.type == "cuda") and torch.cuda.is_available():
        return detect(dev).num_sms
    return EMULATED_DEVICES[effective_arch(device)].num_cus
