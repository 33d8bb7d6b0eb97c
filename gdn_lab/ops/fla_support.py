"""What the `fla` backends of gdn_decode and gdn_prefill share: probes and contracts (fla-core >= 0.6).

Light on purpose: fla is not imported here (a find_spec probe, cached), only when a backend runs
(`gdn_lab.ops.fla_adapter`, which also sets FLA_DISABLE_BACKEND_DISPATCH=1).

- gdn_decode `fla`: `fused_recurrent_gated_delta_rule`, on a GPU or under TRITON_INTERPRET=1 on
  the CPU (it runs there as is).
- gdn_prefill `fla`: `chunk_gated_delta_rule`, GPU only: under the interpreter its autotuner
  needs a GPU driver and its chunk_delta_h kernel calls `.to()` on a loop index, which is a plain
  int there.
- gdn_prefill `fla-recurrent` (named only): `fused_recurrent_gated_delta_rule` over the varlen
  batch, the kernel fla's layer takes for short inputs at inference; GPU or interpreter.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from functools import cache
from typing import Any

from gdn_lab.device import interpreting, triton_installed, triton_mode
from gdn_lab.routing import Check

ADAPTER = "gdn_lab.ops.fla_adapter"
INSTALL_HINT = "fla-core is not installed (pip install 'fla-core>=0.6.0', the `gpu` extra)"
CHUNK_ON_CPU = (
    "fla's chunk_gated_delta_rule does not run under TRITON_INTERPRET (its autotuner needs a GPU driver, and "
    "chunk_delta_h calls .to() on a loop index, a plain int in the interpreter): it needs a GPU"
)


@cache
def _probe(interpret: bool, needs_gpu: bool) -> Check:
    """fla's availability on the default device, from `device.triton_mode` (cached per TRITON_INTERPRET
    setting, `interpret`, which is the cache key: the mode itself is read inside)."""
    if importlib.util.find_spec("fla") is None or not triton_installed():
        return False, INSTALL_HINT
    mode, reason = triton_mode()
    if mode == "gpu":
        return True, "fla on the GPU"
    if needs_gpu:
        return False, CHUNK_ON_CPU
    if mode == "interpreter":
        return True, "fla's fused_recurrent under TRITON_INTERPRET=1 on the CPU"
    return False, reason


def available_recurrent() -> Check:
    """fla importable, and a GPU or the Triton interpreter (cached per TRITON_INTERPRET setting)."""
    return _probe(interpreting(), False)


def available_chunk() -> Check:
    """fla importable and a GPU (the chunk op does not run under the interpreter)."""
    return _probe(interpreting(), True)


def covered_recurrent(args: Mapping[str, Any]) -> Check:
    """Tensors on the GPU, or on the CPU under the interpreter (`device.triton_mode`)."""
    mode, reason = triton_mode(args["q"].device)
    if mode is None:
        return False, reason
    return True, "fla fused_recurrent_gated_delta_rule"


def covered_chunk(args: Mapping[str, Any]) -> Check:
    """Tensors on the GPU."""
    if args["q"].device.type == "cpu":
        return False, CHUNK_ON_CPU
    return True, "fla chunk_gated_delta_rule (varlen, chunk 64)"
