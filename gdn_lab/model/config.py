"""ModelConfig: the shapes of a Qwen3-Next-style hybrid decoder, with named presets.

`qwen3-next-80b-tp4` is one tensor-parallel rank of Qwen3-Next-80B-A3B at TP = 4, derived from the
model's published configuration (transformers' Qwen3NextConfig defaults, which are the 80B-A3B
checkpoint's: hidden 2048, 48 layers with full attention every 4th, attention 16 query / 2 KV heads
of 256, GDN 16 key / 32 value heads of 128, conv width 4, 512 experts with 10 per token and an
expert and shared-expert width of 512):

- attention: 16 / 4 = 4 query heads per rank; 2 KV heads < 4 ranks, so each KV head is replicated
  on 2 ranks (as SGLang and vLLM do) and a rank holds 1; head_dim 256, partial RoPE 0.25 (64 dims);
- GDN: 16 / 4 = 4 key heads and 32 / 4 = 8 value heads per rank, K = V = 128, so conv_dim =
  2*4*128 + 8*128 = 2048 and in_proj_qkvz is 2048 -> 4 * (2*128 + 2*2*128) = 3072;
- the MoE is replaced by a dense MLP of the same active width per rank: (10 experts + 1 shared)
  * 512 / 4 = 1408 (gate/up 2048 -> 1408, down 1408 -> 2048); `num_experts` > 0 puts Qwen3-Next's
  sparse MoE block back (`tiny-moe`; `ModelConfig.from_name("qwen3-next-80b-tp4", num_experts=512,
  num_experts_per_tok=10, moe_intermediate_size=128, shared_expert_intermediate_size=128)` is the
  real rank, 0.4 G expert weights a layer);
- the vocabulary is cut to 1024 (weights are random; the lm_head is not what is studied);
- hidden 2048 is not sharded; the all-reduces after o_proj, out_proj and down_proj are absent.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from gdn_lab import checks

ATTENTION, LINEAR = "full_attention", "linear_attention"

PRESETS: dict[str, dict[str, Any]] = {
    # The CPU smoke model: 3 GDN layers + 1 gated attention layer, fp32, runs in seconds.
    "tiny": dict(
        vocab_size=128, hidden_size=64, num_layers=4, intermediate_size=128,
        num_attention_heads=4, num_kv_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_head_dim=16, conv_kernel=4,
        page_size=4, max_position_embeddings=256, dtype=torch.float32,
    ),
    # tiny with Qwen3-Next's sparse MoE block in place of the dense MLP: 8 experts, 3 per token, each
    # 160 wide, so the down projection's K is cut differently by the 64 and 128 K slices of AITER's
    # Triton MoE configs (its switch at 256 tokens shows in a whole model).
    "tiny-moe": dict(
        vocab_size=128, hidden_size=64, num_layers=4, intermediate_size=128,
        num_attention_heads=4, num_kv_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_head_dim=16, conv_kernel=4,
        page_size=4, max_position_embeddings=256, dtype=torch.float32,
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=160, shared_expert_intermediate_size=32,
    ),
    "qwen3-next-80b-tp4": dict(
        vocab_size=1024, hidden_size=2048, num_layers=48, intermediate_size=1408,
        num_attention_heads=4, num_kv_heads=1, head_dim=256,
        linear_num_key_heads=4, linear_num_value_heads=8, linear_head_dim=128, conv_kernel=4,
        page_size=16, max_position_embeddings=8192, dtype=torch.bfloat16,
    ),
}  # fmt: skip


_POSITIVE_INTS = (
    "vocab_size", "hidden_size", "num_layers", "intermediate_size", "num_attention_heads", "num_kv_heads",
    "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_head_dim", "conv_kernel",
    "full_attention_interval", "page_size", "max_position_embeddings",
)  # fmt: skip


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of the hybrid decoder (one tensor-parallel rank's shapes).

    Attributes:
        name: the preset it came from, or "custom".
        vocab_size, hidden_size, num_layers, intermediate_size: the decoder's sizes (dense MLP).
        num_attention_heads, num_kv_heads, head_dim: gated full attention (Hq, Hkv, D).
        linear_num_key_heads, linear_num_value_heads, linear_head_dim: GDN (HK, HV, K = V).
        conv_kernel: the GDN causal conv width W.
        full_attention_interval: layer i is full attention when (i + 1) % interval == 0 (3:1 at 4).
        rms_norm_eps: every RMSNorm's epsilon.
        partial_rotary_factor: the share of head_dim RoPE rotates.
        rope_theta: RoPE base.
        page_size: tokens per KV-cache page.
        max_position_embeddings: positions the RoPE table holds (prompt + generated tokens).
        dtype: weights and activations (GDN states are float32).
        seed: seeds the random weights.
        num_experts: E of a sparse MoE block in every layer (Qwen3-Next's); 0: the dense MLP.
        num_experts_per_tok: the experts each token is routed to (at most E).
        moe_intermediate_size: one expert's width; shared_expert_intermediate_size: the shared
            expert's (both per rank).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_head_dim: int
    conv_kernel: int = 4
    full_attention_interval: int = 4
    rms_norm_eps: float = 1e-6
    partial_rotary_factor: float = 0.25
    rope_theta: float = 10000.0
    page_size: int = 16
    max_position_embeddings: int = 4096
    dtype: torch.dtype = torch.float32
    seed: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    name: str = "custom"

    def __post_init__(self) -> None:
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed: expected an int >= 0, got {self.seed!r}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads (={self.num_attention_heads}) must be divisible by num_kv_heads (={self.num_kv_heads})"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                f"linear_num_value_heads (={self.linear_num_value_heads}) must be divisible by "
                f"linear_num_key_heads (={self.linear_num_key_heads})"
            )
        if isinstance(self.num_experts, bool) or not isinstance(self.num_experts, int) or self.num_experts < 0:
            raise ValueError(f"num_experts: expected an int >= 0 (0: the dense MLP), got {self.num_experts!r}")
        if self.num_experts:
            self._check_moe()
        if self.conv_kernel < 2:
            raise ValueError(f"conv_kernel: the conv width must be at least 2, got {self.conv_kernel}")
        rot = self.rotary_dim
        if not 2 <= rot <= self.head_dim or rot % 2:
            raise ValueError(
                f"partial_rotary_factor: {self.partial_rotary_factor} * head_dim {self.head_dim} gives {rot} rotary "
                "dims; accepted: an even count in 2..head_dim"
            )
        if self.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype: {self.dtype} is not accepted; expected float32, bfloat16 or float16")
        for name in ("rms_norm_eps", "rope_theta"):
            checks.check_positive_float(name, getattr(self, name))

    def _check_moe(self) -> None:
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"):
            checks.check_positive(name, getattr(self, name))
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok: must be at most num_experts (={self.num_experts}), got {self.num_experts_per_tok}"
            )

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> ModelConfig:
        """A preset by name ("tiny", "tiny-moe", "qwen3-next-80b-tp4"), with fields overridden by keyword.

        Raises:
            ValueError: unknown preset or field (or an invalid value).

        Example:
            >>> cfg = ModelConfig.from_name("qwen3-next-80b-tp4", num_layers=4)
            >>> cfg.layer_types
            ('linear_attention', 'linear_attention', 'linear_attention', 'full_attention')
            >>> cfg.num_attention_heads, cfg.num_kv_heads, cfg.linear_num_key_heads, cfg.linear_num_value_heads
            (4, 1, 4, 8)
        """
        if name not in PRESETS:
            raise ValueError(f"name: {name!r} is not a preset; accepted: {', '.join(map(repr, PRESETS))}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(
                f"overrides: {', '.join(unknown)} are not ModelConfig fields; accepted: {', '.join(sorted(known))}"
            )
        return cls(**{**PRESETS[name], "name": name, **overrides})

    @property
    def layer_types(self) -> tuple[str, ...]:
        """ "linear_attention" (GDN) or "full_attention" per layer."""
        k = self.full_attention_interval
        return tuple(ATTENTION if (i + 1) % k == 0 else LINEAR for i in range(self.num_layers))

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def conv_dim(self) -> int:
        """GDN conv channels: [q of all key heads | k | v of all value heads]."""
        return (2 * self.linear_num_key_heads + self.linear_num_value_heads) * self.linear_head_dim
