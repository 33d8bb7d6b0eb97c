"""Model: a small Qwen3-Next-style hybrid decoder on the lab's ops, with paged caches and greedy decode.

    prompts --prefill (packed, cu_seqlens)--> first tokens --decode_step x (n - 1)--> n tokens each

Every op call goes through `gdn_lab.routing` with the backend chosen for that op (`backends`), so
the same weights run on the torch references, our Triton kernels or AITER's, and a batch-variant
control can be switched in for one op. The model is an nn.Module tree and `gdn_lab.trace.record`
sees all of it; `generate(..., trace=tr)` states each step's layout to the trace.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gdn_lab import routing
from gdn_lab.cache import conv_state_pool, gdn_state_pool, page_table
from gdn_lab.model.config import ModelConfig
from gdn_lab.model.layers import (
    DECODE,
    PREFILL,
    DecoderLayer,
    ForwardBatch,
    GatedDeltaNet,
    GatedRMSNorm,
    GreedySampler,
    Linear,
    RMSNorm,
    RoutedExperts,
)
from gdn_lab.trace import Layout, Trace

# The lab ops the model calls; each gets a backend ("torch" unless told otherwise).
OPS = (
    "matmul",
    "rms_norm",
    "gdn_layer_prefill",
    "causal_conv1d_update",
    "gdn_decode",
    "prefill_attention",
    "decode_attention",
    "fused_moe",
)


def resolve_backends(backends: Mapping[str, str] | None) -> dict[str, str]:
    """Every op's backend: the given ones, "torch" for the rest.

    Raises:
        ValueError: an op the model does not call, or a name that is not one of the op's backends.
    """
    if backends is None:
        backends = {}
    if not isinstance(backends, Mapping):
        raise ValueError(f"backends: expected a mapping op -> backend name, got {type(backends).__name__}")
    unknown = sorted(set(backends) - set(OPS))
    if unknown:
        raise ValueError(
            f"backends: {', '.join(map(repr, unknown))} not called by the model; accepted keys: {', '.join(OPS)}"
        )
    for op, name in backends.items():
        names = routing.backend_names(op)
        if name != "auto" and name not in names:
            raise ValueError(f"backends[{op!r}]: {name!r} is not a backend of {op}; accepted: auto, {', '.join(names)}")
    return {op: backends.get(op, "torch") for op in OPS}


@dataclass
class StepOutput:
    """One forward's result: tokens int64 [N], logprobs float32 [N] (of the chosen tokens), logits [N, V]."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    logits: torch.Tensor


