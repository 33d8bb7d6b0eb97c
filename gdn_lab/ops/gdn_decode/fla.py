"""gdn_decode's `fla` backend: flash-linear-attention's fused_recurrent_gated_delta_rule."""

from __future__ import annotations

from gdn_lab.ops.fla_support import ADAPTER, available_recurrent, covered_recurrent
from gdn_lab.ops.gdn_decode import OP
from gdn_lab.routing import LIBRARY_FLA, PRIORITY_FLA, Backend, lazy, register

register(
    Backend(
        OP,
        "fla",
        lazy(ADAPTER, "gdn_decode_fla"),
        library=LIBRARY_FLA,
        available=available_recurrent,
        covered=covered_recurrent,
        priority=PRIORITY_FLA,
        description="fla fused_recurrent_gated_delta_rule (gates in fla's kernel, state_v_first), slots gathered/written back",
    )
)
