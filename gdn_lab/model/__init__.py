"""A small Qwen3-Next-style hybrid decoder on the lab's ops (GDN + gated attention at 3:1).

`ModelConfig.from_name("tiny")` runs on the CPU in seconds; `"qwen3-next-80b-tp4"` has the per-rank
layer shapes of Qwen3-Next-80B-A3B at tensor parallelism 4, for a GPU.
"""

from gdn_lab.model.config import PRESETS, ModelConfig
from gdn_lab.model.layers import ForwardBatch
from gdn_lab.model.model import OPS, Cache, Generation, Model, StepOutput, resolve_backends

__all__ = [
    "OPS",
    "PRESETS",
    "Cache",
    "ForwardBatch",
    "Generation",
    "Model",
    "ModelConfig",
    "StepOutput",
    "resolve_backends",
]
