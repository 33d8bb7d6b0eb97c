"""Platform and architecture detection, fp8 dtype per arch, the environment fingerprint.

Everything here is cheap and never raises on a machine without a GPU: a result table must be
able to say where it came from whatever the machine.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform as _platform
import sys
from dataclasses import asdict, dataclass
from functools import cache

import torch

# The fp8 KV formats each arch stores natively. gfx942 (MI300X/MI308X) has only the FNUZ variant
# (max 240), gfx950 (MI350X/MI355X) and NVIDIA Hopper/Ada the OCP variant (max 448). The CPU
# emulates either, so an experiment can study one arch's numerics anywhere.
FP8_DTYPES_BY_ARCH_FAMILY: dict[str, tuple[torch.dtype, ...]] = {
    "gfx94": (torch.float8_e4m3fnuz,),
    "gfx95": (torch.float8_e4m3fn,),
    "sm": (torch.float8_e4m3fn,),
    "cpu": (torch.float8_e4m3fn, torch.float8_e4m3fnuz),
}


@dataclass(frozen=True)
class DeviceInfo:
    """What the lab needs to know about one torch device.

    Attributes:
        platform: "cpu", "cuda" (NVIDIA) or "rocm" (AMD).
        name: the device's marketing name, or the CPU's processor string.
        arch: "sm_90" style on NVIDIA, "gfx942"/"gfx950" on AMD, "cpu" on the CPU.
        num_sms: streaming multiprocessors (NVIDIA) or compute units (AMD); on the CPU the number of
            torch threads, as batch_invariant_ops does.
        fp8_dtype: the fp8 KV-cache dtype the arch stores natively.
    """

    platform: str
    name: str
    arch: str
    num_sms: int
    fp8_dtype: torch.dtype


def _family(arch: str) -> str:
    if arch.startswith("sm_"):
        return "sm"
    if arch.startswith("gfx"):
        return arch[:5]
    return "cpu"


def fp8_dtypes_for(arch: str) -> tuple[torch.dtype, ...]:
    """The fp8 dtypes an arch has for the KV cache (the first is its default).

    Args:
        arch: "gfx942", "gfx950", "sm_90", "cpu", ...

    Raises:
        ValueError: for an AMD arch the lab has no fp8 table for (gfx90a and older have no fp8).
    """
    fam = _family(arch)
    if fam not in FP8_DTYPES_BY_ARCH_FAMILY:
        raise ValueError(f"arch {arch!r} has no fp8 KV format known to gdn_lab; accepted: gfx942, gfx950, sm_XX, cpu")
    return FP8_DTYPES_BY_ARCH_FAMILY[fam]


def fp8_dtype_for(arch: str) -> torch.dtype:
    """The native fp8 KV dtype of `arch`: float8_e4m3fnuz on gfx942, float8_e4m3fn elsewhere."""
    return fp8_dtypes_for(arch)[0]


def check_fp8_dtype(name: str, dtype: torch.dtype, arch: str) -> None:
    """Raise a ValueError naming `name` if `arch` does not store fp8 as `dtype`."""
    accepted = fp8_dtypes_for(arch)
    if dtype not in accepted:
        names = ", ".join(str(d).removeprefix("torch.") for d in accepted)
        raise ValueError(
            f"{name}: {str(dtype).removeprefix('torch.')} is not an fp8 format of arch {arch}; accepted: {names}"
        )


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz)


def platform_of(device: torch.device | str | None = None) -> str:
    """ "cpu", "cuda" or "rocm" for a device (default: the current accelerator if any, else cpu)."""
    dev = torch.device(device) if device is not None else default_device()
    if dev.type != "cuda":
        return "cpu"
    return "rocm" if torch.version.hip else "cuda"


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


@cache
def _info(device_str: str) -> DeviceInfo:
    dev = torch.device(device_str)
    plat = platform_of(dev)
    if plat == "cpu":
        name = _platform.processor() or _platform.machine() or "cpu"
        return DeviceInfo("cpu", name, "cpu", torch.get_num_threads(), fp8_dtype_for("cpu"))
    props = torch.cuda.get_device_properties(dev)
    arch = props.gcnArchName.split(":")[0] if plat == "rocm" else f"sm_{props.major}{props.minor}"
    try:
        fp8 = fp8_dtype_for(arch)
    except ValueError:
        fp8 = torch.float8_e4m3fn
    return DeviceInfo(plat, props.name, arch, props.multi_processor_count, fp8)


def detect(device: torch.device | str | None = None) -> DeviceInfo:
    """Describe a device (default: the current accelerator, else the CPU).

    Example:
        >>> detect("cpu").arch
        'cpu'
    """
    dev = torch.device(device) if device is not None else default_device()
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return _info(str(dev))


def triton_mode(device: torch.device | str | None = None) -> tuple[str | None, str]:
    """How Triton kernels can run on `device`: ("gpu" | "interpreter" | None, reason)."""
    dev = torch.device(device) if device is not None else default_device()
    if _version("triton") is None:
        return None, "triton is not installed"
    if dev.type == "cuda":
        return "gpu", f"triton {_version('triton')} on {platform_of(dev)}"
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "interpreter", "TRITON_INTERPRET=1: Triton's interpreter on the CPU"
    return None, "no GPU and TRITON_INTERPRET is not set (set TRITON_INTERPRET=1 to run Triton on the CPU)"


@cache
def _version(dist: str) -> str | None:
    # importlib.metadata scans site-packages (~0.2 ms); routing asks on every call.
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _own_version() -> str:
    from gdn_lab import __version__

    return __version__


def package_versions() -> dict[str, str | None]:
    """Versions of the packages whose kernels the lab measures, read without importing them."""
    return {
        "python": _platform.python_version(),
        "torch": torch.__version__,
        "triton": _version("triton") or _version("pytorch-triton-rocm"),
        "fla": _version("fla-core") or _version("flash-linear-attention"),
        "aiter": _version("amd-aiter") or _version("aiter"),
        "flydsl": _version("flydsl"),
        "gdn_lab": _version("gdn_lab") or _own_version(),  # on PYTHONPATH without an install
    }


def fingerprint(device: torch.device | str | None = None) -> dict[str, object]:
    """The environment fingerprint every result table carries, so runs from two machines join.

    Returns a flat dict: package versions, the device's platform, name, arch and SM/CU count,
    the torch CUDA/HIP version, whether Triton runs in its interpreter, and how AITER's Triton
    kernels load here (aiter_route, aiter_arch and aiter_num_cus: `gdn_lab.aiter_loader`).
    """
    info = detect(device)
    fp: dict[str, object] = dict(package_versions())
    fp.update({k: v for k, v in asdict(info).items() if k != "fp8_dtype"})
    fp["device"] = fp.pop("name")
    fp["fp8_dtype"] = str(info.fp8_dtype).removeprefix("torch.")
    fp["cuda"] = torch.version.cuda
    fp["hip"] = torch.version.hip
    fp["triton_interpret"] = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    fp["os"] = f"{_platform.system()} {_platform.release()}"
    fp["executable"] = sys.executable
    from gdn_lab.aiter_loader import fingerprint_fields  # aiter's route and emulated arch; imports no aiter

    fp.update(fingerprint_fields(device))
    return fp
