"""AITER's HIP `paged_attention_ragged` as SGLang runs it: one variant per deployment, as data plus a predictor.

Read from aiter e4048607 (`aiter/ops/attention.py::paged_attention_ragged`, `csrc/cpp_itfs/pa/pa_ragged.py`,
`pa_ragged.cuh`, `pa_kernels.cuh`) and SGLang's `python/sglang/srt/layers/attention/aiter_backend.py`
@003c5589 (`AiterAttnBackend.__init__` and `forward_decode`), summarised in aiter_contracts.md 1.2-1.4:

- SGLang fixes `max_num_partitions = ceil(context_len / 256)` once per deployment (context_len is the
  model's, not the batch's) and sizes its workspace from it; the kernel's template key holds
  `npar_loops = ceil(max_num_partitions / 64)`, the block size, the dtypes and the partition size
  (256, hard-coded in the QK kernel);
- launch 1 gives every (sequence, partition, KV head) its own workgroup over absolute 256-token
  partitions (workgroups past a sequence's end exit); launch 2 merges one sequence's partitions in
  a fixed order, padding partitions adding exact zeros;
- nothing in either launch reads another sequence or the batch size.

So every launch of one deployment takes one variant, and a request's bits depend on nothing the
batch changes: the rule predicts the same key for a request alone and in any batch. This is a
claim read from the code, not measured on AMD hardware; a rule (rather than none) lets the
predicted-vs-measured experiment run the `aiter` backend and report any measured difference as an
"unpredicted difference" (a finding), which is what SGLang's kernel test checks.

The deployment is a setting, like AITER's emulation: `deployment(max_context=..., token_pages=...)`
holds it for a `with` block (blocks nest; restored on every exit), `current_deployment()` reads it.
The default is SGLang's view for its determinism CI model: context_len 40960 (Qwen3-8B's
max_position_embeddings), so max_num_partitions 160, with token-level pages (block size 1).

Example:
    >>> with deployment(max_context=16384):
    ...     current_deployment().max_num_partitions
    64
    >>> current_deployment().max_num_partitions
    160
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gdn_lab import checks
from gdn_lab.rules.base import Predicted, RuleEnv

SOURCE = (
    "aiter e4048607 aiter/ops/attention.py::paged_attention_ragged + csrc/cpp_itfs/pa/pa_ragged.py, pa_kernels.cuh; "
    "sglang @003c5589 python/sglang/srt/layers/attention/aiter_backend.py::AiterAttnBackend (code reading)"
)
PARTITION_SIZE = 256  # T_PAR_SIZE in the QK kernel; SGLang's _AITER_PARTITION_SIZE_ROCM
WARP_SIZE = 64  # CDNA wavefront: npar_loops = ceil(max_num_partitions / 64)
DEFAULT_MAX_CONTEXT = 40960  # SGLang's context_len for Qwen3-8B (max_position_embeddings)


@dataclass(frozen=True)
class Deployment:
    """What SGLang fixes once per server for `paged_attention_ragged`.

    Attributes:
        max_context: SGLang's `model_config.context_len`: the longest context any request may have.
        token_pages: True: SGLang's call, the KV pool viewed as pages of one token (block size 1);
            False: the lab's own pages with `kv_last_page_lens` (a variant SGLang does not run).
    """

    max_context: int = DEFAULT_MAX_CONTEXT
    token_pages: bool = True

    def __post_init__(self) -> None:
        checks.check_positive("max_context", self.max_context)
        if not isinstance(self.token_pages, bool):
            raise ValueError(f"token_pages: expected true or false, got {self.token_pages!r}")

    @property
    def max_num_partitions(self) -> int:
        """ceil(max_context / 256): the workspace's and the grid's partition count."""
        return -(-self.max_context // PARTITION_SIZE)

    @property
    def npar_loops(self) -> int:
        """The reduce kernel's compile-time loop count over 64-partition blocks."""
        return -(-self.max_num_partitions // WARP_SIZE)


_DEPLOYMENT: list[Deployment] = [Deployment()]


@contextlib.contextmanager
def deployment(max_context: int = DEFAULT_MAX_CONTEXT, token_pages: bool = True) -> Iterator[Deployment]:
    """Within the block, the `aiter` decode backend runs as a deployment of `max_context` tokens.

    Args:
        max_context: SGLang's context_len (max_num_partitions = ceil(max_context / 256)).
        token_pages: SGLang's token-level pages (True) or the lab's pages (False).

    Raises:
        ValueError: max_context < 1, or token_pages not a bool.
    """
    setting = Deployment(max_context, token_pages)
    _DEPLOYMENT.append(setting)
    try:
        yield setting
    finally:
        _DEPLOYMENT.pop()


def current_deployment() -> Deployment:
    """The innermost `deployment()` setting, or the default (context 40960, token-level pages)."""
    return _DEPLOYMENT[-1]


def kv_cache_string(fp8: bool) -> str:
    """SGLang's `_get_aiter_paged_ragged_kv_cache_dtype`: "fp8_e4m3" for an fp8 cache, else "auto"."""
    return "fp8_e4m3" if fp8 else "auto"


def variant(setting: Deployment, page_size: int, fp8: bool) -> str:
    """The launch's kernel instance, in words: partitions, npar loops, block size, KV string."""
    block = 1 if setting.token_pages else page_size
    return (
        f"P={setting.max_num_partitions} npar={setting.npar_loops} block={block} "
        f"kv={kv_cache_string(fp8)} part={PARTITION_SIZE}"
    )


@dataclass(frozen=True)
class PaRaggedRule:
    """The DispatchRule of `paged_attention_ragged` for a validated decode_attention call.

    Its variant and key are the deployment's kernel instance (`variant`): the same for every launch
    of a run, whatever the batch.
    """

    name: str = "aiter_pa_ragged"
    source: str = SOURCE

    def predict(self, args: Mapping[str, Any], request: int, env: RuleEnv) -> Predicted:
        """The kernel instance of the call `args`, seen from request `request` (any row: one variant)."""
        batch = args["q"].shape[0]
        if not isinstance(request, int) or isinstance(request, bool) or not 0 <= request < batch:
            raise ValueError(f"request: expected a row index in [0, {batch}), got {request!r}")
        setting = current_deployment()
        key = variant(setting, args["page_size"], args["k_cache"].element_size() == 1)
        reason = (
            f"max_num_partitions {setting.max_num_partitions} = ceil({setting.max_context} / {PARTITION_SIZE}), "
            "fixed per deployment; per-sequence work over absolute 256-token partitions, fixed-order merge "
            "(code reading, not measured)"
        )
        return Predicted(key, key, reason)

    def expect(self, alone_key: str, batched_key: str) -> str:
        """ "equal" for the same kernel instance (always, within one deployment), else "switch"."""
        return "equal" if alone_key == batched_key else "switch"


RULE = PaRaggedRule()
