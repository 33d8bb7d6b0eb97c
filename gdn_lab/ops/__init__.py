"""The lab's ops: one public function per op, routed to a backend (see gdn_lab.routing).

Each op family lives in its own folder with the PyTorch reference beside the kernels.
"""

from gdn_lab.ops.attention import decode as _decode
from gdn_lab.ops.attention import prefill as _prefill
from gdn_lab.ops.attention.decode import decode_attention
from gdn_lab.ops.attention.prefill import prefill_attention
from gdn_lab.ops.gated_delta_rule import decode as _gdn_decode
from gdn_lab.ops.gated_delta_rule import prefill as _gdn_prefill
from gdn_lab.ops.gated_delta_rule.decode import gdn_decode
from gdn_lab.ops.gated_delta_rule.prefill import gdn_prefill
from gdn_lab.ops.gdn_layer import conv_update as _conv_update
from gdn_lab.ops.gdn_layer import layer_prefill as _layer_prefill
from gdn_lab.ops.gdn_layer.conv_update import causal_conv1d_update
from gdn_lab.ops.gdn_layer.layer_prefill import gdn_layer_prefill
from gdn_lab.ops.matmul import gemm as _matmul
from gdn_lab.ops.matmul.gemm import matmul
from gdn_lab.ops.rmsnorm import rmsnorm as _rmsnorm
from gdn_lab.ops.rmsnorm.rmsnorm import rms_norm

__all__ = [
    "causal_conv1d_update",
    "decode_attention",
    "gdn_decode",
    "gdn_layer_prefill",
    "gdn_prefill",
    "matmul",
    "prefill_attention",
    "rms_norm",
]

# A small validated call per op, for explain() in `gdn-lab env` and for tests.
EXAMPLES = {
    "decode_attention": _decode.example,
    "prefill_attention": _prefill.example,
    "gdn_decode": _gdn_decode.example,
    "gdn_prefill": _gdn_prefill.example,
    "gdn_layer_prefill": _layer_prefill.example,
    "causal_conv1d_update": _conv_update.example,
    "matmul": _matmul.example,
    "rms_norm": _rmsnorm.example,
}
