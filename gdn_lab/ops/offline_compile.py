"""offline_compile: compile the lab's Triton kernels for a GPU this machine does not have.

The lab's own kernels are meant to run on MI300X/MI308X (gfx942), MI350X/MI355X (gfx950) and NVIDIA
Hopper (sm_90), but a session may only ever see one of them, or none. Triton compiles for any of
its targets without the device (LLVM, ptxas and lld ship in its wheel), so this module runs each
of our Triton backends on production-shaped workloads with every launch turned into a compile
for the target, and reports what each kernel asks of the GPU: its shared memory against the
target's limit per program (a kernel over it fails at launch with OutOfResources), its registers
per thread (AMD: VGPRs), its spills, and whether the target's backend accepted the launch options
at all (Triton's HIP backend rejects `maxnreg`, a CUDA-only option).

Nothing runs: outputs are never written, so host code that reads a kernel's results sees empty
memory; the lab's launch paths read none before their last launch. The configs come from the
lab's own choosers, which see the target's arch through `gdn_lab.device.compiling_for`.

Needs Triton's compiled mode (TRITON_INTERPRET unset when Triton is first imported: under the
interpreter `@triton.jit` makes interpreted functions, which cannot be compiled).

Example:
    >>> from gdn_lab.ops.offline_compile import compile_report   # doctest: +SKIP
    >>> compile_report("gfx942", ops=["decode_attention"])        # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from gdn_lab import device as _device
from gdn_lab.ops import batch as B
from gdn_lab.ops import spec
from gdn_lab.routing import LIBRARY_TRITON, backends


@dataclass(frozen=True)
class Target:
    """A GPU the lab's kernels are compiled for.

    Attributes:
        arch: "sm_90", "gfx942" or "gfx950".
        backend: Triton's backend for it ("cuda" or "hip").
        warp_size: threads per warp (wavefront).
        shared_memory: bytes of shared memory (AMD: LDS) one program may use.
        num_sms: SMs (CUs) of the reference part, for the plans that depend on them.
        name: the reference part.
    """

    arch: str
    backend: str
    warp_size: int
    shared_memory: int
    num_sms: int
    name: str

    @property
    def device_info(self) -> _device.DeviceInfo:
        platform = "cuda" if self.backend == "cuda" else "rocm"
        return _device.DeviceInfo(platform, self.name, self.arch, self.num_sms, _device.fp8_dtype_for(self.arch))

    def triton_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        capability = int(self.arch.removeprefix("sm_")) if self.backend == "cuda" else self.arch
        return GPUTarget(self.backend, capability, self.warp_size)


# Shared memory per program: sm_90's opt-in maximum per block (227 KB), CDNA3's 64 KB of LDS per
# workgroup, CDNA4's 160 KB.
TARGETS = {
    "sm_90": Target("sm_90", "cuda", 32, 232448, 132, "NVIDIA H200"),
    "gfx942": Target("gfx942", "hip", 64, 65536, 304, "AMD Instinct MI300X"),
    "gfx950": Target("gfx950", "hip", 64, 163840, 256, "AMD Instinct MI355X"),
}

# Production head shapes per op beyond the shape dataclass's default (Qwen3-Next's full attention
# per rank, 16/2/256; its GDN layers at TP1, 16/32 heads), as the benchmarks run them.
EXTRA_SHAPES: dict[str, list[Any]] = {
    "decode_attention": [B.AttentionShape(16, 2, 256, page_size=16)],
    "prefill_attention": [B.AttentionShape(16, 2, 256, page_size=16)],
    "gdn_prefill": [B.GDNShape(16, 32, 128)],
    "gdn_layer_prefill": [B.GDNShape(16, 32, 128)],
    "gdn_decode": [B.GDNShape(16, 32, 128)],
}
# Request lengths of the two batches each case runs: a small one (fine plans, short requests) and a
# large one (coarse plans); an op whose requests have a fixed length takes that length instead.
BATCHES = ((300, 1100), (1024,) * 64)


def check_target(arch: str) -> Target:
    """The Target of `arch`, or a ValueError that names the accepted ones."""
    if arch not in TARGETS:
        raise ValueError(f"target: {arch!r} is not accepted; expected one of {', '.join(TARGETS)}")
    return TARGETS[arch]


@dataclass
class _Compiled:
    kernel: str
    options: dict[str, Any]
    compiled: Any = None
    error: str = ""


class _NeverCached(dict):
    """`triton_common._COMPILED` inside the block: launch_cached never finds a compiled kernel, so
    each launch goes through `JITFunction.run` (compiled kernels here have no loaded binary)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


