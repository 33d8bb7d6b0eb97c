"""The Gated DeltaNet layer chain: prefill (conv + gating + delta rule + gated RMSNorm + fp8) and the conv update."""

# Backend registrations beyond the torch reference (light modules: kernels load on first run).
from gdn_lab.ops.gdn_layer import fused_backends as _fused_backends  # noqa: E402, F401
from gdn_lab.ops.gdn_layer.conv_update import causal_conv1d_update
from gdn_lab.ops.gdn_layer.layer_prefill import gdn_layer_prefill

__all__ = ["causal_conv1d_update", "gdn_layer_prefill"]