@dataclass
class Generation:
    """generate's result: tokens int64 [N, n], logprobs float32 [N, n], in request_ids order."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    request_ids: tuple[int | str, ...]


class Cache:
    """The caches of one batch of requests: a paged KV cache per attention layer (shuffled pages),
    a conv-state and a recurrent-state pool per GDN layer (shuffled slots, one spare), and the
    tokens each request holds. Build with `Model.new_cache`."""

    def __init__(
        self,
        model: Model,
        prompt_lens: Sequence[int],
        max_new_tokens: int,
        request_ids: Sequence[int | str] | None,
        seed: int,
        shuffle: bool,
    ) -> None:
        cfg, dev = model.config, model.device
        if isinstance(prompt_lens, (str, bytes)) or not isinstance(prompt_lens, Sequence) or not prompt_lens:
            raise ValueError(f"prompt_lens: expected a non-empty sequence of positive ints, got {prompt_lens!r}")
        for i, n in enumerate(prompt_lens):
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ValueError(f"prompt_lens: entry {i} is {n!r}; accepted: positive ints")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens: expected a positive int, got {max_new_tokens!r}")
        n = len(prompt_lens)
        ids = tuple(range(n)) if request_ids is None else request_ids
        self.request_ids = Layout.per_request(ids).request_ids  # validates: distinct ints/strs
        if len(self.request_ids) != n:
            raise ValueError(f"request_ids: {len(self.request_ids)} ids for {n} prompts; accepted: one per prompt")
        # The prompt, then every generated token but the last is fed back and cached.
        self.capacity = [p + max_new_tokens - 1 for p in prompt_lens]
        longest = max(self.capacity)
        if longest > cfg.max_position_embeddings:
            raise ValueError(
                f"prompt_lens, max_new_tokens: {longest} positions exceed max_position_embeddings "
                f"(={cfg.max_position_embeddings}); accepted: prompt + max_new_tokens - 1 <= that"
            )
        self.prompt_lens = list(prompt_lens)
        self.seq_lens = [0] * n
        self.step = -1  # 0 after the prefill, i after the i-th decode step
        self.page_size = cfg.page_size
        attn = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
        gdn = [i for i, t in enumerate(cfg.layer_types) if t == "linear_attention"]
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if attn:
            # NaN placeholders: pages hold NaN until written, so reading past a context shows.
            self.page_indptr, self.page_ids, num_pages = page_table(
                self.capacity, cfg.page_size, seed=seed, shuffle=shuffle
            )
            shape = (num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)

            def pool() -> torch.Tensor:
                return torch.full(shape, float("nan"), dtype=cfg.dtype, device=dev)

            for i in attn:
                self.kv[i] = (pool(), pool())
        else:
            self.page_indptr, self.page_ids = [0] * (n + 1), []
        num_slots = n + 1  # a spare slot, so a request's slot is not its row
        order = (
            torch.randperm(num_slots, generator=torch.Generator().manual_seed(seed))
            if shuffle
            else torch.arange(num_slots)
        )
        self.slots = order[:n].to(device=dev, dtype=torch.int32)
        self.gdn: dict[int, tuple[torch.Tensor, torch.Tensor]] = {
            i: (
                conv_state_pool(num_slots, cfg.conv_dim, cfg.conv_kernel, dtype=cfg.dtype, device=dev),
                gdn_state_pool(
                    num_slots, cfg.linear_num_value_heads, cfg.linear_head_dim, cfg.linear_head_dim, device=dev
                ),
            )
            for i in gdn
        }
        self.device = dev

    @property
    def num_requests(self) -> int:
        return len(self.request_ids)

    def batch(self, mode: str, new_tokens: Sequence[int]) -> ForwardBatch:
        """The metadata of a forward that appends new_tokens[i] tokens to request i."""
        ps, dev = self.page_size, self.device
        positions, slot_mapping, cu, kv_indptr, kv_indices, lens = [], [], [0], [0], [], []
        for r, add in enumerate(new_tokens):
            start, end = self.seq_lens[r], self.seq_lens[r] + add
            positions.extend(range(start, end))
            cu.append(cu[-1] + add)
            lens.append(end)
            if not self.kv:  # no attention layer: no pages (an empty page table)
                kv_indptr.append(0)
                continue
            pages = self.page_ids[self.page_indptr[r] : self.page_indptr[r + 1]]
            slot_mapping.extend(pages[p // ps] * ps + p % ps for p in range(start, end))
            need = math.ceil(end / ps)
            kv_indices.extend(pages[:need])
            kv_indptr.append(kv_indptr[-1] + need)

        def i32(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int32, device=dev)

        def i64(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int64, device=dev)

        return ForwardBatch(
            mode=mode, positions=i64(positions), cu_seqlens=i32(cu), last_index=i64([c - 1 for c in cu[1:]]),
            seq_lens=i32(lens), kv_indptr=i32(kv_indptr), kv_indices=i32(kv_indices), slot_mapping=i64(slot_mapping),
            slots=self.slots, has_initial_state=torch.zeros(len(new_tokens), dtype=torch.bool, device=dev), cache=self,
        )  # fmt: skip

    def advance(self, new_tokens: Sequence[int]) -> None:
        self.seq_lens = [s + n for s, n in zip(self.seq_lens, new_tokens)]
        self.step += 1


class Model(nn.Module):
    """A Qwen3-Next-style hybrid decoder: GDN and gated-attention layers at 3:1, zero-centred
    RMSNorm, dense SwiGLU MLP, untied lm_head, seeded random weights.

    Args:
        config: shapes (`ModelConfig.from_name("tiny")`, `"qwen3-next-80b-tp4"`).
        backends: op -> backend name for the ops in `OPS` ("torch" for those not given).
        device: where weights and caches live (default: the CPU).

    Raises:
        ValueError: a config that is not a ModelConfig, or a bad backends mapping.

    Example:
        >>> from gdn_lab.model import Model, ModelConfig
        >>> model = Model(ModelConfig.from_name("tiny"))
        >>> out = model.generate([[1, 2, 3], [4, 5]], max_new_tokens=3)
        >>> out.tokens.shape, out.logprobs.dtype
        (torch.Size([2, 3]), torch.float32)
    """

    def __init__(
        self, config: ModelConfig, *, backends: Mapping[str, str] | None = None, device: torch.device | str = "cpu"
    ) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise ValueError(f"config: expected a ModelConfig, got {type(config).__name__}")
        self.config = config
        self.backends = resolve_backends(backends)  # shared by every layer: set_backends updates them all
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i, self.backends) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, self.backends)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, self.backends)
        self.sampler = GreedySampler()
        self._init_weights()
        self.to(device=device)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def set_backends(self, backends: Mapping[str, str]) -> None:
        """Switch the backends of the given ops (the others keep theirs).

        Raises:
            ValueError: as the constructor's `backends`.
        """
        resolve_backends(backends)
        self.backends.update(backends)

    @torch.no_grad()
    def _init_weights(self) -> None:
        """Seeded random weights, drawn on the CPU in a fixed order, so every device gets the same."""
        g = torch.Generator().manual_seed(self.config.seed)
        dtype = self.config.dtype

        def draw(shape, scale: float, shift: float = 0.0) -> torch.Tensor:
            return shift + scale * torch.randn(*shape, generator=g)

        for module in self.modules():
            if isinstance(module, Linear):
                w = module.weight
                module.weight.data = draw(w.shape, w.shape[1] ** -0.5).to(dtype)
            elif isinstance(module, nn.Embedding):
                module.weight.data = draw(module.weight.shape, 1.0).to(dtype)
            elif isinstance(module, RMSNorm):  # zero-centred: 1 + w is applied
                module.weight.data = draw(module.weight.shape, 0.1).to(dtype)
            elif isinstance(module, GatedRMSNorm):
                module.weight.data = draw(module.weight.shape, 0.1, 1.0).to(dtype)
            elif isinstance(module, RoutedExperts):
                module.w13.data = draw(module.w13.shape, module.w13.shape[2] ** -0.5).to(dtype)
                module.w2.data = draw(module.w2.shape, module.w2.shape[2] ** -0.5).to(dtype)
            elif isinstance(module, GatedDeltaNet):
                w = module.conv_weight
                module.conv_weight.data = draw(w.shape, w.shape[1] ** -0.5).to(dtype)
                hv = module.A_log.shape[0]
                module.A_log.data = torch.log(1 + 15 * torch.rand(hv, generator=g))  # A in (1, 16), as HF's U(0, 16)
                module.dt_bias.data = draw((hv,), 0.1, 1.0)

    def new_cache(
        self,
        prompt_lens: Sequence[int],
        max_new_tokens: int,
        *,
        request_ids: Sequence[int | str] | None = None,
        seed: int = 0,
        shuffle: bool = True,
    ) -> Cache:
        """Caches for a batch of prompts that will each receive max_new_tokens tokens.

        Args:
            prompt_lens: tokens per prompt (each > 0).
            max_new_tokens: tokens generated per request (the first comes from the prefill).
            request_ids: distinct ids (default 0..N-1), used by traces.
            seed: seeds the page and slot placement.
            shuffle: scatter pages and slots (True) or place them in order.

        Raises:
            ValueError: bad lengths or ids, or more positions than the RoPE table holds.
        """
        return Cache(self, prompt_lens, max_new_tokens, request_ids, seed, shuffle)

    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """input_ids int64 [T] (packed) -> logits [N, vocab] of each request's last token."""
        h = self.embed_tokens(input_ids)  # [T, H]
        for layer in self.layers:
            h = layer(h, batch)
        return self.lm_head(self.norm(h.index_select(0, batch.last_index)))  # [N, V]

    def _check_tokens(self, name: str, flat: Sequence[int]) -> None:
        v = self.config.vocab_size
        bad = next((t for t in flat if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < v), None)
        if bad is not None:
            raise ValueError(f"{name}: token {bad!r} is not accepted; expected ints in [0, {v})")

    @torch.no_grad()
    def prefill(self, prompts: Sequence[Sequence[int]], cache: Cache, *, trace: Trace | None = None) -> StepOutput:
        """Run the prompts as one packed batch (cu_seqlens) and choose each request's first token.

        Args:
            prompts: N token lists, the lengths given to `new_cache`.
            cache: a fresh Cache from `new_cache`.
            trace: a Trace to tell this step's layout (step 0, packed by prompt).

        Returns:
            StepOutput with tokens [N], logprobs [N] and logits [N, V].

        Raises:
            ValueError: prompts that do not match the cache, out-of-vocabulary tokens, a used cache.
        """
        if not isinstance(cache, Cache):
            raise ValueError(f"cache: expected a Cache from Model.new_cache, got {type(cache).__name__}")
        lens = [len(p) for p in prompts]
        if lens != cache.prompt_lens:
            raise ValueError(f"prompts: lengths {lens} do not match the cache's prompt_lens {cache.prompt_lens}")
        if cache.step != -1:
            raise ValueError("cache: already prefilled; accepted: a fresh Cache from Model.new_cache")
        flat = [t for p in prompts for t in p]
        self._check_tokens("prompts", flat)
        batch = cache.batch(PREFILL, lens)
        if trace is not None:
            trace.set_layout(Layout.packed([0, *itertools.accumulate(lens)], cache.request_ids), step=0)
        out = self._step(torch.tensor(flat, dtype=torch.int64, device=self.device), batch)
        cache.advance(lens)
        return out

    @torch.no_grad()
    def decode_step(self, tokens: torch.Tensor, cache: Cache, *, trace: Trace | None = None) -> StepOutput:
        """Feed one token per request and choose the next.

        Args:
            tokens: int64 [N], each request's latest token.
            cache: the Cache the prefill filled.
            trace: a Trace to tell this step's layout (one row per request, step = decode step).

        Returns:
            StepOutput with tokens [N], logprobs [N] and logits [N, V].

        Raises:
            ValueError: wrong tokens shape, a cache not yet prefilled, or no room left.
        """
        n = cache.num_requests
        if not isinstance(tokens, torch.Tensor) or tokens.shape != (n,) or tokens.dtype != torch.int64:
            got = f"{tokens.dtype} {tuple(tokens.shape)}" if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"tokens: expected int64 [{n}] (one per request), got {got}")
        if cache.step < 0:
            raise ValueError("cache: not prefilled yet; call Model.prefill first")
        full = [i for i, (s, c) in enumerate(zip(cache.seq_lens, cache.capacity)) if s >= c]
        if full:
            raise ValueError(f"cache: requests {full} hold their max_new_tokens already; accepted: a cache with room")
        batch = cache.batch(DECODE, [1] * n)
        if trace is not None:
            trace.set_layout(Layout.per_request(cache.request_ids), step=cache.step + 1)
        out = self._step(tokens.to(self.device), batch)
        cache.advance([1] * n)
        return out

    def _step(self, input_ids: torch.Tensor, batch: ForwardBatch) -> StepOutput:
        logits = self(input_ids, batch)
        tokens, logprobs = self.sampler(logits)
        return StepOutput(tokens, logprobs, logits)

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        *,
        request_ids: Sequence[int | str] | None = None,
        placement_seed: int = 0,
        trace: Trace | None = None,
    ) -> Generation:
        """Greedy decoding: a packed prefill, then max_new_tokens - 1 decode steps.

        Args:
            prompts: N token lists (token ids in [0, vocab_size)).
            max_new_tokens: tokens per request.
            request_ids: distinct ids (default 0..N-1).
            placement_seed: seeds where pages and slots go.
            trace: a Trace (from `gdn_lab.trace.record(model, ...)`) whose layout is set before
                every forward: step 0 the prefill, step i the i-th decode step.

        Returns:
            Generation with tokens [N, max_new_tokens] and their logprobs.
        """
        cache = self.new_cache([len(p) for p in prompts], max_new_tokens, request_ids=request_ids, seed=placement_seed)
        out = self.prefill(prompts, cache, trace=trace)
        tokens, logprobs = [out.tokens], [out.logprobs]
        for _ in range(max_new_tokens - 1):
            out = self.decode_step(out.tokens, cache, trace=trace)
            tokens.append(out.tokens)
            logprobs.append(out.logprobs)
        return Generation(torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1), cache.request_ids)
