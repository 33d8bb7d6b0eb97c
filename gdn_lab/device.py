"""Platform and architecture detection, fp8 dtype per arch, whether Triton runs here, package versions.

Everything here is cheap and never raises on a machine without a GPU: a result table must be
able to say where it came from whatever the machine. The environment fingerprint is composed
above this module (`gdn_lab.environment`), from these facts, AITER's route and gdn_lab's commit.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import platform as _platform
import sys
from collections.abc import Iterator
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
def _cpu_name() -> str:
    return _platform.processor() or _platform.machine() or "cpu"


@cache
def _info(device_str: str) -> DeviceInfo:
    dev = torch.device(device_str)
    plat = platform_of(dev)
    props = torch.cuda.get_device_properties(dev)
    arch = props.gcnArchName.split(":")[0] if plat == "rocm" else f"sm_{props.major}{props.minor}"
    try:
        fp8 = fp8_dtype_for(arch)
    except ValueError:
        fp8 = torch.float8_e4m3fn
    return DeviceInfo(plat, props.name, arch, props.multi_processor_count, fp8)


# The GPU every device reads as inside `compiling_for` (None outside it).
_COMPILING_FOR: DeviceInfo | None = None


@contextlib.contextmanager
def compiling_for(info: DeviceInfo) -> Iterator[None]:
    """Inside the block `detect` describes every device as `info`: the lab's config choosers pick
    what they would on that GPU while `gdn_lab.ops.offline_compile` compiles for it on another
    machine. Not for running kernels (tensors stay where they are)."""
    global _COMPILING_FOR
    saved, _COMPILING_FOR = _COMPILING_FOR, info
    try:
        yield
    finally:
        _COMPILING_FOR = saved


def detect(device: torch.device | str | None = None) -> DeviceInfo:
    """Describe a device (default: the current accelerator, else the CPU); inside `compiling_for`,
    the GPU compiled for.

    Example:
        >>> detect("cpu").arch
        'cpu'
    """
    if _COMPILING_FOR is not None:
        return _COMPILING_FOR
    dev = torch.device(device) if device is not None else default_device()
    if dev.type != "cuda":  # read live: torch's thread count can change within a process
        return DeviceInfo("cpu", _cpu_name(), "cpu", torch.get_num_threads(), fp8_dtype_for("cpu"))
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return _info(str(dev))


# The values Triton reads as true for a boolean variable (triton.knobs' getenv_bool, case-insensitive).
_TRUE_VALUES = ("1", "true", "on", "yes", "y")
NO_TRITON_HERE = "no GPU and TRITON_INTERPRET is not set (set TRITON_INTERPRET=1 to run Triton on the CPU)"


# os.environ's own dict and key encoding, when it has them (CPython's os._Environ on every
# platform): a lookup of an unset variable through os.environ.get raises and catches a KeyError
# (about 1.3 us, against 0.1 us for the dict); the eager decode path asks several times per step.
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey("TRITON_INTERPRET") if hasattr(os.environ, "encodekey") else None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter: TRITON_INTERPRET is set to a value
    Triton reads as true ("1", "true", "on", "yes", "y", any case).

    Read at every call (it is an environment lookup): the variable may be set after import, as
    `gdn-lab run`, `gdn-lab invariance` and the notebooks' `setup()` do on the CPU.
    """
    if _ENV_DATA is not None and _ENV_KEY is not None:
        raw = _ENV_DATA.get(_ENV_KEY)
        return raw is not None and _reads_true(raw)
    return os.environ.get("TRITON_INTERPRET", "").lower() in _TRUE_VALUES


@cache
def _reads_true(raw: bytes | str) -> bool:
    """Whether an encoded TRITON_INTERPRET value reads as true (cached: decoding it costs more than the lookup)."""
    return os.environ.decodevalue(raw).lower() in _TRUE_VALUES


@cache
def triton_installed() -> bool:
    """Whether `triton` is importable (found without importing it; cached: routing asks on every call)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


@cache
def _on_gpu(platform: str) -> str:
    return f"triton {triton_version()} on {platform}"


def triton_mode(device: torch.device | str | None = None) -> tuple[str | None, str]:
    """Whether and how Triton kernels run on `device`: the one place the lab decides it.

    Args:
        device: where the kernel's tensors live (default: the current accelerator, else the CPU).

    Returns:
        ("gpu", reason) on a CUDA/ROCm device, ("interpreter", reason) on the CPU when
        TRITON_INTERPRET is on (`interpreting()`), else (None, why not): triton is not
        installed, or the CPU without the interpreter.

    Example:
        >>> triton_mode("cpu")[0] in (None, "interpreter")
        True
    """
    dev = (
        device if isinstance(device, torch.device) else torch.device(device) if device is not None else default_device()
    )
    if not triton_installed():
        return None, "triton is not installed"
    if dev.type == "cuda":
        return "gpu", _on_gpu("rocm" if torch.version.hip else "cuda")
    if interpreting():
        return "interpreter", "TRITON_INTERPRET=1: Triton's interpreter on the CPU"
    return None, NO_TRITON_HERE


def interpreter_default(device: torch.device | str | None = None) -> bool:
    """On the CPU, set TRITON_INTERPRET=1 unless the environment already sets it, as
    `gdn-lab invariance`, `gdn-lab env` and the notebooks' `setup()` do, before any Triton kernel
    module is imported (triton.jit reads the variable when it decorates). `gdn-lab run` sets it
    to 1 for its notebooks' kernels on the CPU (`report.runner.kernel_env`).

    Returns:
        True if this call set it.
    """
    dev = torch.device(device) if device is not None else default_device()
    if dev.type != "cpu" or "TRITON_INTERPRET" in os.environ:
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


@cache
def _version(dist: str) -> str | None:
    # importlib.metadata scans site-packages (~0.2 ms); routing asks on every call.
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def triton_version() -> str | None:
    """Triton's version (the `triton` distribution, or ROCm's `pytorch-triton-rocm`)."""
    return _version("triton") or _version("pytorch-triton-rocm")


def package_versions() -> dict[str, str | None]:
    """Versions of the packages whose kernels the lab measures, read without importing them."""
    return {
        "python": _platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version(),
        "fla": _version("fla-core") or _version("flash-linear-attention"),
        "aiter": _version("amd-aiter") or _version("aiter"),
        "flydsl": _version("flydsl"),
    }


def device_fields(device: torch.device | str | None = None) -> dict[str, object]:
    """The device's part of the environment fingerprint (`gdn_lab.environment.fingerprint`).

    Returns a flat dict: platform, device (its name), arch, num_sms, fp8_dtype, the torch CUDA/HIP
    versions, how Triton runs on it (triton_mode: "gpu", "interpreter" or None) and whether
    TRITON_INTERPRET is on, the OS and the Python executable.
    """
    info = detect(device)
    fp: dict[str, object] = {k: v for k, v in asdict(info).items() if k != "fp8_dtype"}
    fp["device"] = fp.pop("name")
    fp["fp8_dtype"] = str(info.fp8_dtype).removeprefix("torch.")
    fp["cuda"] = torch.version.cuda
    fp["hip"] = torch.version.hip
    fp["triton_mode"] = triton_mode(device)[0]
    fp["triton_interpret"] = interpreting()
    fp["os"] = f"{_platform.system()} {_platform.release()}"
    fp["executable"] = sys.executable
    return fp
