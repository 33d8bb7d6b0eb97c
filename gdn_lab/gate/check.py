"""`gdn-lab check`: rerun a golden fingerprint's cases and say what moved.

Findings (the gate fails, exit 1):

- "no longer invariant": a case (not a control) that kept its bits in the golden file changes them now;
- "control no longer caught": an op's batch-variant control that was caught is not any more (the
  run can no longer see batch variance);
- "numerics changed": a hash of an output or state differs, on the same device, arch and library
  version (and, for Triton kernels under the interpreter, numpy's BLAS kernel), for a backend whose
  hashes are reproducible across processes;
- "predicted switch not observed" / "unpredicted difference": a dispatch rule's prediction that
  held no longer does;
- "no longer runs": a case that ran does not (not covered, or an error).

Moves that are not regressions are reported as notes: a case that became invariant, a case new in
this run. On another device, arch or library version, hashes are not compared: only verdicts, and
the result says so.

Example:
    >>> a = {"environment": {"device": "x", "torch": "1"}, "cases": []}
    >>> check_documents(a, a).ok
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

KEY = ("op", "backend", "kv_dtype", "dtype", "target_len", "batch_size", "trial", "tensor")
# What decides a result's bits besides the code: compared before hashes are. For every library but
# torch (whose CPU kernels are its own) also `blas_core`, numpy's BLAS kernel, which the fingerprint
# records under Triton's interpreter only: there a tl.dot is numpy's matmul.
ENV_KEYS = ("platform", "device", "arch", "cpu_capability", "cpu_model", "torch", "triton", "triton_interpret")
# The package whose version a backend's library is.
LIBRARY_VERSION = {
    "torch": "torch",
    "gdn_lab-triton": "triton",
    "fla": "fla",
    "aiter-triton": "aiter",
    "aiter": "aiter",
    "sglang-aiter": "aiter",
    "flydsl": "flydsl",
}
RULE_MISSES = ("predicted switch not observed", "unpredicted difference")
COLUMNS = ["finding", *KEY, "was", "now", "detail"]


@dataclass
class CheckResult:
    """What `check` found.

    Attributes:
        findings: one row per regression (columns COLUMNS).
        notes: moves that are not regressions (same columns).
        hashes_compared: whether any hash was compared (same environment for some library).
        environment: why hashes were not compared, per library, or "" when they all were.
    """

    findings: pd.DataFrame
    notes: pd.DataFrame
    hashes_compared: bool
    environment: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.findings.empty


def environment_differences(a: Mapping[str, Any], b: Mapping[str, Any], library: str | None = None) -> list[str]:
    """The environment keys on which two fingerprints differ ("torch: 2.11 -> 2.13"), for a library."""
    keys = [*ENV_KEYS, *([LIBRARY_VERSION[library]] if library in LIBRARY_VERSION else [])]
    if library != "torch":
        keys.append("blas_core")
    return [f"{k}: {a.get(k)} -> {b.get(k)}" for k in dict.fromkeys(keys) if a.get(k) != b.get(k)]


def _key(case: Mapping[str, Any]) -> tuple:
    return tuple(case.get(k) for k in KEY)


def _row(finding: str, case: Mapping[str, Any], was: Any, now: Any, detail: str = "") -> dict[str, Any]:
    return {"finding": finding, **{k: case.get(k) for k in KEY}, "was": was, "now": now, "detail": detail}


def _caught(cases: list[Mapping[str, Any]]) -> dict[tuple, bool | None]:
    """Per (op, kv_dtype, dtype): was a control caught?"""
    out: dict[tuple, bool | None] = {}
    for c in cases:
        if c.get("is_control") and c.get("status") == "compared":
            k = (c["op"], c.get("kv_dtype"), c.get("dtype"))
            out[k] = bool(out.get(k)) or not c.get("bitwise_equal", True)
    return out


def check_documents(golden: Mapping[str, Any], now: Mapping[str, Any]) -> CheckResult:
    """Compare a rerun (`now`) with its golden fingerprint (see the module docstring)."""
    findings: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    old = {_key(c): c for c in golden["cases"]}
    new = {_key(c): c for c in now["cases"]}
    env_a, env_b = golden["environment"], now["environment"]
    blocked: dict[str, str] = {}
    compared_any = False
    for key, was in old.items():
        cur = new.get(key)
        if cur is None:
            findings.append(_row("case missing", was, "present", "absent", "the rerun has no such case"))
            continue
        ran_before, ran_now = was.get("status") == "compared", cur.get("status") == "compared"
        if ran_before and not ran_now:
            findings.append(_row("no longer runs", was, "compared", cur.get("status"), str(cur.get("reason"))[:300]))
            continue
        if not ran_now:
            continue
        if not was.get("is_control"):
            if was.get("bitwise_equal") and not cur.get("bitwise_equal"):
                detail = f"{cur.get('n_diff')} elements differ, up to {cur.get('max_ulp')} ulp"
                findings.append(_row("no longer invariant", was, "invariant", "variant", detail))
            elif was.get("bitwise_equal") is False and cur.get("bitwise_equal"):
                notes.append(_row("became invariant", was, "variant", "invariant"))
        if cur.get("prediction") in RULE_MISSES and was.get("prediction") not in RULE_MISSES:
            findings.append(
                _row(cur["prediction"], was, was.get("prediction"), cur["prediction"], str(cur.get("rule")))
            )
        library = cur.get("library")
        differs = environment_differences(env_a, env_b, library)
        if differs:
            blocked[str(library)] = "; ".join(differs)
            continue
        if not (was.get("reproducible") and cur.get("reproducible")):
            continue
        compared_any = True
        for h in ("alone_hash", "batched_hash"):
            if was.get(h) != cur.get(h):
                findings.append(_row("numerics changed", was, was.get(h), cur.get(h), h.replace("_", " ")))
    for key, cur in new.items():
        if key not in old:
            notes.append(_row("new case", cur, None, cur.get("status")))
    before, after = _caught(golden["cases"]), _caught(now["cases"])
    for k, caught in before.items():
        if caught and not after.get(k):
            op, kv, dtype = k
            case = {"op": op, "kv_dtype": kv, "dtype": dtype, "backend": "(controls)"}
            findings.append(_row("control no longer caught", case, "caught", "not caught", "the run is insensitive"))
    return CheckResult(
        pd.DataFrame(findings, columns=COLUMNS), pd.DataFrame(notes, columns=COLUMNS), compared_any, blocked
    )


def report(result: CheckResult, golden_path: str) -> str:
    """The text `gdn-lab check` prints."""
    lines = []
    if result.environment:
        lines.append("hashes not compared (another environment): verdicts only for:")
        lines += [f"  {lib}: {why}" for lib, why in sorted(result.environment.items())]
    elif not result.hashes_compared:
        lines.append("no reproducible hash to compare: verdicts only")
    with pd.option_context("display.width", 200, "display.max_columns", None, "display.max_rows", None):
        if not result.findings.empty:
            lines += [f"{len(result.findings)} findings against {golden_path}:", result.findings.to_string(index=False)]
        if not result.notes.empty:
            lines += [f"{len(result.notes)} notes:", result.notes.to_string(index=False)]
    if result.ok:
        lines.append(f"ok: every case of {golden_path} holds")
    return "\n".join(lines)
