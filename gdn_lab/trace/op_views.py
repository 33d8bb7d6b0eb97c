"""How a gdn_lab.ops call's arguments map to requests, read from the ops' public signatures.

A lab op reads a request's cached state through an address: a GDN state pool row `state[slots[i]]`,
a paged KV context through `kv_indptr`/`kv_indices`. Hashing such a pool whole would compare every
other request's state too, so a cache-reading op could never have "equal inputs". Instead:

- a pool is hashed as the rows its slots select, one per request (a negative slot is padding);
- a paged cache is hashed as each request's context tokens 0..seq_lens[i]-1, read through its pages;
- prefix sums (`cu_seqlens`, `qo_indptr`, `kv_indptr`) are compared as per-request lengths;
- addresses (`slots`, `kv_indices`, `cache_indices`) are physical placement and are not compared;
- pools updated in place are hashed again after the run, as outputs.

Everything else follows the layout's leading-dim rule.

`describe_call` keeps what a dispatch rule reads of a call (shapes, dtypes, the small index
tensors), for `record(..., keep_calls=True)`. An op not listed here (matmul, rms_norm, a new
op) uses that rule for every argument. When an op's batch is not the layout's (its request count
differs), its arguments are hashed by the leading-dim rule too.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class OpArgs:
    """The roles of one lab op's arguments (names as in its public signature).

    Attributes:
        pools: pool argument -> the argument holding each request's slot.
        paged: paged KV caches, read through kv_indptr, kv_indices, seq_lens and page_size.
        indptr: prefix sums over requests, compared as lengths.
        addresses: placement-only arguments, not compared.
        mutated: pools the op updates in place (hashed again after the run).
    """

    pools: Mapping[str, str] = field(default_factory=dict)
    paged: tuple[str, ...] = ()
    indptr: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    mutated: tuple[str, ...] = ()

    @functools.cached_property
    def needed(self) -> frozenset[str]:
        """The arguments these roles read: the op's signature must have them all."""
        needed = {*self.pools, *self.pools.values(), *self.paged, *self.indptr, *self.addresses}
        if self.paged:
            needed |= {"kv_indptr", "kv_indices", "seq_lens", "page_size"}
        return frozenset(needed)


OP_ARGS: dict[str, OpArgs] = {
    "decode_attention": OpArgs(paged=("k_cache", "v_cache"), indptr=("kv_indptr",), addresses=("kv_indices",)),
    "prefill_attention": OpArgs(
        paged=("k_cache", "v_cache"), indptr=("qo_indptr", "kv_indptr"), addresses=("kv_indices",)
    ),
    "gdn_decode": OpArgs(pools={"state": "slots"}, addresses=("slots",), mutated=("state",)),
    "gdn_prefill": OpArgs(pools={"state": "slots"}, indptr=("cu_seqlens",), addresses=("slots",), mutated=("state",)),
    "gdn_layer_prefill": OpArgs(
        pools={"conv_state": "cache_indices", "delta_state": "cache_indices"},
        indptr=("cu_seqlens",),
        addresses=("cache_indices",),
        mutated=("conv_state", "delta_state"),
    ),
    "causal_conv1d_update": OpArgs(pools={"conv_state": "slots"}, addresses=("slots",), mutated=("conv_state",)),
}


@dataclass(frozen=True)
class RowsView:
    """Rows to hash per request: rows[i] belongs to request seg[i] (negative: ignored) at position pos[i]."""

    rows: torch.Tensor
    seg: torch.Tensor
    pos: torch.Tensor


