"""AITER's `chunk_gated_delta_rule_opt_vk` as SGLang calls it: which state-recurrence kernel (K5) a launch takes.

Read from SGLang's `AiterGDNKernel.extend` (fork apinge/sglang @1de3bf01,
`python/sglang/srt/layers/attention/linear/kernels/gdn_aiter.py`) and aiter's
`aiter/ops/triton/gated_delta_net/gated_delta_rule.py` (aiter_contracts.md 3.7, 3.10): SGLang passes
`use_chunk_hip = (query_start_loc.numel() == 2)`, i.e. the HIP K5 kernel for a single sequence and
AITER's Triton K5 otherwise (FlyDSL's K5 is off: `use_chunk_flydsl=False`). Two K5 kernels sum the
chunk states in their own order, so a sequence prefilled alone (HIP) and inside a batch (Triton)
takes two numerics keys. Within one kernel the rule assumes no further batch dependence: the HIP
K5's `_select_bv_*` V tile (aiter_contracts.md open question 4) is not known to change numerics.

Example:
    >>> k5_kernel(1), k5_kernel(2)
    ('hip', 'triton')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gdn_lab import checks
from gdn_lab.rules.base import Predicted, RuleEnv

SOURCE = (
    "sglang (fork apinge/sglang @1de3bf01) gdn_aiter.py::AiterGDNKernel.extend (use_chunk_hip for one sequence); "
    "aiter aiter/ops/triton/gated_delta_net/gated_delta_rule.py::chunk_gated_delta_rule_opt_vk"
)


def k5_kernel(num_sequences: int) -> str:
    """The K5 kernel SGLang's call takes: "hip" for one sequence, "triton" for several."""
    checks.check_positive("num_sequences", num_sequences)
    return "hip" if num_sequences == 1 else "triton"


@dataclass(frozen=True)
class GdnPrefillVkRule:
    """The DispatchRule of the `aiter-vk` backend, for a validated gdn_prefill call."""

    name: str = "aiter_gdn_prefill_vk"
    source: str = SOURCE

    def predict(self, args: Mapping[str, Any], request: int, env: RuleEnv) -> Predicted:
        """The K5 kernel of the call `args`, seen from sequence `request`."""
        n = args["cu_seqlens"].numel() - 1
        if not isinstance(request, int) or isinstance(request, bool) or not 0 <= request < n:
            raise ValueError(f"request: expected a sequence index in [0, {n}), got {request!r}")
        kernel = k5_kernel(n)
        why = "one sequence: use_chunk_hip=True" if n == 1 else f"{n} sequences: use_chunk_hip=False (Triton K5)"
        return Predicted(f"k5={kernel}", f"k5={kernel}", why)

    def expect(self, alone_key: str, batched_key: str) -> str:
        """ "equal" for the same K5 kernel, else "switch"."""
        return "equal" if alone_key == batched_key else "switch"


RULE = GdnPrefillVkRule()
