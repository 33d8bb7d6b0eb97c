"""Hugging Face causal LMs built from a config (random weights, no download), decoded greedily the way
the lab's model is, so the same invariance experiment and trace run on both.

    prompts --left-padded prefill (attention_mask, position_ids)--> first tokens
            --one token per request per step (KV / recurrent cache)--> max_new_tokens each

Builders (`BUILDERS`, by name):

| name | what | why |
|---|---|---|
| `hf-qwen3-tiny` | Qwen3, hidden 64, 2 layers, 4/2 heads of 16 | CPU: HF's dense attention path in seconds |
| `hf-qwen3-next-tiny` | Qwen3-Next, hidden 64, 3 GDN + 1 gated-attention layer, dense MLP | CPU: HF's pure-torch GDN path (fla hidden) |
| `hf-qwen3-next-moe-tiny` | the same with Qwen3-Next's sparse MoE block in every layer (8 experts, 3 per token, a shared expert) | CPU: HF's MoE experts, a loop of F.linear over each expert's gathered tokens |
| `hf-qwen3-8b` | Qwen3-8B's widths: hidden 4096, 32/8 heads of 128, MLP 12288; 4 layers, vocab 32768 | GPU: q_proj and o_proj are the K = N = 4096 bf16 matmul measured batch-variant on the H200 |

transformers is an optional extra (`pip install gdn_lab[hf]`); it is imported when a model is built.
On the CPU, Qwen3-Next is imported with flash-linear-attention hidden (`sys.modules["fla"] = None`),
so its GDN layers take HF's torch reference functions: fla's Triton kernels need a GPU driver.

Example:
    >>> m = HFModel("hf-qwen3-tiny")  # doctest: +SKIP
    >>> m.generate([[1, 2, 3], [4, 5]], 3).tokens.shape  # doctest: +SKIP
    torch.Size([2, 3])
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gdn_lab.model.model import Generation
from gdn_lab.trace import Layout, Trace

HINT = "Hugging Face models need transformers: pip install 'gdn_lab[hf]'"
QWEN3_NEXT_MODULE = "transformers.models.qwen3_next.modeling_qwen3_next"
_MISSING = object()


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(f"{HINT} ({exc})") from None
    transformers.logging.set_verbosity_error()  # the torch-fallback notice, once per function
    return transformers


def _calls_fla_on_the_cpu(module: Any) -> bool:
    """Whether an imported modeling_qwen3_next sends CPU inputs to fla's kernels.

    transformers binds fla or its torch functions at import time, in a closure; from 5.25 the closure also
    names the devices fla gets (CPU inputs take the torch path), and the `kernels` package that 5.25
    requires wraps it in a module whose forward closes over it.
    """
    fn = getattr(module, "torch_chunk_gated_delta_rule", None)
    if isinstance(fn, nn.Module):
        fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func")
    if not inspect.isfunction(fn):
        return False
    bound = inspect.getclosurevars(fn).nonlocals
    devices = bound.get("supported_devices")
    return bool(bound.get("is_new_implementation", False)) and (devices is None or "cpu" in devices)


def qwen3_next_module(torch_path: bool) -> Any:
    """transformers' modeling_qwen3_next, imported with fla hidden when `torch_path`.

    Raises:
        RuntimeError: torch_path, but the module was imported with fla earlier in this process (its
            GDN calls are bound at import time).
    """
    _transformers()
    found = sys.modules.get(QWEN3_NEXT_MODULE)
    if found is not None:
        if torch_path and _calls_fla_on_the_cpu(found):
            raise RuntimeError(
                "hf-qwen3-next on the CPU: transformers' Qwen3-Next was imported with flash-linear-attention "
                "earlier in this process, so its GDN layers call fla's GPU kernels; build it in a fresh process "
                "(gdn_lab hides fla while importing it)"
            )
        return found
    saved = sys.modules.get("fla", _MISSING)
    if torch_path:
        sys.modules["fla"] = None  # import fla -> ImportError: HF binds its torch functions
    try:
        import importlib

        return importlib.import_module(QWEN3_NEXT_MODULE)
    finally:
        if torch_path:
            if saved is _MISSING:
                sys.modules.pop("fla", None)
            else:
                sys.modules["fla"] = saved


def _qwen3(num_layers: int | None, **sizes: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        tf = _transformers()
        cfg = tf.Qwen3Config(attn_implementation="sdpa", tie_word_embeddings=False, **sizes)
        if num_layers is not None:
            cfg.num_hidden_layers = num_layers
        return tf.Qwen3ForCausalLM(cfg)

    return build


def _qwen3_next_tiny(num_layers: int | None, torch_path: bool, moe: bool = False) -> nn.Module:
    """Qwen3-Next at hidden 64; `moe`: its sparse MoE block in every layer, else the dense MLP in all
    (`mlp_only_layers`)."""
    mod = qwen3_next_module(torch_path)
    layers = 4 if num_layers is None else num_layers
    cfg = _transformers().Qwen3NextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        mlp_only_layers=[] if moe else list(range(layers)), attn_implementation="sdpa",
    )  # fmt: skip
    return mod.Qwen3NextForCausalLM(cfg)


@dataclass(frozen=True)
class Builder:
    """How one named HF model is built.

    Attributes:
        name: the builder's name.
        description: one line.
        dtype: its default dtype.
        build: (num_layers, device) -> the model (random weights, on the CPU).
    """

    name: str
    description: str
    dtype: torch.dtype
    build: Callable[[int | None, torch.device], nn.Module]


BUILDERS: dict[str, Builder] = {
    b.name: b
    for b in (
        Builder(
            "hf-qwen3-tiny",
            "Qwen3, hidden 64, 2 layers, 4/2 heads of 16, fp32",
            torch.float32,
            lambda n, dev: _qwen3(
                n,
                vocab_size=256,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
            )(),
        ),  # fmt: skip
        Builder(
            "hf-qwen3-next-tiny",
            "Qwen3-Next, hidden 64, 3 GDN + 1 gated attention, dense MLP, fp32 (torch GDN path on the CPU)",
            torch.float32,
            lambda n, dev: _qwen3_next_tiny(n, torch_path=dev.type == "cpu"),
        ),
        Builder(
            "hf-qwen3-next-moe-tiny",
            "Qwen3-Next, hidden 64, 3 GDN + 1 gated attention, sparse MoE (8 experts, 3 per token) in every layer, fp32",
            torch.float32,
            lambda n, dev: _qwen3_next_tiny(n, torch_path=dev.type == "cpu", moe=True),
        ),
        Builder(
            "hf-qwen3-8b",
            "Qwen3-8B widths (hidden 4096, 32/8 heads of 128, MLP 12288), 4 layers, vocab 32768, bf16",
            torch.bfloat16,
            lambda n, dev: _qwen3(
                4 if n is None else n,
                vocab_size=32768,
                hidden_size=4096,
                intermediate_size=12288,
                num_hidden_layers=4,
                num_attention_heads=32,
                num_key_value_heads=8,
                head_dim=128,
            )(),
        ),  # fmt: skip
    )
}


# The name of a Hugging Face model built by the caller and handed over (`HFModel.wrap`).
CUSTOM = "hf-custom"


def is_hf(name: str) -> bool:
    """Whether `name` is an HF builder or `CUSTOM` (else a lab model preset)."""
    return name in BUILDERS or name == CUSTOM


class _LabLinear:
    """nn.Linear.forward through gdn_lab.ops.matmul with a named backend (x [..., in] -> [..., out])."""

    def __init__(self, module: nn.Linear, backend: str) -> None:
        self.module, self.backend = module, backend

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from gdn_lab.ops import matmul

        m = self.module
        y = matmul(x.reshape(-1, m.in_features), m.weight.t(), backend=self.backend)
        if m.bias is not None:
            y = y + m.bias
        return y.reshape(*x.shape[:-1], m.out_features)


class HFModel:
    """A Hugging Face causal LM built from a config, with the lab model's `generate`.

    Args:
        name: a builder of `BUILDERS`.
        dtype: weights and activations (default: the builder's).
        device: where it runs.
        seed: seeds the random weights (drawn on the CPU, so every device gets the same).
        num_layers: the decoder's depth (default: the builder's).

    Raises:
        ValueError: an unknown name.
        ImportError: transformers is not installed (the message names the extra).
    """

    def __init__(
        self,
        name: str,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
        seed: int = 0,
        num_layers: int | None = None,
    ) -> None:
        if name not in BUILDERS:
            raise ValueError(f"name: {name!r} is not a Hugging Face builder; accepted: {', '.join(BUILDERS)}")
        builder = BUILDERS[name]
        dev = torch.device(device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = builder.build(num_layers, dev)
        self._adopt(model.to(device=dev, dtype=dtype or builder.dtype), name)

    def _adopt(self, model: nn.Module, name: str) -> None:
        self.name = name
        self.model = model.eval()
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self.config = model.config
        self.vocab_size = int(model.config.vocab_size)
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @classmethod
    def wrap(cls, model: nn.Module, name: str = CUSTOM) -> HFModel:
        """An HFModel around a Hugging Face causal LM the caller built (any `*ForCausalLM` whose
        forward takes input_ids, attention_mask, position_ids, use_cache and logits_to_keep).

        Raises:
            ValueError: not an nn.Module with a `config.vocab_size`.
        """
        if not isinstance(model, nn.Module) or not hasattr(getattr(model, "config", None), "vocab_size"):
            raise ValueError(
                f"model: expected a Hugging Face causal LM (an nn.Module with config.vocab_size), got {type(model).__name__}"
            )
        self = cls.__new__(cls)
        self._adopt(model, name)
        return self

    @contextlib.contextmanager
    def linear_backend(self, backend: str) -> Iterator[None]:
        """Within the block every nn.Linear of the model runs through `gdn_lab.ops.matmul` with
        `backend` (a batch-variant control, say), so a trace records it as a lab op; restored on exit."""
        from gdn_lab import routing

        if backend not in routing.backend_names("matmul"):
            raise ValueError(
                f"backend: {backend!r} is not a matmul backend; accepted: {', '.join(routing.backend_names('matmul'))}"
            )
        patched = []
        try:
            for m in self.model.modules():
                if isinstance(m, nn.Linear):
                    m.forward = _LabLinear(m, backend)
                    patched.append(m)
            yield
        finally:
            for m in patched:
                del m.forward

    def _forward(self, input_ids, attention_mask, position_ids, cache):
        kwargs = {self._cache_kw: cache} if cache is not None else {}
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
            logits_to_keep=1, **kwargs,
        )  # fmt: skip
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = out.past_key_values
        logits = out.logits[:, -1, :].float()  # [N, V]
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
        return tokens, logprobs, new_cache

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        *,
        request_ids: Sequence[int | str] | None = None,
        trace: Trace | None = None,
    ) -> Generation:
        """Greedy decoding: a left-padded prefill, then max_new_tokens - 1 one-token steps.

        Positions count each request's own tokens (padding does not advance them) and the
        attention mask hides the padding, so a request's math is the same alone and padded.

        Args:
            prompts: N token lists (ids in [0, vocab_size)).
            max_new_tokens: tokens per request.
            request_ids: distinct ids (default 0..N-1).
            trace: a Trace (from `gdn_lab.trace.record(hf_model.model, ...)`) whose layout is set
                before every forward: step 0 `Layout.padded` (the padding left out), step i
                `Layout.per_request`.

        Returns:
            Generation with tokens [N, max_new_tokens] and the float32 log-probabilities of the
            chosen tokens (log_softmax of the float32 logits).

        Raises:
            ValueError: empty prompts, out-of-vocabulary tokens, or a bad max_new_tokens.
        """
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts: expected a non-empty list of non-empty token lists")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens: expected a positive int, got {max_new_tokens!r}")
        bad = next((t for p in prompts for t in p if not (isinstance(t, int) and 0 <= t < self.vocab_size)), None)
        if bad is not None:
            raise ValueError(f"prompts: token {bad!r} is not accepted; expected ints in [0, {self.vocab_size})")
        n = len(prompts)
        ids = tuple(range(n)) if request_ids is None else tuple(request_ids)
        lens = [len(p) for p in prompts]
        t_pad, dev = max(lens), self.device
        input_ids = torch.zeros(n, t_pad, dtype=torch.int64)
        mask = torch.zeros(n, t_pad, dtype=torch.int64)
        for i, p in enumerate(prompts):
            input_ids[i, t_pad - len(p) :] = torch.tensor(p, dtype=torch.int64)
            mask[i, t_pad - len(p) :] = 1
        input_ids, mask = input_ids.to(dev), mask.to(dev)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        if trace is not None:
            trace.set_layout(Layout.padded(lens, ids, side="left"), step=0)
        tok, lp, cache = self._forward(input_ids, mask, positions, None)
        tokens, logprobs = [tok], [lp]
        for step in range(1, max_new_tokens):
            mask = torch.cat([mask, torch.ones(n, 1, dtype=mask.dtype, device=dev)], dim=1)
            positions = positions[:, -1:] + 1
            if trace is not None:
                trace.set_layout(Layout.per_request(ids), step=step)
            tok, lp, cache = self._forward(tok[:, None], mask, positions, cache)
            tokens.append(tok)
            logprobs.append(lp)
        return Generation(torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1), ids)
