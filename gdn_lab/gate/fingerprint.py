"""`gdn-lab fingerprint`: every gate case run and recorded, for `gdn-lab check` to compare with later.

A gate is a list of batch-invariance cases (a preset's `gate:` section): each is the fields of
`gdn_lab.experiments.batch_invariance.InvarianceConfig` (op required), with `kv_dtypes: [null, fp8]`
expanding into one case per KV dtype. Each is run through the batch-invariance experiment with two
extra metrics: the 64-bit order-sensitive hash of the target's every output and state, alone and in
its batch (`gdn_lab.trace.tensor_hash` over the raw bits), and, for backends that follow a dispatch
rule, the rule's prediction for both launches. Every record also says whether the backend's hash is
reproducible across processes (`Backend.reproducible`: autotuned kernels are not), and the file
carries the environment.

Example:
    >>> cfg = GateConfig(device="cpu", dtype="float32", cases=[{"op": "gdn_decode", "backends": ["torch"],
    ...     "batch_sizes": [2], "gdn": {"num_k_heads": 1, "num_v_heads": 2, "head_dim": 16}}])
    >>> doc = fingerprint(cfg, progress=False)
    >>> sorted({c["tensor"] for c in doc["cases"] if c["backend"] == "torch"})
    ['out', 'state']
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

import pandas as pd
import torch

from gdn_lab import aiter, routing
from gdn_lab.environment import fingerprint as environment_fingerprint
from gdn_lab.experiments import batch_invariance
from gdn_lab.experiments.aiter_dispatch import RulePredictions
from gdn_lab.experiments.config import ExperimentConfig, check
from gdn_lab.experiments.loop import Combined, Comparison, Metrics
from gdn_lab.gate import golden
from gdn_lab.rules.base import RuleEnv
from gdn_lab.trace import tensor_hash

_CASE_FIELDS = {f.name for f in fields(batch_invariance.InvarianceConfig)}


def hash_hex(t: torch.Tensor) -> str:
    """The tensor's 64-bit order-sensitive hash as 16 hex digits."""
    return f"{int(tensor_hash(t)) & (2**64 - 1):016x}"


class Hashes(Metrics):
    """Each compared tensor's hash alone and in its batch, and the batch's composition."""

    def batched(self, c: Comparison) -> dict[str, Any]:
        return {
            "alone_hash": hash_hex(c.baseline[c.tensor]),
            "batched_hash": hash_hex(c.mine[c.tensor]),
            "lengths": list(c.batch.lengths),
        }


def _cases_check(name: str, value: tuple[dict[str, Any], ...]) -> None:
    if not value:
        raise ValueError(f"{name}: expected at least one case ({{op: ..., ...}})")
    for i, case in enumerate(value):
        if "op" not in case:
            raise ValueError(f"{name}[{i}]: every case names its op; got {case!r}")
        extra = sorted(set(case) - _CASE_FIELDS - {"kv_dtypes"})
        if extra:
            raise ValueError(
                f"{name}[{i}]: {', '.join(extra)} not accepted; accepted: {', '.join(sorted(_CASE_FIELDS))}, kv_dtypes"
            )


@dataclass(frozen=True, kw_only=True)
class GateConfig(ExperimentConfig):
    """A gate: its cases and where AITER's dispatch is told it runs.

    Attributes:
        cases: InvarianceConfig fields per case (op required; `kv_dtypes: [null, fp8]` expands one
            case per KV dtype; seed, device and dtype default to the gate's).
        arch: the arch AITER is told off ROCm (its dispatch rules are asked the same).
        num_cus: the CU count AITER sees (None: the GPU's own, or the emulated device's on the CPU).
    """

    cases: tuple[dict[str, Any], ...] = field(default=(), metadata=check(_cases_check, "the gate's cases"))
    arch: str = aiter.DEFAULT_ARCH
    num_cus: int | None = None

    def validate(self) -> None:
        super().validate()
        aiter.Emulation(self.arch, self.num_cus)
        self.configs()

    def configs(self, only: Sequence[str] | None = None) -> list[batch_invariance.InvarianceConfig]:
        """One InvarianceConfig per case and KV dtype (only the ops in `only`, if given)."""
        out = []
        for case in self.cases:
            if only and case["op"] not in only:
                continue
            fields_ = {"seed": self.seed, "device": self.device, "dtype": self.dtype, **case}
            kv_dtypes = fields_.pop("kv_dtypes", None)
            if kv_dtypes is None:
                out.append(batch_invariance.InvarianceConfig(**fields_))
                continue
            for kv in kv_dtypes:
                out.append(batch_invariance.InvarianceConfig(**{**fields_, "kv_dtype": kv}))
        return out


