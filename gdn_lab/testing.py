"""`assert_batch_invariant`: a batch-invariance check for other projects' pytest suites.

    from gdn_lab.testing import assert_batch_invariant

    def test_aiter_decode_batch_invariance():
        assert_batch_invariant("decode_attention", "aiter")

runs SGLang's kernel test (`SGLANG_DECODE_CASES`: targets of 1, 255, 256, 257, 4000 and 12000
tokens, alone and at a random position in batches of 2, 8 and 33, batchmates of 1..16383 tokens,
bf16 and fp8 KV, token-level pages). It first runs the op's batch-variant controls on the same
cases and fails as *insensitive* if none is caught (a check that could not see a difference is not
a pass), then the backend; a failure names the case, the batch, the target's position and how many
elements differ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from gdn_lab.experiments import batch_invariance
from gdn_lab.ops import spec as op_spec

# SGLang's test_aiter_decode_batch_invariance as the lab runs it (Qwen3-8B heads at TP1: 32/8/128).
SGLANG_DECODE_CASES: tuple[dict[str, Any], ...] = (
    {
        "targets": [1, 255, 256, 257, 4000, 12000],
        "batch_sizes": [2, 8, 33],
        "min_context": 1,
        "max_context": 16383,
        "kv_dtypes": [None, "fp8"],
        "dtype": "bfloat16",
        "attention": {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "page_size": 1},
    },
)


def _configs(op: str, backends: Sequence[str], include_controls: bool, cases, common) -> list:
    out = []
    for case in cases:
        fields = {**common, **{k: v for k, v in case.items() if k != "kv_dtypes"}}
        kv_dtypes = case.get("kv_dtypes", [None]) if op_spec.get(op).kv_cache else [None]
        for kv in kv_dtypes:
            out.append(
                batch_invariance.InvarianceConfig(
                    op=op, backends=tuple(backends), include_controls=include_controls, kv_dtype=kv, **fields
                )
            )
    return out


def _where(rows: pd.DataFrame) -> str:
    return "; ".join(
        f"target {int(r.target_len)} tokens, kv {r.kv_dtype}, batch of {int(r.batch_size)} at position "
        f"{int(r.position)}: {r.tensor} differs in {int(r.n_diff)} elements (up to {int(r.max_ulp)} ulp)"
        for r in rows.itertuples()
    )


def assert_batch_invariant(
    op: str,
    backend: str,
    cases: Sequence[Mapping[str, Any]] | None = None,
    *,
    device: str = "auto",
    seed: int = 0,
    progress: bool = False,
) -> pd.DataFrame:
    """Assert that `backend` gives a target request the same bits alone and in every batch.

    Args:
        op: the op (`gdn_lab.ops.spec.names()`).
        backend: one of its backends.
        cases: dicts of `InvarianceConfig` fields (targets, batch_sizes, min_context, max_context,
            dtype, attention/gdn/linear shapes, ...) plus `kv_dtypes` for ops with a KV cache;
            default `SGLANG_DECODE_CASES` (the KV dtypes apply only to ops with a KV cache).
        device: "auto", "cpu" or "cuda".
        seed: seeds every workload.
        progress: tqdm bars.

    Returns:
        The backend's table (one row per comparison), when it passes.

    Raises:
        AssertionError: the controls were not caught (insensitive), the backend did not cover a
            case, or a comparison changed bits (the message names each).
        ValueError: bad input (an unknown op, backend or field).
    """
    cases = SGLANG_DECODE_CASES if cases is None else cases
    common = {"device": device, "seed": seed}
    # both sets of configs are built (and validated) before anything runs
    control_configs = _configs(op, [], True, cases, common)
    backend_configs = _configs(op, [backend], False, cases, common)
    controls = pd.concat([batch_invariance.run(c, progress=progress) for c in control_configs], ignore_index=True)
    if controls.empty:
        raise AssertionError(f"insensitive: {op} has no batch-variant control to prove the check can see a difference")
    done = controls[controls.status == "compared"]
    if done.empty or done.bitwise_equal.astype(bool).all():
        names = ", ".join(sorted(controls.backend.unique()))
        why = (
            "none of them ran: " + str(controls.reason.iloc[0]) if done.empty else "they kept their bits in every case"
        )
        raise AssertionError(f"insensitive: {op}'s batch-variant controls ({names}) were not caught; {why}")
    table = pd.concat([batch_invariance.run(c, progress=progress) for c in backend_configs], ignore_index=True)
    uncovered = table[table.status != "compared"]
    if not uncovered.empty:
        r = uncovered.iloc[0]
        raise AssertionError(
            f"{op}/{backend} did not run {len(uncovered)} of {len(table)} cases; first: target {r.target_len} tokens, "
            f"batch of {r.batch_size}: {r.status}: {r.reason}"
        )
    differ = table[~table.bitwise_equal.astype(bool)]
    if not differ.empty:
        raise AssertionError(
            f"{op}/{backend} is not batch invariant in {len(differ)} of {len(table)} comparisons: {_where(differ)}"
        )
    return table