@functools.lru_cache(maxsize=256)
def _index(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(0..n-1, n zeros) as int64 on device: every view of an n-request batch uses them (read only),
    so that a view costs no launches to build them."""
    with torch.inference_mode(False):  # usable outside inference mode too
        return torch.arange(n, dtype=torch.int64, device=device), torch.zeros(n, dtype=torch.int64, device=device)


def slot_rows(slots: torch.Tensor) -> RowsView:
    """The pool rows `slots` address, as a RowsView of row numbers (padding, a negative slot, reads
    row 0 and is ignored): what `pool_view` reads through, shared by the pools of one address."""
    ar, zeros = _index(slots.shape[0], slots.device)
    return RowsView(slots.clamp(min=0).long(), torch.where(slots >= 0, ar, -1), zeros)


def pool_view(pool: torch.Tensor, slots: torch.Tensor | RowsView) -> RowsView:
    """Request i's row is pool[slots[i]]: [N, ...]; padding rows (negative slots) are ignored.
    `slots` may be given as its `slot_rows`, built once for several pools."""
    index = slots if isinstance(slots, RowsView) else slot_rows(slots)
    return RowsView(pool.index_select(0, index.rows), index.seg, index.pos)


def paged_view(
    cache: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, seq_lens: torch.Tensor, page_size: int
) -> RowsView:
    """Request i's rows are its context tokens [seq_lens[i], Hkv, D], read through its pages (no host sync)."""
    num_pages = kv_indices.shape[0]
    dev = kv_indices.device
    rows = cache.index_select(0, kv_indices.long()).reshape(num_pages * page_size, *cache.shape[2:])
    indptr = kv_indptr.long()
    page = torch.arange(num_pages, dtype=torch.int64, device=dev)
    owner = torch.searchsorted(indptr[1:], page, right=True)  # the request each page belongs to
    offset = torch.arange(page_size, dtype=torch.int64, device=dev)
    pos = ((page - indptr[owner])[:, None] * page_size + offset[None, :]).reshape(-1)
    seg = owner.repeat_interleave(page_size)
    return RowsView(rows, torch.where(pos < seq_lens.long()[seg], seg, -1), pos)


def lengths_view(indptr: torch.Tensor) -> RowsView:
    """Per-request lengths indptr[i+1] - indptr[i], one row per request."""
    ar, zeros = _index(indptr.shape[0] - 1, indptr.device)
    return RowsView(indptr[1:] - indptr[:-1], ar, zeros)


def _batch_size(op_args: OpArgs, args: Mapping[str, Any]) -> int | None:
    """The op's number of requests as its addressing arguments state it, or None for a plain op."""
    if op_args.pools:
        return args[next(iter(op_args.pools.values()))].shape[0]
    if op_args.paged:
        return args["seq_lens"].shape[0]
    if op_args.indptr:
        return args[op_args.indptr[0]].shape[0] - 1
    return None


def split_args(
    op: str, args: Mapping[str, Any], num_requests: int, *, after: bool = False
) -> tuple[list[tuple[str, RowsView]], list[tuple[str, Any]]]:
    """(per-request views, plain arguments) of one call.

    Args:
        op: the lab op's name.
        args: its validated keyword arguments (what the backend's `run` receives).
        num_requests: the layout's request count; views are built only for a batch of that size.
        after: return only the pools the op mutates (the state after the run).

    Returns:
        Views to hash per request by position in the op's batch, and the remaining arguments to hash
        by the layout's leading-dim rule (non-tensors are for the caller to skip).
    """
    op_args = OP_ARGS.get(op)
    if op_args is None:  # a plain op (most calls: matmul, rms_norm): every argument by the rule, none mutated
        return [], ([] if after else list(args.items()))
    if not op_args.needed <= args.keys():  # the op's signature changed: the table must follow it, never guess
        raise RuntimeError(
            f"gdn_lab.trace.op_views: {op} has no argument {', '.join(sorted(op_args.needed - args.keys()))} "
            f"(its arguments: {', '.join(args)}); update OP_ARGS to the op's public signature"
        )
    viewed = _batch_size(op_args, args) == num_requests
    views: list[tuple[str, RowsView]] = []
    plain: list[tuple[str, Any]] = []
    slots: dict[str, RowsView] = {}  # an address's slot_rows, once for all the pools it addresses
    for name, value in args.items():
        if after and name not in op_args.mutated:
            continue
        if name in op_args.addresses:
            continue
        if not viewed or not isinstance(value, torch.Tensor):
            plain.append((name, value))
        elif name in op_args.pools:
            address = op_args.pools[name]
            if address not in slots:
                slots[address] = slot_rows(args[address])
            views.append((name, pool_view(value, slots[address])))
        elif name in op_args.paged:
            views.append(
                (name, paged_view(value, args["kv_indptr"], args["kv_indices"], args["seq_lens"], args["page_size"]))
            )
        elif name in op_args.indptr:
            views.append((name, lengths_view(value)))
        else:
            plain.append((name, value))
    return views, plain


# Integer tensors up to this many elements (seq_lens, indptrs, page tables, slots) are kept whole by
# `describe_call`; larger or floating-point tensors keep only their shape, dtype and device.
SMALL_INDEX_NUMEL = 1 << 16


@dataclass(frozen=True)
class TensorMeta:
    """A tensor's shape, dtype, device and contiguity, standing in for it in a call description.

    Example:
        >>> m = TensorMeta.of(torch.zeros(3, 4, dtype=torch.float16))
        >>> m.shape[1], m.dtype, m.dim()
        (4, torch.float16, 2)
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    contiguous: bool = True

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorMeta:
        return cls(tuple(t.shape), t.dtype, t.device, t.is_contiguous())

    def is_contiguous(self) -> bool:
        return self.contiguous

    def dim(self) -> int:
        return len(self.shape)

    def size(self, dim: int | None = None) -> tuple[int, ...] | int:
        return self.shape if dim is None else self.shape[dim]

    def element_size(self) -> int:
        return self.dtype.itemsize


def describe_call(args: Mapping[str, Any]) -> dict[str, Any]:
    """A cheap description of a lab op's validated arguments, for its backend's dispatch rule.

    Integer and bool tensors of at most SMALL_INDEX_NUMEL elements are copied (on their device: no
    host synchronisation; in-place updates later do not reach the copy); other tensors become a
    `TensorMeta`; every other value is kept as is.

    Example:
        >>> d = describe_call({"q": torch.zeros(2, 4, 8), "seq_lens": torch.tensor([3, 5]), "page_size": 16})
        >>> d["q"].shape, d["seq_lens"].tolist(), d["page_size"]
        ((2, 4, 8), [3, 5], 16)
    """
    out: dict[str, Any] = {}
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            small_index = not (value.dtype.is_floating_point or value.dtype.is_complex)
            small_index = small_index and value.numel() <= SMALL_INDEX_NUMEL and value.layout == torch.strided
            out[name] = value.detach().clone() if small_index else TensorMeta.of(value)
        else:
            out[name] = value
    return out
