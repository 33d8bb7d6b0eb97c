"""fp8 quantization with explicit scales: per tensor (KV caches) and per group (activations).

A value is stored as `round(x / scale)` in the fp8 dtype and read back as `fp8.float() * scale`.
Scales are float32. Callers pass the KV scales explicitly: a scale computed from the batch's own
amax would make a request's quantized bits depend on its batchmates.
"""

from __future__ import annotations

import torch

from gdn_lab.checks import FP8_DTYPES, dtype_name

FP8_GROUP = 128  # values per scale of group-wise fp8 activations (block-FP8 projections)
AMAX_FLOOR = 1e-12  # the least amax a scale is taken from, so that an all-zero tensor or group gets a scale > 0


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 dtype (448 for e4m3fn, 240 for e4m3fnuz)."""
    if dtype not in FP8_DTYPES:
        raise ValueError(f"dtype: {dtype_name(dtype)} is not an fp8 KV dtype; accepted: float8_e4m3fn, float8_e4m3fnuz")
    return float(torch.finfo(dtype).max)


def _div_rn(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """x / divisor correctly rounded on every device. On CUDA, torch divides by a Python scalar as a
    multiply by its reciprocal, 1 ulp off for some x (measured on an H200: amax / 448); a tensor
    divisor is a true division, as on the CPU and in the lab's fp8 kernels (div_rn)."""
    return x / torch.full_like(x, divisor)


def quantize_per_tensor(x: torch.Tensor, dtype: torch.dtype, scale: float | torch.Tensor | None = None):
    """Quantize a whole tensor with one scale.

    Args:
        x: any float tensor.
        dtype: float8_e4m3fn or float8_e4m3fnuz.
        scale: the dequantization scale; None derives it from x's amax (amax / fp8_max).

    Returns:
        (x_fp8, scale) with scale a float32 tensor of shape [1] on x's device.
    """
    fmax = fp8_max(dtype)
    if scale is None:
        s = _div_rn(x.float().abs().amax().clamp(min=AMAX_FLOOR), fmax).reshape(1)
    else:
        s = torch.as_tensor(scale, dtype=torch.float32, device=x.device).reshape(1)
        if not bool((s > 0).all()):
            raise ValueError(f"scale: must be > 0, got {s.item()}")
    xq = (x.float() / s).clamp(-fmax, fmax).to(dtype)
    return xq, s


def quantize_groups(x: torch.Tensor, dtype: torch.dtype, group: int = FP8_GROUP):
    """Quantize the last dim in groups of `group` values, one scale per group (block fp8).

    Args:
        x: [..., N] with N divisible by `group`.
        dtype: the fp8 dtype.
        group: values per scale.

    Returns:
        (x_fp8 [..., N], scales float32 [..., N // group]).
    """
    n = x.shape[-1]
    if n % group:
        raise ValueError(f"x: last dim (={n}) must be divisible by group (={group})")
    fmax = fp8_max(dtype)
    xg = x.float().reshape(*x.shape[:-1], n // group, group)
    scales = _div_rn(xg.abs().amax(-1).clamp(min=AMAX_FLOOR), fmax)
    xq = (xg / scales[..., None]).clamp(-fmax, fmax).to(dtype)
    return xq.reshape(x.shape), scales


def dequantize_groups(xq: torch.Tensor, scales: torch.Tensor, group: int = FP8_GROUP) -> torch.Tensor:
    """Inverse of `quantize_groups`, in float32."""
    n = xq.shape[-1]
    return (xq.float().reshape(*xq.shape[:-1], n // group, group) * scales[..., None]).reshape(xq.shape)


def dequantize(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """x in float32, times its per-tensor scale when there is one."""
    return x.float() if scale is None else x.float() * scale.float()
