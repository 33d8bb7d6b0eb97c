"""The matmul references: the float64 ground truth, and torch.matmul as it runs (the batch-variant control)."""

from __future__ import annotations

import torch


def matmul_torch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w with float64 products and sums, rounded once to x's dtype.

    float64 keeps the rounding of the sums far below the output's ulp, so this is the closeness
    oracle; it is not a batch-invariance claim (the float64 GEMM may still order sums by M).
    """
    return torch.matmul(x.double(), w.double()).to(x.dtype)


def matmul_native(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Batch-variant control: torch.matmul in x's dtype, whose kernel choice follows M.

    cuBLAS on the GPU (measured on the H200: bf16 K=N=4096 differs from M=64 up). On the CPU, float32
    goes through a different path for M < 8 than for larger M (differs); bf16/fp16 did not vary
    with M in our checks (torch 2.13, 2 threads), so there it may prove no sensitivity: use
    `triton-splitk-by-batch` as the control that varies everywhere.
    """
    return torch.matmul(x, w)


# The torch split-K control fills this many (row, K-slice) pairs, as split-K heuristics fill a GPU's SMs.
SPLITK_SLOTS = 64


def splitk_slices(m: int, k: int, slots: int = SPLITK_SLOTS) -> int:
    """The torch split-K control's K slices for M rows: next_pow2(ceil(slots / M)), at most K // 8, at least 1
    (one for no rows).

    Example:
        >>> [splitk_slices(m, 4096) for m in (0, 1, 8, 20, 64, 1000)]
        [1, 64, 8, 4, 1, 1]
    """
    if m == 0:
        return 1
    want = -(-slots // m)
    return max(1, min(1 << (want - 1).bit_length(), k // 8))


def matmul_splitk_torch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Batch-variant control in plain torch, on every device and dtype: split-K whose slices follow M.

    This is a deliberately batch-variant control, not a kernel to use: K is cut into
    `splitk_slices(M, K)` equal slices (fewer rows, more slices; one batched matmul); each slice's
    float32 product is stored in x's dtype (as split-K kernels that keep their partials in the
    output dtype do), the partials are summed in float32 and rounded once more, so a row's bits change with the
    number of rows it is multiplied with (alone at decode, M = 1, against a batch), in bf16 as in
    float32. Unlike `triton-splitk-by-batch` it does not read the SM count, so it varies the same
    way on a GPU and on a 2-core CPU.
    """
    m, k = x.shape
    s = splitk_slices(m, k)
    kp = -(-k // s) * s  # K padded with zeros to s equal slices (zeros add nothing)
    xf, wf = x.float(), w.float()
    if kp != k:
        xf = torch.nn.functional.pad(xf, (0, kp - k))
        wf = torch.nn.functional.pad(wf, (0, 0, 0, kp - k))
    partials = torch.bmm(xf.reshape(m, s, kp // s).transpose(0, 1), wf.reshape(s, kp // s, -1))  # [s, M, N]
    return partials.to(x.dtype).float().sum(0).to(x.dtype)
