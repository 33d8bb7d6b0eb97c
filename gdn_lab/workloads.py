"""Seeded workloads: a target request among batchmates of random lengths, built through each op's spec.

An invariance experiment runs one *target* request alone and then inside batches. For the
comparison to mean anything, the target must be the same request every time:

- its content (K/V, queries, projections, initial states) comes from its own seed, whatever the
  batch, its position in it, or where its pages and state slots land (`gdn_lab.ops.batch`);
- each batchmate's content comes from its own seed, derived from the experiment seed, the target
  length, the batch size, the trial and the batchmate's index;
- lengths, the target's position and the page/slot placement are drawn from the experiment seed,
  so the same seed gives the same batches.

`build(op, batch, shape)` returns the op's validated argument dict (its spec's `build`), so any
backend's `run` takes it as keywords; `view(op, batch, args, i)` says which output rows and state
slot belong to request i.

Example:
    >>> from gdn_lab.workloads import AttentionShape, alone, make_batch, target_request, build
    >>> t = target_request(300, seed=0)
    >>> b = make_batch(t, 4, seed=0, max_len=500)
    >>> args = build("decode_attention", b, AttentionShape(4, 2, 32), dtype=torch.float32)
    >>> args["q"].shape, b.requests[b.position] == t
    (torch.Size([4, 4, 32]), True)
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

import gdn_lab.ops  # noqa: F401  (registers every op's spec and backends)
from gdn_lab import checks
from gdn_lab.device import fp8_dtype_for
from gdn_lab.ops import spec as op_spec
from gdn_lab.ops.batch import (
    AttentionShape,
    Batch,
    BuildOptions,
    GDNShape,
    LinearShape,
    MoEShape,
    Request,
    derive_seed,
)

__all__ = [
    "AttentionShape",
    "Batch",
    "BuildOptions",
    "GDNShape",
    "LinearShape",
    "MoEShape",
    "Request",
    "alone",
    "build",
    "derive_seed",
    "fresh_copy",
    "make_batch",
    "target_request",
    "view",
]

DEFAULT_MAX_CONTEXT = 16383  # batchmates draw 1..16383 tokens unless a preset scales it down

_DTYPE_NAMES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}


# --- parameters -------------------------------------------------------------------------------


def resolve_device(name: str | torch.device) -> torch.device:
    """ "auto" (the GPU if torch sees one, else the CPU), "cpu" or "cuda" as a torch.device.

    Raises:
        ValueError: an unknown name, or "cuda" on a machine without a visible GPU.
    """
    if isinstance(name, torch.device):
        return name
    checks.check_choice("device", name, ("auto", "cpu", "cuda"))
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but torch sees no CUDA/ROCm device; accepted here: auto, cpu")
    return torch.device(name)


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    """A compute dtype from its name: bf16/bfloat16, fp16/float16, fp32/float32."""
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPE_NAMES:
        raise ValueError(f"dtype: {name!r} is not accepted; expected one of {', '.join(_DTYPE_NAMES)}")
    return _DTYPE_NAMES[name]


def resolve_kv_dtype(name: str | torch.dtype | None, dtype: torch.dtype, arch: str) -> torch.dtype:
    """The KV-cache dtype: None/"auto" is the compute dtype, "fp8" the arch's native fp8 format
    (float8_e4m3fnuz on gfx942, float8_e4m3fn elsewhere), else a compute dtype name."""
    if isinstance(name, torch.dtype):
        return name
    if name in (None, "auto"):
        return dtype
    if name == "fp8":
        return fp8_dtype_for(arch)
    if name not in _DTYPE_NAMES:
        raise ValueError(f"kv_dtype: {name!r} is not accepted; expected auto, fp8 or one of {', '.join(_DTYPE_NAMES)}")
    return _DTYPE_NAMES[name]


def target_request(length: int, seed: int, new_tokens: int | None = None) -> Request:
    """The target of an experiment: its content depends only on (seed, length)."""
    checks.check_positive("target length", length)
    return Request(length, derive_seed(seed, "target", length), new_tokens)


def alone(target: Request, seed: int) -> Batch:
    """The target as a batch of one (its pages still shuffled, from the experiment seed)."""
    return Batch((target,), 0, derive_seed(seed, "alone", target.length, target.seed))


def make_batch(
    target: Request,
    batch_size: int,
    *,
    seed: int,
    trial: int = 0,
    position: int | None = None,
    min_len: int = 1,
    max_len: int = DEFAULT_MAX_CONTEXT,
    new_tokens: int | None = None,
) -> Batch:
    """The target inside `batch_size - 1` batchmates of random lengths.

    Args:
        target: the target request (from `target_request`).
        batch_size: requests in the batch, the target included (>= 1).
        seed: the experiment seed; lengths, position, batchmates' seeds and placement follow from it.
        trial: distinguishes repeated batches of one (target, batch size).
        position: the target's index; None draws it uniformly.
        min_len, max_len: batchmates' lengths are uniform in [min_len, max_len].
        new_tokens: batchmates' new tokens (prefill_attention), as `Request.new_tokens`.

    Returns:
        A Batch.
    """
    checks.check_positive("batch_size", batch_size)
    checks.check_positive("min_len", min_len)
    if max_len < min_len:
        raise ValueError(f"max_len: must be >= min_len (={min_len}), got {max_len}")
    key = ("batch", target.length, target.seed, batch_size, trial)
    rng = random.Random(derive_seed(seed, *key))
    if position is None:
        position = rng.randrange(batch_size)
    elif not 0 <= position < batch_size:
        raise ValueError(f"position: must be in [0, {batch_size}), got {position}")
    mates = [
        Request(rng.randint(min_len, max_len), derive_seed(seed, *key, "mate", i), new_tokens)
        for i in range(batch_size - 1)
    ]
    mates.insert(position, target)
    return Batch(tuple(mates), position, derive_seed(seed, *key, "placement"))


def build(op: str, batch: Batch, shape: Any, opts: BuildOptions | None = None, **overrides: Any) -> dict[str, Any]:
    """The validated arguments of `op` for `batch`.

    Args:
        op: a registered op.
        batch: from `alone` or `make_batch`.
        shape: an instance of the op's shape dataclass (`gdn_lab.ops.spec.get(op).shape`).
        opts: BuildOptions (default: bf16 on the CPU); `overrides` replace its fields.

    Returns:
        The dict the op's `validate()` returns (what every backend's `run` receives).
    """
    s = op_spec.get(op)
    if not isinstance(shape, s.shape):
        raise ValueError(f"shape: {op} takes a {s.shape.__name__}, got {type(shape).__name__}")
    opts = opts or BuildOptions()
    if overrides:
        opts = replace(opts, **overrides)
    return s.build(batch, shape, opts)


def view(op: str, batch: Batch, args: Mapping[str, Any], request: int | None = None) -> op_spec.View:
    """Which output rows and state slot of a call built by `build(op, batch, ...)` belong to
    request `request` (default: the batch's target)."""
    return op_spec.get(op).view(batch, args, batch.position if request is None else request)


def fresh_copy(op: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments with private copies of every state the op mutates, so one run cannot feed the next."""
    out = dict(args)
    for key in op_spec.get(op).states:
        out[key] = args[key].clone()
    return out
