"""Gated delta rule: decode step and varlen prefill (reference beside the kernels)."""

# Backend registrations beyond the torch references (light modules: kernels load on first run).
from gdn_lab.ops.gated_delta_rule import decode_backends as _decode_backends  # noqa: F401
from gdn_lab.ops.gated_delta_rule import fla_backends as _fla_backends  # noqa: F401
from gdn_lab.ops.gated_delta_rule import prefill_backends as _prefill_backends  # noqa: F401
from gdn_lab.ops.gated_delta_rule.decode import gdn_decode
from gdn_lab.ops.gated_delta_rule.prefill import gdn_prefill

__all__ = ["gdn_decode", "gdn_prefill"]
