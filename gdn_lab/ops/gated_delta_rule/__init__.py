"""Gated delta rule: decode step and varlen prefill (reference beside the kernels)."""

from gdn_lab.ops.gated_delta_rule.decode import gdn_decode
from gdn_lab.ops.gated_delta_rule.prefill import gdn_prefill

__all__ = ["gdn_decode", "gdn_prefill"]
