"""AITER's FlyDSL GDN decode: which WARP_THREADS_K a launch takes, as data plus a predictor.

`flydsl_gdr_decode` (aiter/ops/flydsl/linear_attention_kernels.py, aiter e4048607) starts from the
config (NUM_BLOCKS_PER_V_DIM, NUM_WARPS, WARP_THREADS_K) = (1, 4, 8) and overrides it with the row
of `gdr_decode_tuned.csv` keyed by (dtype, state dtype, arch, batch size, query length, key heads,
value heads, K, V), ignoring rows whose duration is >= 10000. WARP_THREADS_K (WTK) is how many
lanes share one K=128 reduction (h.k, h.q, k.q, the L2 norms): another WTK sums in another order,
so a request's bits follow the batch size wherever the tuned WTK changes between two batch sizes
(aiter_contracts.md 3.3). NUM_WARPS and NUM_BLOCKS_PER_V_DIM only re-tile V.

The table is data/aiter/gdr_decode_tuned.csv (copied unchanged; see data/aiter/README.md; a wheel
carries it as package data, `gdn_lab.package_data`). It
covers gfx942 b = 1..128 and gfx950 b = 1..256, query length 1, K = V = 128, bf16 activations,
fp32 or bf16 state, and (HK, HV) in (2,8) (4,8) (4,16) (8,16) (8,32) (16,32) (16,64).

- `warp_threads_k` predicts what AITER does: the tuned row, or the default 8 for any shape, dtype
  or batch the table lacks (such calls are batch invariant on AMD).
- `RULE` is the DispatchRule the `aiter-flydsl` backend carries (its key: the WARP_THREADS_K).
- `control_prediction` is the lab's control rule: for a shape the table lacks it reads the rule
  of the nearest tuned shape, so a control built on it varies with the batch on every shape. Its
  `note` says when it did so.

Example:
    >>> import torch
    >>> wtk, row = warp_threads_k("gfx950", 1, 4, 8, 128, 128, torch.bfloat16, torch.float32)
    >>> wtk, row.line
    (32, 2690)
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from gdn_lab import package_data
from gdn_lab.rules.base import Predicted

ARCHS = ("gfx942", "gfx950")
DEFAULT_ARCH = "gfx950"
DEFAULT_WTK = 8  # AITER's untuned WARP_THREADS_K
DEFAULT_NUM_WARPS, DEFAULT_V_BLOCKS = 4, 1  # AITER's untuned NUM_WARPS and NUM_BLOCKS_PER_V_DIM
MAX_DURATION = 10000.0  # AITER ignores rows whose measured duration is at or above this
TABLE_PATH = package_data.path("aiter") / "gdr_decode_tuned.csv"


@dataclass(frozen=True)
class Shape:
    """A decode launch shape as the table keys it (dtypes as AITER's `str(torch.dtype)`)."""

    dtype: str
    state_dtype: str
    seq_len: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int


@dataclass(frozen=True)
class TunedRow:
    """One row of gdr_decode_tuned.csv.

    Attributes:
        line: its line in the file (the header is line 1).
        arch: "gfx942" or "gfx950".
        batch_size: the `b` column.
        shape: the launch shape.
        num_blocks_per_v_dim, num_warps, warp_threads_k: the tuned config.
        duration: the tuning measurement (us).
    """

    line: int
    arch: str
    batch_size: int
    shape: Shape
    num_blocks_per_v_dim: int
    num_warps: int
    warp_threads_k: int
    duration: float


@dataclass(frozen=True)
class Prediction:
    """The control rule's answer for one launch.

    Attributes:
        wtk: the WARP_THREADS_K.
        row: the tuned row it came from, or None for AITER's default.
        shape: the table shape whose rule was read.
        exact: whether `shape` is the launch's own shape (False: the nearest tuned shape).
        note: one line saying where the value came from.
    """

    wtk: int
    row: TunedRow | None
    shape: Shape
    exact: bool
    note: str


def _dtype_key(name: str, dtype: torch.dtype | str) -> str:
    if isinstance(dtype, torch.dtype):
        return str(dtype)
    if isinstance(dtype, str) and dtype.startswith("torch."):
        return dtype
    raise ValueError(f"{name}: expected a torch.dtype or its str() such as 'torch.bfloat16', got {dtype!r}")


def _check_arch(arch: object) -> None:
    if arch not in ARCHS:
        raise ValueError(f"arch: {arch!r} is not an arch the FlyDSL table covers; accepted: {', '.join(ARCHS)}")


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")


@cache
def load_table(path: str | Path = TABLE_PATH) -> dict[tuple[str, int, Shape], TunedRow]:
    """The table as AITER reads it: (arch, batch size, shape) -> row, rows with duration >= 10000 dropped.

    Raises:
        ValueError: the file is missing (it ships in the repository's data/aiter/).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"path: {path} does not exist; the FlyDSL decode table ships as data/aiter/gdr_decode_tuned.csv"
        )
    table: dict[tuple[str, int, Shape], TunedRow] = {}
    with path.open(newline="", encoding="utf-8") as f:
        for line, rec in enumerate(csv.DictReader(f), start=2):
            if float(rec["duration"]) >= MAX_DURATION:
                continue
            shape = Shape(
                rec["dtype"],
                rec["state_dtype"],
                int(rec["sq"]),
                int(rec["num_k_heads"]),
                int(rec["num_v_heads"]),
                int(rec["head_k_dim"]),
                int(rec["head_v_dim"]),
            )
            row = TunedRow(
                line,
                rec["arch"],
                int(rec["b"]),
                shape,
                int(rec["NUM_BLOCKS_PER_V_DIM"]),
                int(rec["NUM_WARPS"]),
                int(rec["WARP_THREADS_K"]),
                float(rec["duration"]),
            )
            # A later duplicate key replaces an earlier one, as AITER's dict build does.
            table[(row.arch, row.batch_size, shape)] = row
    return table


def tuned_shapes(arch: str, path: str | Path = TABLE_PATH) -> list[Shape]:
    """The shapes the table has rows for on `arch`, in first-seen order."""
    _check_arch(arch)
    return list(dict.fromkeys(s for (a, _, s) in load_table(path) if a == arch))


def tuned_batches(arch: str, shape: Shape, path: str | Path = TABLE_PATH) -> list[int]:
    """The batch sizes the table has for `shape` on `arch`, ascending."""
    return sorted(b for (a, b, s) in load_table(path) if a == arch and s == shape)


def warp_threads_k(
    arch: str,
    batch_size: int,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    dtype: torch.dtype | str = torch.bfloat16,
    state_dtype: torch.dtype | str = torch.float32,
    *,
    seq_len: int = 1,
    path: str | Path = TABLE_PATH,
) -> tuple[int, TunedRow | None]:
    """The WARP_THREADS_K AITER's FlyDSL decode launches with (its exact lookup, no extrapolation).

    Args:
        arch: the AMD arch it runs on ("gfx950" or "gfx942").
        batch_size: requests in the launch.
        num_k_heads, num_v_heads, head_k_dim, head_v_dim: the launch's head counts and sizes.
        dtype: the query dtype; state_dtype: the state pool's dtype.
        seq_len: query tokens per request (1 for decode).
        path: the table.

    Returns:
        (wtk, the tuned row it came from, or None when AITER falls back to its default 8).
    """
    _check_arch(arch)
    for name, value in (
        ("batch_size", batch_size),
        ("num_k_heads", num_k_heads),
        ("num_v_heads", num_v_heads),
        ("head_k_dim", head_k_dim),
        ("head_v_dim", head_v_dim),
        ("seq_len", seq_len),
    ):
        _check_positive(name, value)
    shape = Shape(
        _dtype_key("dtype", dtype),
        _dtype_key("state_dtype", state_dtype),
        seq_len,
        num_k_heads,
        num_v_heads,
        head_k_dim,
        head_v_dim,
    )
    row = load_table(path).get((arch, batch_size, shape))
    return (row.warp_threads_k, row) if row else (DEFAULT_WTK, None)


def _distance(a: Shape, b: Shape) -> float:
    """How far apart two shapes are: log2 ratios of head counts and sizes, then the dtypes."""
    dims = ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "seq_len")
    d = sum(abs(math.log2(getattr(a, n)) - math.log2(getattr(b, n))) for n in dims)
    return d + 100.0 * (a.state_dtype != b.state_dtype) + 10.0 * (a.dtype != b.dtype)


def nearest_tuned_shape(arch: str, shape: Shape, path: str | Path = TABLE_PATH) -> Shape:
    """The tuned shape closest to `shape` on `arch` (the same shape when the table has it).

    Closeness: same state dtype first, then same activation dtype, then the smallest sum of
    |log2| ratios of HK, HV, K, V and query length; ties go to the first shape in the file.
    """
    shapes = tuned_shapes(arch, path)
    return min(shapes, key=lambda s: _distance(shape, s))


def control_prediction(
    arch: str,
    batch_size: int,
    num_k_heads: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    dtype: torch.dtype | str = torch.bfloat16,
    state_dtype: torch.dtype | str = torch.float32,
    *,
    path: str | Path = TABLE_PATH,
) -> Prediction:
    """The WARP_THREADS_K the lab's batch-variant control uses.

    The launch's own shape when the table has it (then this equals `warp_threads_k`), else the
    nearest tuned shape's rule at the same batch size; past the table's largest batch, AITER's
    default 8, as AITER does.

    Returns:
        A Prediction whose note says which row or default was used and whether the shape was
        borrowed.
    """
    wtk, row = warp_threads_k(
        arch, batch_size, num_k_heads, num_v_heads, head_k_dim, head_v_dim, dtype, state_dtype, path=path
    )
    own = Shape(
        _dtype_key("dtype", dtype),
        _dtype_key("state_dtype", state_dtype),
        1,
        num_k_heads,
        num_v_heads,
        head_k_dim,
        head_v_dim,
    )
    shape = nearest_tuned_shape(arch, own, path)
    exact = shape == own
    if not exact:
        row = load_table(path).get((arch, batch_size, shape))
        wtk = row.warp_threads_k if row else DEFAULT_WTK
    where = (
        "exact shape"
        if exact
        else f"nearest tuned shape HK={shape.num_k_heads} HV={shape.num_v_heads} K={shape.head_k_dim} V={shape.head_v_dim} {shape.dtype}"
    )
    if row:
        note = f"{arch} b={batch_size}: WTK {wtk} from line {row.line} ({where})"
    else:
        batches = tuned_batches(arch, shape, path)
        note = f"{arch} b={batch_size}: AITER's default WTK {DEFAULT_WTK}, the table's batches for the {where} are {batches[0]}..{batches[-1]}"
    return Prediction(wtk, row, shape, exact, note)


@dataclass(frozen=True)
class FlydslGdrDecodeRule:
    """The DispatchRule of `flydsl_gdr_decode`'s tuned config, for a validated gdn_decode call.

    The launch's batch size is the call's B (q.shape[0]); the table is keyed by q's dtype and the
    state's (AITER's `str(torch.dtype)`), query length 1. The numerics key is the WARP_THREADS_K
    (NUM_WARPS and NUM_BLOCKS_PER_V_DIM only re-tile V, so they are in the variant, not the key).
    """

    name: str = "flydsl_gdr_decode"
    source: str = (
        "aiter e4048607 aiter/ops/flydsl/linear_attention_kernels.py::get_default_kwargs + gdr_decode_tuned.csv"
    )

    def predict(self, args, request: int, env) -> Predicted:
        """The tuned config of the call `args` (gdn_decode's validated arguments), seen from row `request`."""
        q, v, state = args["q"], args["v"], args["state"]
        batch = q.shape[0]
        if not isinstance(request, int) or isinstance(request, bool) or not 0 <= request < batch:
            raise ValueError(f"request: expected a row index in [0, {batch}), got {request!r}")
        wtk, row = warp_threads_k(env.arch, batch, q.shape[1], v.shape[1], q.shape[2], v.shape[2], q.dtype, state.dtype)
        warps = row.num_warps if row else DEFAULT_NUM_WARPS
        vblocks = row.num_blocks_per_v_dim if row else DEFAULT_V_BLOCKS
        where = f"tuned line {row.line}" if row else f"AITER's default (no tuned row for batch {batch} on {env.arch})"
        return Predicted(
            f"wtk={wtk} warps={warps} vblocks={vblocks}", f"wtk={wtk}", f"WARP_THREADS_K {wtk} from {where}"
        )

    def expect(self, alone_key: str, batched_key: str) -> str:
        """ "equal" for the same WARP_THREADS_K, else "switch" (another order of the K = 128 sums)."""
        return "equal" if alone_key == batched_key else "switch"


RULE = FlydslGdrDecodeRule()
