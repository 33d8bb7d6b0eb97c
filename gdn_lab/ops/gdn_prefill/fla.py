"""gdn_prefill's `fla` backends: flash-linear-attention's chunk op and, named only, its recurrent op."""

from __future__ import annotations

from gdn_lab.ops.fla_support import ADAPTER, available_chunk, available_recurrent, covered_chunk, covered_recurrent
from gdn_lab.ops.gdn_prefill import OP
from gdn_lab.routing import LIBRARY_FLA, PRIORITY_FLA, Backend, lazy, register

register(
    Backend(
        OP,
        "fla",
        lazy(ADAPTER, "gdn_prefill_fla"),
        library=LIBRARY_FLA,
        available=available_chunk,
        covered=covered_chunk,
        priority=PRIORITY_FLA,
        reproducible=False,  # chunk_delta_h is autotuned: its config can differ between processes
        description="fla chunk_gated_delta_rule, varlen cu_seqlens, FLA_DISABLE_BACKEND_DISPATCH=1",
    )
)
register(
    Backend(
        OP,
        "fla-recurrent",
        lazy(ADAPTER, "gdn_prefill_fla_recurrent"),
        library=LIBRARY_FLA,
        available=available_recurrent,
        covered=covered_recurrent,
        priority=PRIORITY_FLA,
        auto=False,
        description="fla fused_recurrent_gated_delta_rule over the varlen batch (fla's short-input inference path)",
    )
)