def cpu_capability() -> str | None:
    """torch's CPU kernel level (avx2, avx512, ...): CPU results follow the vector width."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # older torch
        return None


# OpenBLAS's corename function as numpy's wheels export it: scipy-openblas (numpy >= 2, ILP64 and
# LP64) and numpy 1.26's openblas64_ and plain builds.
_CORENAME = (
    "scipy_openblas_get_corename64_",
    "scipy_openblas_get_corename",
    "openblas_get_corename64_",
    "openblas_get_corename",
)


def blas_core() -> str | None:
    """The kernel numpy's OpenBLAS picked for this CPU (SkylakeX, Haswell, Zen, ...); None where
    numpy links another BLAS or the loaded libraries cannot be listed (Linux's /proc/self/maps).
    Under Triton's interpreter a tl.dot is numpy's matmul, whose sums follow this kernel: on one
    CPU, OPENBLAS_CORETYPE=Haswell changed 58 hashes of the cpu-smoke gate."""
    import ctypes

    import numpy  # noqa: F401  (loads its OpenBLAS)

    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(maxsplit=5)[-1].strip() for line in f if "openblas" in line.lower()}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:  # mapped, but not a library this process can open again
            continue
        for name in _CORENAME:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return None


def environment(device: torch.device) -> dict[str, Any]:
    """The fingerprint's environment: the device fingerprint plus what decides CPU numerics (the
    BLAS kernel only under Triton's interpreter, the one place numpy computes a kernel's sums)."""
    env = dict(environment_fingerprint(device))
    env["cpu_capability"] = cpu_capability()
    env["cpu_model"] = _cpu_model()
    env["blas_core"] = blas_core() if env.get("triton_interpret") else None
    return env


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _plain(v: Any) -> Any:
    """A table cell as JSON: numpy scalars as Python values, missing as None."""
    if isinstance(v, (list, str)):
        return v
    if pd.isna(v):
        return None
    return v.item() if hasattr(v, "item") else v


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    keep = [
        "op", "backend", "library", "is_control", "covered", "status", "reason", "tensor", "target_len",
        "batch_size", "position", "trial", "seed", "dtype", "kv_dtype", "arch", "lengths", "bitwise_equal",
        "n_diff", "max_ulp", "alone_hash", "batched_hash", "control_caught", "rule", "alone_variant",
        "predicted_variant", "expected", "prediction",
    ]  # fmt: skip
    out = []
    for row in df.reindex(columns=keep).to_dict("records"):
        clean = {k: _plain(v) for k, v in row.items()}
        backend = routing.get(clean["op"], clean["backend"])
        clean["reproducible"] = backend.reproducible
        for k in ("target_len", "batch_size", "position", "trial", "seed", "n_diff", "max_ulp"):
            if clean[k] is not None:
                clean[k] = int(clean[k])
        out.append(clean)
    return out


def fingerprint(
    cfg: GateConfig, *, only: Sequence[str] | None = None, preset: str | None = None, progress: bool = True
) -> dict[str, Any]:
    """Run every case of the gate and return the fingerprint document (`gdn_lab.gate.golden`).

    Args:
        cfg: the gate.
        only: run only the cases of these ops.
        preset: the preset's name, recorded.
        progress: tqdm bars on stderr.
    """
    configs = cfg.configs(only)
    if not configs:
        raise ValueError(
            f"only: {', '.join(only or [])} matches no case; the gate's ops: {', '.join(c['op'] for c in cfg.cases)}"
        )
    started = datetime.now(timezone.utc)
    cases = []
    with aiter.emulate(cfg.arch, cfg.num_cus):
        env = RuleEnv(aiter.effective_arch(cfg.torch_device), aiter.effective_num_cus(cfg.torch_device))
        metrics = Combined(Hashes(), RulePredictions(env, closeness=False))
        for c in configs:
            cases += _records(batch_invariance.run(c, progress=progress, metrics=metrics))
    return {
        "kind": golden.KIND,
        "schema": golden.SCHEMA,
        "created": started.isoformat(timespec="seconds"),
        "duration_s": round((datetime.now(timezone.utc) - started).total_seconds(), 2),
        "preset": preset,
        "config": {k: v for k, v in asdict(cfg).items()},
        "environment": environment(cfg.torch_device),
        "cases": cases,
    }
