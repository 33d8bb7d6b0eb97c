"""Bitwise comparison of two results: equal bits first, then how far apart.

`torch.equal` decides invariance. The distances say how big a difference is: the number of
differing elements, the max absolute difference and the max distance in units in the last place
(ulps: how many representable values of the dtype lie between the two).
"""

from __future__ import annotations

import torch

_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def ordered_bits(x: torch.Tensor) -> torch.Tensor:
    """Map floats to integers whose difference counts the representable values between them.

    The IEEE bit pattern read as a signed integer is monotone for non-negative floats and reversed
    for negative ones; flipping the negative half makes it monotone everywhere (-0 and +0 meet).
    """
    bits = x.contiguous().view(_INT_VIEW[x.dtype.itemsize]).long()
    lowest = torch.iinfo(_INT_VIEW[x.dtype.itemsize]).min
    return torch.where(bits < 0, lowest - bits, bits)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in ulps of the common dtype (fp8 is measured on its own 256 codes)."""
    if a.dtype.itemsize == 1:
        codes = torch.arange(256, dtype=torch.uint8).view(a.dtype).float()
        order = torch.argsort(torch.argsort(torch.nan_to_num(codes, nan=float("inf")), stable=True), stable=True)
        ia = order[a.contiguous().view(torch.uint8).long().cpu()]
        ib = order[b.contiguous().view(torch.uint8).long().cpu()]
        return (ia - ib).abs().to(a.device)
    return (ordered_bits(a) - ordered_bits(b)).abs()


def compare(a: torch.Tensor, b: torch.Tensor) -> dict[str, object]:
    """Compare two tensors of one shape and dtype.

    Returns:
        {"bitwise_equal": bool, "n_diff": int, "max_abs": float, "max_ulp": int}. NaNs compare
        equal to NaNs with the same bits (torch.equal semantics differ: NaN != NaN), so a kernel
        that writes NaN in the same place twice is reported as invariant there.
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(
            f"a, b: expected the same shape and dtype, got {tuple(a.shape)} {a.dtype} and {tuple(b.shape)} {b.dtype}"
        )
    if a.dtype.itemsize == 1:
        va, vb = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    else:
        va, vb = (x.contiguous().view(_INT_VIEW[x.dtype.itemsize]) for x in (a, b))
    differ = va != vb
    n_diff = int(differ.sum())
    if n_diff == 0:
        return {"bitwise_equal": True, "n_diff": 0, "max_abs": 0.0, "max_ulp": 0}
    diff = (a.float() - b.float()).abs()
    finite = diff[differ & diff.isfinite()]
    return {
        "bitwise_equal": False,
        "n_diff": n_diff,
        "max_abs": float(finite.max()) if finite.numel() else float("inf"),
        "max_ulp": int(ulp_distance(a[differ], b[differ]).max()),
    }
