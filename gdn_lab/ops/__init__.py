"""The lab's ops: one public function per op, routed to a backend (see gdn_lab.routing).

Each op lives in its own folder, `gdn_lab/ops/<op>/`, which registers its spec (`gdn_lab.ops.spec`)
and its backends when imported; every such folder is imported here, so a new op is a new folder.
The public functions are also exported here by name (`gdn_lab.ops.decode_attention(...)`); an op
folder's modules are reached with `from gdn_lab.ops.decode_attention import reference`.
"""

import importlib
import pkgutil

from gdn_lab.ops import spec

# Op folders: the subpackages of this package (shared helper modules are plain modules).
for _info in pkgutil.iter_modules(__path__):
    if _info.ispkg:
        importlib.import_module(f"{__name__}.{_info.name}")

from gdn_lab.ops.causal_conv1d_update import causal_conv1d_update  # noqa: E402
from gdn_lab.ops.decode_attention import decode_attention  # noqa: E402
from gdn_lab.ops.fused_moe import fused_moe  # noqa: E402
from gdn_lab.ops.gdn_decode import gdn_decode  # noqa: E402
from gdn_lab.ops.gdn_layer_prefill import gdn_layer_prefill  # noqa: E402
from gdn_lab.ops.gdn_prefill import gdn_prefill  # noqa: E402
from gdn_lab.ops.matmul import matmul  # noqa: E402
from gdn_lab.ops.prefill_attention import prefill_attention  # noqa: E402
from gdn_lab.ops.rms_norm import rms_norm  # noqa: E402

__all__ = [
    "causal_conv1d_update",
    "decode_attention",
    "fused_moe",
    "gdn_decode",
    "gdn_layer_prefill",
    "gdn_prefill",
    "matmul",
    "prefill_attention",
    "rms_norm",
    "spec",
]
