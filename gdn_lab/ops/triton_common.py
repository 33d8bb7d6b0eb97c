"""What our Triton kernels share: tl.dot operand precision, row-exact dots, rounding to a narrower
dtype, tile extents and the cached launch.

Imports triton at load; registrations reach kernel modules only through `routing.lazy`. Under the
interpreter, loading it spares the interpreter work it repeats to no effect (`gdn_lab.interpreter`):
every kernel module but rms_norm's imports it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.runtime import driver

from gdn_lab.device import detect
from gdn_lab.interpreter import skip_repeated_work
from gdn_lab.ops.triton_support import interpreting

skip_repeated_work()

_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@dataclass(frozen=True)
class DotPrecision:
    """The dtype both tl.dot operands are converted to, and tl.dot's input_precision.

    Attributes:
        dtype: the Triton operand dtype (the accumulator is always float32).
        input_precision: "ieee" for float32 operands rounded nowhere, "tf32" for float32 operands
            rounded to TF32, None (Triton's default) for 16-bit operands.
    """

    dtype: tl.dtype
    input_precision: str | None


def dot_precision(
    a_dtype: torch.dtype, b_dtype: torch.dtype, *, float32_operands: bool = False, device: torch.device | None = None
) -> DotPrecision:
    """Operand precision of a tl.dot, fixed by the input dtypes (and the GPU) alone, never by the batch.

    Under the interpreter, and for float32 inputs, every dot is float32 IEEE (Triton 3.9's
    interpreter computes tl.dot on bf16 operands wrongly).

    Args:
        a_dtype, b_dtype: the dtypes of the inputs the two operands come from.
        float32_operands: False (attention, matmul): the operands are the inputs converted, to
            a's dtype when b holds that dtype or fp8 (an e4m3 value converts to bf16/fp16
            exactly), else to float32 (IEEE). True (the chunked delta rule): the operands are
            float32 values the kernel computed from 16-bit inputs; they take TF32 where the GPU
            has it (every CUDA GPU; on AMD only gfx942, where Triton offers xf32), else IEEE.
        device: the tensors' device; read only with float32_operands.
    """
    if interpreting() or a_dtype == torch.float32:
        return DotPrecision(tl.float32, "ieee")
    if float32_operands:
        return DotPrecision(tl.float32, "tf32" if _has_tf32(device) else "ieee")
    if b_dtype == a_dtype or b_dtype.itemsize == 1:
        return DotPrecision(_TL_DTYPES[a_dtype], None)
    return DotPrecision(tl.float32, "ieee")


def _has_tf32(device: torch.device | None) -> bool:
    """Whether Triton's tl.dot can round float32 operands to TF32 on this device (as `detect` sees
    it: the GPU compiled for inside `gdn_lab.device.compiling_for`)."""
    if device is None:
        return False
    info = detect(device)
    return info.platform == "cuda" or info.arch == "gfx942"


def pow2_at_least(n: int, floor: int = 16) -> int:
    """The tile extent for n >= 1 rows or columns: a power of two >= n, at least `floor` (tl.dot needs 16).

    Plain Python, not triton.next_power_of_2: that is a constexpr function whose host call costs
    about 10 us in Triton 3.9, a visible share of an eager decode step.
    """
    return max(floor, 1 << (n - 1).bit_length())


# Compiled kernels for `launch_cached`: (id of the JITFunction, the caller's key, the current
# device) -> CompiledKernel.
_COMPILED: dict[tuple[int, Hashable, int], Any] = {}
_COMPILED_MAX = 256


def launch_cached(
    kernel: Any,
    grid: tuple[int, int, int],
    args: Sequence[Any],
    key: Hashable,
    launch_args: Sequence[Any] | None = None,
    **options: Any,
) -> None:
    """`kernel[grid](*args, **options)`, through the compiled kernel's own launcher once compiled.

    Triton's `JITFunction.run` binds and specialises every argument, looks up its kernel cache and
    builds launch metadata on every call; a kernel compiled once for `key` (on the current device)
    is launched here by its `CompiledKernel.run` directly, as `JITFunction.run` itself ends
    (Triton 3.6 and 3.9: (grid x, y, z, stream, function, packed metadata, launch metadata, enter
    hook, exit hook, *args)). With launch hooks installed (a profiler), or a kernel that did not
    compile to one (the interpreter), every call takes the normal path. Call it on a GPU only.

    Args:
        kernel: the @triton.jit function (a module-level object: its id keys the cache).
        grid: the three grid extents.
        args: every parameter in signature order, constexprs included (as `run` passes them).
        key: everything the compilation depends on besides the kernel and the device: the
            constexpr values, the launch options, each tensor's dtype and 16-byte alignment, each
            specialised int's ==1 and divisibility by 16. A key that misses one of these could
            launch a kernel compiled for other arguments.
        launch_args: args with each tensor given as its `data_ptr()`, for the compiled launcher
            (default: args). Triton's launcher takes an int pointer as it is; a tensor costs it a
            call of data_ptr() and a driver query of the pointer's attributes, per tensor and
            launch. Used only once compiled: compiling needs the tensors.
        options: launch options (num_warps, ...), used when compiling.
    """
    active = driver.active
    device = active.get_current_device()
    ck = _COMPILED.get((id(kernel), key, device))
    enter, exit_ = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    if ck is None or getattr(enter, "calls", enter) or getattr(exit_, "calls", exit_):
        ck = kernel[grid](*args, **options)
        if ck is not None and hasattr(ck, "packed_metadata"):
            if len(_COMPILED) >= _COMPILED_MAX:
                _COMPILED.clear()
            _COMPILED[(id(kernel), key, device)] = ck
        return
    stream = active.get_current_stream(device)
    ck.run(grid[0], grid[1], grid[2], stream, ck.function, ck.packed_metadata, None, None, None,
           *(args if launch_args is None else launch_args))  # fmt: skip


@dataclass(frozen=True)
class Grid:
    """Where a dtype's values lie, for `round_rne`: mantissa bits, smallest normal, subnormal rounder.

    Attributes:
        mant: explicit mantissa bits (23 for float32: no rounding).
        tiny: the smallest normal magnitude (2 ** emin).
        magic: 2 ** (emin - mant + 23): adding and subtracting it rounds |x| < tiny to the
            subnormal spacing in float32.
        max: the largest finite value.
    """

    mant: int
    tiny: float
    magic: float
    max: float


def grid_of(dtype: torch.dtype) -> Grid:
    """The rounding grid of a float dtype (bf16, fp16, fp32, float8_e4m3fn, float8_e4m3fnuz)."""
    info = torch.finfo(dtype)
    mant = round(-math.log2(info.eps))
    emin = round(math.log2(info.tiny))
    return Grid(mant, float(info.tiny), float(2.0 ** (emin - mant + 23)), float(info.max))


def grid_args(prefix: str, dtype: torch.dtype) -> dict[str, float | int]:
    """`round_rne`'s constexpr arguments for dtype, as {prefix}_MANT, {prefix}_TINY, {prefix}_MAGIC."""
    g = grid_of(dtype)
    return {f"{prefix}_MANT": g.mant, f"{prefix}_TINY": g.tiny, f"{prefix}_MAGIC": g.magic}