@contextlib.contextmanager
def compiling_for(target: Target) -> Iterator[list[_Compiled]]:
    """Inside the block every Triton launch compiles its kernel for `target` and launches nothing;
    the lab's config choosers see the target (`gdn_lab.device.compiling_for`). Yields the list the
    compiles are appended to, in launch order.

    Raises:
        RuntimeError: Triton runs in interpreter mode in this process.
    """
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from gdn_lab.ops import triton_common

    if _device.interpreting() or not isinstance(triton_common.round_rne, JITFunction):
        raise RuntimeError("compiling for a GPU needs Triton's compiled mode: run without TRITON_INTERPRET")
    compiled: list[_Compiled] = []
    run = JITFunction.run
    # Triton caches each kernel's backend and builds per device: one id per target, apart from any real GPU's
    device_id = _DEVICE_BASE + list(TARGETS).index(target.arch)

    def compile_only(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        record = _Compiled(self.fn.__name__, {k: kwargs[k] for k in kwargs if k in _LAUNCH_OPTIONS})
        compiled.append(record)
        try:
            record.compiled = run(self, *args, grid=grid, warmup=True, **kwargs)
        except Exception as e:  # a target that cannot compile or accept the launch: the report says so
            record.error = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        return record.compiled

    class _Stub:  # the active driver's answers Triton's JIT needs to compile
        def get_current_target(self) -> Any:
            return target.triton_target()

        def get_current_device(self) -> int:
            return device_id

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def is_active(self) -> bool:
            return True

    saved_driver = driver._active  # None on a machine without a GPU (no driver is active there)
    saved_cache = triton_common._COMPILED
    driver.set_active(_Stub())
    triton_common._COMPILED = _NeverCached()
    JITFunction.run = compile_only
    try:
        with _device.compiling_for(target.device_info):
            yield compiled
    finally:
        JITFunction.run = run
        triton_common._COMPILED = saved_cache
        driver._active = saved_driver


_DEVICE_BASE = 1 << 16
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg", "num_ctas", "waves_per_eu", "matrix_instr_nonkdim")


def resources(compiled: Any, target: Target) -> dict[str, int | None]:
    """registers (per thread; AMD: VGPRs), spills (CUDA: local-memory bytes per thread; AMD: VGPRs
    spilled) and shared (bytes) of a compiled kernel; None where the toolchain does not say."""
    shared = int(compiled.metadata.shared)
    if target.backend == "hip":
        text = compiled.asm.get("amdgcn", "")

        def field(name: str) -> int | None:
            m = re.search(rf"\.{name}:\s+(\d+)", text)
            return int(m[1]) if m else None

        return {"shared": shared, "registers": field("vgpr_count"), "spills": field("vgpr_spill_count")}
    return {"shared": shared, **_cubin_usage(compiled.asm.get("cubin", b""))}


def _cubin_usage(cubin: bytes) -> dict[str, int | None]:
    """Registers and local (spill) bytes of a cubin, from the cuobjdump that ships with Triton."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not cubin or not os.path.exists(tool):
        return {"registers": None, "spills": None}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        out = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", out)
    return {"registers": int(m[1]), "spills": int(m[2]) + int(m[3])} if m else {"registers": None, "spills": None}


def cases(op: str, target: Target) -> list[tuple[str, Any, torch.dtype | None, tuple[int, ...]]]:
    """(op, shape, KV dtype or None, request lengths) of the workloads `op` is compiled on: its
    shape's default and EXTRA_SHAPES, the two BATCHES, and for an op with a KV cache, the compute
    dtype's cache and the target's fp8 cache."""
    s = spec.get(op)
    shapes = [s.shape(), *EXTRA_SHAPES.get(op, [])]
    kv_dtypes = [None, target.device_info.fp8_dtype] if s.kv_cache else [None]
    batches = [(s.fixed_length,) * len(b) for b in BATCHES] if s.fixed_length else list(BATCHES)
    return [(op, shape, kv, lengths) for shape in shapes for kv in kv_dtypes for lengths in batches]


def compile_report(arch: str, ops: Sequence[str] | None = None, progress: bool = False) -> pd.DataFrame:
    """One row per (case, our Triton backend, kernel it compiled): what the kernel asks of `arch`.

    Columns: target, op, backend, shape, kv_dtype, batch (requests), kernel, num_warps,
    num_stages, options (the launch's), shared (bytes), shared_limit, fits, registers, spills,
    status ("ok", or why the kernel cannot launch there).

    Args:
        arch: a TARGETS key.
        ops: op names (default: every registered op with one of our Triton backends).
        progress: a tqdm bar on stderr.

    Raises:
        ValueError: arch or an op is not known.
    """
    from tqdm import tqdm

    target = check_target(arch)
    ours = {
        op: [b for b in backends(op) if b.library is LIBRARY_TRITON] for op in (spec.names() if ops is None else ops)
    }
    work = [case for op, bes in ours.items() if bes for case in cases(op, target)]
    rows = []
    for op, shape, kv_dtype, lengths in tqdm(work, desc=f"compile for {arch}", disable=not progress, leave=False):
        with compiling_for(target) as compiled:
            args = _build(op, shape, kv_dtype, lengths)
            for be in ours[op]:
                first = len(compiled)
                try:
                    be.run(**args)
                except Exception as e:  # its host code failed: a row, unless a failed compile caused it
                    if len(compiled) == first or compiled[-1].error == "":
                        compiled.append(_Compiled("(host code)", {}, error=f"{type(e).__name__}: {e}"[:300]))
                for c in _unique(compiled[first:]):
                    rows.append(_row(target, op, be.name, shape, kv_dtype, lengths, c))
    return pd.DataFrame(rows, columns=COLUMNS)


COLUMNS = ["target", "op", "backend", "shape", "kv_dtype", "batch", "kernel", "num_warps", "num_stages", "options",
           "shared", "shared_limit", "fits", "registers", "spills", "status"]  # fmt: skip


def _build(op: str, shape: Any, kv_dtype: torch.dtype | None, lengths: tuple[int, ...]) -> dict[str, Any]:
    s = spec.get(op)
    batch = B.Batch(tuple(B.Request(n, seed=i) for i, n in enumerate(lengths)), position=0, placement_seed=0)
    return s.build(batch, shape, B.BuildOptions(kv_dtype=kv_dtype))


def _unique(compiled: list[_Compiled]) -> list[_Compiled]:
    """One per distinct compiled kernel (a kernel launched again with the same binary counts once)."""
    seen, out = set(), []
    for c in compiled:
        key = (c.kernel, id(c.compiled) if c.compiled is not None else c.error)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _row(target: Target, op: str, backend: str, shape: Any, kv_dtype, lengths, c: _Compiled) -> dict[str, Any]:
    base = {
        "target": target.arch, "op": op, "backend": backend, "shape": _shape_name(shape),
        "kv_dtype": "" if kv_dtype is None else str(kv_dtype).removeprefix("torch."), "batch": len(lengths),
        "kernel": c.kernel, "options": ", ".join(f"{k}={v}" for k, v in sorted(c.options.items())),
        "shared_limit": target.shared_memory,
    }  # fmt: skip
    if c.compiled is None:
        return {**base, "fits": False, "status": c.error}
    usage = resources(c.compiled, target)
    md = c.compiled.metadata
    fits = usage["shared"] <= target.shared_memory
    status = "ok" if fits else f"shared memory {usage['shared']} B > {target.shared_memory} B"
    return {**base, **usage, "num_warps": md.num_warps, "num_stages": md.num_stages, "fits": fits, "status": status}


def _shape_name(shape: Any) -> str:
    return "/".join(str(v) for v in vars(shape).values())


def summary_text(df: pd.DataFrame) -> str:
    """The report as text: per target a count line, then one line per distinct kernel build (the
    batches that compiled the same build folded), those that cannot launch marked."""
    lines = []
    key = ["op", "backend", "shape", "kv_dtype", "kernel", "num_warps", "num_stages", "options", "shared",
           "registers", "spills", "fits", "status"]  # fmt: skip
    for arch, part in df.groupby("target", sort=False):
        builds = part.drop_duplicates(key)
        bad = builds[~builds["fits"]]
        limit = int(part["shared_limit"].iloc[0])
        lines.append(f"{arch}: {len(builds)} kernel builds, {len(bad)} cannot launch (shared memory limit {limit} B)")
        for r in builds.itertuples():
            kv = f" kv {r.kv_dtype}" if r.kv_dtype else ""
            size = (
                ""
                if pd.isna(r.shared)
                else f"shared {int(r.shared):>6} B, regs {_int(r.registers)}, spills {_int(r.spills)}"
            )
            mark = "  " if r.fits else "!!"
            lines.append(f"  {mark} {r.op}/{r.backend} {r.shape}{kv}: {r.kernel} [{r.options}] {size}"
                         + ("" if r.fits else f"  <- {r.status}"))  # fmt: skip
    return "\n".join(lines)


def _int(x: Any) -> str:
    return "?" if x is None or pd.isna(x) else str(int(x))