@triton.jit
def round_rne(x, MANT: tl.constexpr, TINY: tl.constexpr, MAGIC: tl.constexpr):
    """x rounded to the nearest value with MANT mantissa bits (ties to even), still in float32; the
    sign is kept, also of a value that rounds to zero (-0.0, as torch's casts give)."""
    if MANT < 23:
        SHIFT: tl.constexpr = 23 - MANT
        signed = x.to(tl.int32, bitcast=True)
        mag = signed & 0x7FFFFFFF
        ax = mag.to(tl.float32, bitcast=True)
        # round-half-even on the bits: the carry moves into the exponent when the mantissa overflows
        bits = ((mag + ((1 << (SHIFT - 1)) - 1) + ((mag >> SHIFT) & 1)) >> SHIFT) << SHIFT
        normal = bits.to(tl.float32, bitcast=True)
        subnormal = (ax + MAGIC) - MAGIC  # the float32 add rounds to the subnormal spacing
        r = tl.where(ax < TINY, subnormal, normal).to(tl.int32, bitcast=True)
        # the sign bit put back by bits: a GPU's -r is 0 - r, which makes -0.0 of 0.0 +0.0
        x = (r | (signed ^ mag)).to(tl.float32, bitcast=True)
    return x


@triton.jit
def dot_acc(acc, a, b, INPUT_PRECISION: tl.constexpr, ROW_EXACT_DOT: tl.constexpr):
    """acc + a @ b for a [M, K] and b [K, N] operands, into the float32 accumulator acc [M, N].

    ROW_EXACT_DOT (the interpreter): the products, summed over K in order, the same sequence of
    operations for every row. The interpreter's tl.dot is numpy's matmul, whose result for a row
    can depend on the row's place in the tile (measured on one CPU: rows 0-5 and 6-15 of a 16-row
    block went through different BLAS micro-kernels; OpenBLAS picks them per CPU), so a request
    whose rows land at other tile offsets would change bits there. Compiled: tl.dot at
    INPUT_PRECISION (`dot_precision`).
    """
    if ROW_EXACT_DOT:
        acc += tl.sum(a[:, :, None] * b[None, :, :], axis=1)
    else:
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    return acc
