"""Order-sensitive 64-bit hashes of request rows over a tensor's raw bits.

The definition (int64 arithmetic, wrapping mod 2^64; `>>>` is a logical shift):

    mix(z)      = splitmix64's finalizer: z ^= z >>> 30; z *= M1; z ^= z >>> 27; z *= M2; z ^= z >>> 31
    word w_rj   = element j of row r, its bits read as an integer of the element's size
                  (1-byte types zero-extended, 2/4-byte sign-extended, 8-byte as is)
    row value   R_r = sum_j mix(w_rj + (j + 1) * G)
    contribution c(r, p) = mix(R_r + salt + (p + 1) * S)
    hash of a request = sum of c(r, p) over its rows r, p = the row's position within the request

A row of a tensor [T, ...] is its trailing dims flattened; `salt` encodes the dtype and the trailing
shape, so equal bits in another dtype or shape hash differently. The whole-tensor hash
(`tensor_hash`) is the same sum over all rows with p = r.

Why it is order-sensitive: each element is mixed with its column before the sum and each row with
its position in the request before the next sum, so moving a value to another place changes what
is added. The sums are integer sums mod 2^64, which are exactly associative and commutative: any
reduction order (threads, atomics, index_add_) gives the same bits, so the hash itself cannot be
batch-variant, and a request's hash does not depend on the offset of its rows in a packed batch.
Raw bits are hashed, so -0.0 and 0.0 differ, and so do NaNs with different payloads.

The row stage reads every element; it has two implementations with identical bits: torch ops (any
device, the definition) and, for CUDA tensors, one fused Triton kernel per tensor (the torch ops
take about 15 launches, which dominates a launch-bound forward), or per batch of queued tensors
(a deferring HashSink: one launch, not one per tensor). The contributions touch one value
per row: a HashSink runs them for all the tensors it holds at once, when it is read. Nothing here
synchronises with the host until then.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gdn_lab.trace.layout import PADDED, UNALIGNED, Layout
from gdn_lab.trace.mixing import M1, M2, G, S  # the definition's constants (shared with triton_hash)

IMPLS = ("auto", "torch", "triton")

# int views by element size; 1-byte types (bool, uint8, fp8) read unsigned, wider ones signed.
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# dtypes the Triton row stage reads as they are, bitcasting each element to its word in the kernel
# (the integer view is a torch call per hashed tensor, a tenth of a recorder's host time per read)
_TRITON_AS_IS = frozenset(
    [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2,
     torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
)  # fmt: skip


def _srl(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix_(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer, in place on an int64 tensor."""
    z ^= _srl(z, 30)
    z *= M1
    z ^= _srl(z, 27)
    z *= M2
    z ^= _srl(z, 31)
    return z


@functools.lru_cache(maxsize=256)
def _salt(dtype: torch.dtype, trailing: tuple[int, ...]) -> int:
    digest = hashlib.blake2b(f"{dtype}|{trailing}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


@functools.lru_cache(maxsize=64)
def _column_steps(width: int, device: str) -> torch.Tensor:
    return torch.arange(1, width + 1, dtype=torch.int64, device=device) * G


@functools.lru_cache(maxsize=64)
def _arange(n: int, device: str) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int64, device=device)


def check_hashable(name: str, t: object) -> None:
    """Raise a ValueError naming `name` unless `t` is a strided tensor with data."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        raise ValueError(
            f"{name}: a {t.layout} tensor on {t.device}{' (quantized)' if t.is_quantized else ''} has no raw bits "
            "to hash; accepted: strided, non-quantized tensors with data"
        )


# (dtype, shape) -> (int view dtype, rows, words per row, salt, complex): what `_words` derives
# from the metadata alone, once per signature (a recorder hashes the same few shapes thousands of times).
_SIGNATURES: dict[tuple[torch.dtype, torch.Size], tuple[torch.dtype, int, int, int, bool]] = {}


def words_signature(dtype: torch.dtype, shape: torch.Size) -> tuple[torch.dtype, int, int, int, bool]:
    """(int view dtype, rows, words per row, salt, complex) of a tensor of this dtype and shape."""
    found = _SIGNATURES.get((dtype, shape))
    if found is None:
        cplx = dtype.is_complex
        size = dtype.itemsize // (2 if cplx else 1)
        r = shape[0] if shape else 1
        f = (math.prod(shape[1:]) if shape else 1) * (2 if cplx else 1)
        found = (_INT_VIEW[size], r, f, _salt(dtype, tuple(shape[1:])), cplx)
        if len(_SIGNATURES) >= 4096:
            _SIGNATURES.clear()
        _SIGNATURES[(dtype, shape)] = found
    return found


def _words(t: torch.Tensor, impl: str) -> tuple[torch.Tensor, int, int, int]:
    """(t's bits for `impl`'s row stage (`as_words`), rows R, words per row F, salt): rows along the
    leading dim (one row for 0-dim), row r's words its trailing dims in row-major order."""
    view, r, f, salt, cplx = words_signature(t.dtype, t.shape)
    return as_words(t, words_view(t.dtype, view, impl), cplx), r, f, salt


def words_view(dtype: torch.dtype, view: torch.dtype, impl: str) -> torch.dtype | None:
    """The integer dtype `impl`'s row stage reads a `dtype` tensor's bits as (`words_signature`'s
    view), or None where the Triton kernel reads the tensor as it is."""
    return None if impl == "triton" and dtype in _TRITON_AS_IS else view


def as_words(t: torch.Tensor, view: torch.dtype | None, cplx: bool) -> torch.Tensor:
    """t's bits for the row stage: a contiguous tensor of the integer dtype `view` (`words_view`),
    or for view None t itself, which the Triton kernel reads in place whatever its strides; `cplx`
    (`words_signature`): t is complex, read as its real view."""
    if view is None:
        return t
    if cplx:
        t = torch.view_as_real(t)
    if not t.is_contiguous():
        t = t.contiguous()
    return t.view(view)


def resolve_impl(impl: str, device: torch.device, name: str = "impl") -> str:
    """ "torch" or "triton" for `impl` ("auto": Triton on CUDA/ROCm devices when it runs there);
    errors name the parameter `name`."""
    if impl not in IMPLS:
        raise ValueError(f"{name}: {impl!r} is not accepted; expected one of {', '.join(map(repr, IMPLS))}")
    if impl == "torch":
        return impl
    from gdn_lab.device import triton_mode

    mode, reason = triton_mode(device)
    if impl == "triton":
        if mode is None:
            raise ValueError(f"{name}: 'triton' cannot run on {device}: {reason}")
        return impl
    return "triton" if mode == "gpu" else "torch"


@functools.cache
def _triton_hash() -> Any:
    # imported on first use (it imports triton); cached: the import statement costs a microsecond per hashed tensor
    from gdn_lab.trace import triton_hash

    return triton_hash


def row_values_many(items: list[tuple[torch.Tensor, int, int, torch.Tensor, int]]) -> None:
    """The Triton row stage of many tensors at once: each (words, r, f, out, offset) as
    `row_values(words, r, f, "triton", out, offset)` (`triton_hash.row_values_many`)."""
    _triton_hash().row_values_many(items)


def row_values(words: torch.Tensor, r: int, f: int, impl: str, out: torch.Tensor, offset: int = 0) -> None:
    """The row stage into out[offset : offset + r]: R_r = sum_j mix(w_rj + (j + 1) * G) of the
    words (`_words`: R rows of F; contiguous integers, or for "triton" a `_TRITON_AS_IS` tensor of
    any strides)."""
    if impl == "triton":
        _triton_hash().row_values_triton(words, r, f, out, offset)
        return
    # Promotes the words to int64 and adds each column's step in one op, into a new tensor (the
    # in-place mixing below must never reach the caller's int64 tensor).
    z = torch.add(words.reshape(r, f), _column_steps(f, str(words.device)))
    torch.sum(_mix_(z), dim=1, out=out[offset : offset + r])


def contributions(rows: torch.Tensor, salt: int | torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """c = mix(R + salt + (pos + 1) * S), elementwise over rows (salt a scalar or one per row)."""
    c = rows + salt
    c += (pos + 1) * S
    return _mix_(c)


def _rows_of(t: torch.Tensor, impl: str) -> tuple[torch.Tensor, int]:
    words, r, f, salt = _words(t, impl)
    rows = torch.zeros(r, dtype=torch.int64, device=t.device)  # zeros: the kernel may add
    if r:
        row_values(words, r, f, impl, rows)
    return rows, salt


def row_hashes(t: torch.Tensor, layout: Layout, *, impl: str = "auto") -> torch.Tensor:
    """One 64-bit order-sensitive hash per request, over the raw bits of its rows of `t`.

    Args:
        t: a tensor whose leading dim is the layout's token rows ([T, ...] packed, [N, ...] one row
            per request) or its number of requests ([N, ...]), or, in a padded layout, [N, T, ...]
            (the padding left out); any dtype (fp32, bf16, fp16, fp8,
            ints, bool, complex), any strides.
        layout: how the rows map to requests.
        impl: "auto" (one fused Triton kernel on CUDA/ROCm, torch ops elsewhere), "torch" or
            "triton" (also on the CPU under TRITON_INTERPRET=1); all give the same bits.

    Returns:
        int64 [N] on t's device, in `layout.request_ids` order (no host synchronisation).

    Raises:
        ValueError: t's leading dim matches neither the layout's rows nor its requests (hash it
            whole with `tensor_hash`), or t has no raw bits (sparse, quantized, meta).

    Example:
        >>> import torch
        >>> x = torch.arange(12.0).reshape(6, 2)
        >>> batch = row_hashes(x, Layout.packed([0, 2, 6], request_ids=[7, 8]))
        >>> alone = row_hashes(x[2:], Layout.packed([0, 4], request_ids=[8]))
        >>> bool(batch[1] == alone[0]), bool(batch[0] == batch[1])
        (True, False)
    """
    check_hashable("t", t)
    alignment = layout.alignment(t)
    if alignment == UNALIGNED:
        lead = t.shape[0] if t.dim() else "none (0-dim)"
        raise ValueError(
            f"t: leading dim {lead} matches neither the layout's rows ({layout.num_rows}) nor its requests "
            f"({layout.num_requests}); accepted: [{layout.num_rows}, ...] or [{layout.num_requests}, ...] "
            "(hash other tensors whole with tensor_hash)"
        )
    rows, salt = _rows_of(t.flatten(0, 1) if alignment == PADDED else t, resolve_impl(impl, t.device))
    seg, pos = layout.rows(alignment, t.device)
    c = contributions(rows, salt, pos)
    out = torch.zeros(layout.num_requests + 1, dtype=torch.int64, device=t.device)
    # padding rows (seg -1) go to a spare slot that is dropped
    out.index_add_(0, torch.where(seg >= 0, seg, layout.num_requests), c)
    return out[:-1]


def tensor_hash(t: torch.Tensor, *, impl: str = "auto") -> torch.Tensor:
    """The order-sensitive 64-bit hash of a whole tensor (its rows at positions 0, 1, 2, ...).

    Args:
        t: any strided tensor (0-dim included).
        impl: as `row_hashes`.

    Returns:
        A 0-dim int64 tensor on t's device.

    Example:
        >>> import torch
        >>> a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> bool(tensor_hash(a) == tensor_hash(a.clone())), bool(tensor_hash(a) == tensor_hash(a.flip(0)))
        (True, False)
    """
    check_hashable("t", t)
    rows, salt = _rows_of(t, resolve_impl(impl, t.device))
    return contributions(rows, salt, _arange(rows.shape[0], str(t.device))).sum()


@dataclass(eq=False, slots=True)
class RowsKind:
    """How a sink combines the row values of one kind of tensor: shared by every use of that kind.

    Attributes:
        arena: the device's arena its rows are read into.
        n: rows; salt: the salt of its dtype and trailing shape.
        seg, pos: per-request tables (row i to request slot seg[i] at position pos[i], negative seg
            dropped), or None for a tensor hashed whole only.
    """

    arena: _Arena
    n: int
    salt: int
    seg: torch.Tensor | None
    pos: torch.Tensor | None


class StaleReadError(RuntimeError):
    """Tensors whose deferred read found their version counter moved: written in place after
    they were hashed, by a call the reader did not see, so the bits they had are gone.

    Attributes:
        tags: what the reader tagged each of those reads with (`_Arena.read`).
    """

    def __init__(self, tags: list[Any], message: str | None = None) -> None:
        super().__init__(message or f"{len(tags)} tensor(s) written in place before their deferred read: {tags[:5]}")
        self.tags = tags


class _Arena:
    """One device's row values, filled chunk by chunk.

    A deferring arena (Triton row stage only) queues its reads and runs them at `flush`, many
    tensors per launch (`row_values_many`): a launch-bound forward pays a launch per hashed tensor
    otherwise, and each flush a table copy and a launch per tile shape. The queue holds each tensor
    alive until then, so its memory cannot be reused: it flushes itself at FLUSH_AT reads or
    FLUSH_BYTES bytes of their tensors (a view's base counted for the view, parameters too, so the
    memory it keeps from reuse is at most that plus one tensor). The reader must flush before
    anything may write a queued tensor in place, and a queued tensor whose version counter moved
    raises `StaleReadError` at the flush.
    """

    # Chunks double from FIRST to LAST rows: zeroing one 2^16-row chunk took 0.4 ms on the CPU,
    # per trace, a tenth of a small model's recording.
    FIRST, LAST = 1 << 10, 1 << 16
    # At 32 reads the HF Qwen3 of bench_trace.py flushed 21 times a forward, every time at the cap,
    # at 380 us of host time each on an H100's host (data/bench/h100/probe_trace_host_1569ad5.log),
    # of which its reads' own Python is about 60 us on the 2-core CPU VM: most of a flush is its
    # table copy and launches.
    FLUSH_AT = 256  # queued reads at most
    FLUSH_BYTES = 1 << 30  # bytes of queued tensors at most

    def __init__(
        self, device: torch.device, impl: str, defer: bool = False, describe: Callable[[list], str] | None = None
    ) -> None:
        self.device, self.impl = device, impl
        self.describe = describe  # tags -> the message of a StaleReadError
        self.chunks: list[torch.Tensor] = []
        self.start = 0  # arena row of the last chunk's first row
        self.fill = 0  # rows used in the last chunk
        self.capacity = 0  # rows of the last chunk
        self.n_read = 0  # row stages run
        self.n_flush = 0  # flushes that ran queued reads
        # queued reads: (words, n, f, chunk, row in it, version counter when queued or None, tag)
        self.queue: list[tuple] | None = [] if defer and impl == "triton" else None
        self.queued_bytes = 0  # of the queued reads' tensors

    def read(self, words: torch.Tensor, n: int, f: int, tag: Any = None) -> int:
        """The row stage of `words` (`_words`' tensor: n rows of f) into the arena, now or (deferring)
        at the next flush; returns the arena row of its first row. `tag` names the read in a
        `StaleReadError`."""
        if self.fill + n > self.capacity:
            # Zeros (the Triton row stage adds wide rows' column blocks into them); normal tensors
            # even inside inference_mode, so a later forward outside it can still write them.
            with torch.inference_mode(False):
                size = min(2 * self.capacity, self.LAST) if self.chunks else self.FIRST
                chunk = torch.zeros(max(n, size), dtype=torch.int64, device=self.device)
            self.start += self.capacity
            self.chunks.append(chunk)
            self.fill, self.capacity = 0, chunk.numel()
        queue = self.queue
        if n:
            if queue is None:
                row_values(words, n, f, self.impl, self.chunks[-1], self.fill)
            else:
                try:
                    version = words._version
                except RuntimeError:  # an inference tensor keeps no version counter
                    version = None
                queue.append((words, n, f, self.chunks[-1], self.fill, version, tag))
                held = words if words._base is None else words._base  # a view keeps its base alive
                self.queued_bytes += held.numel() * held.element_size()
        self.n_read += 1
        start = self.start + self.fill
        self.fill += n
        if queue is not None and (len(queue) >= self.FLUSH_AT or self.queued_bytes >= self.FLUSH_BYTES):
            self.flush()
        return start

    def flush(self) -> None:
        """Run the queued reads (a no-op when none are queued).

        Raises:
            StaleReadError: a queued tensor's version counter moved since it was queued (none run).
        """
        queue = self.queue
        if not queue:
            return
        self.queue, self.queued_bytes = [], 0
        stale = [tag for words, *_, version, tag in queue if version is not None and words._version != version]
        if stale:
            raise StaleReadError(stale, self.describe(stale) if self.describe else None)
        with torch._C.DisableTorchFunction():  # the launch's own torch calls reach no mode (a recorder's)
            row_values_many([item[:5] for item in queue])
        self.n_flush += 1


class HashSink:
    """Hashes many tensors into numbered slots; the sums stay on the devices until `read`.

    A tensor's row stage runs when it is read into its device's arena (one Triton launch on CUDA),
    or with `defer`, queued there until the next `flush` (many tensors per launch); each use of
    those rows is a row of four columns (`kinds`, `starts`, `bases`, `wholes`): the rows' kind,
    their first arena row, the first of its request slots (base + seg; -1: none) and its
    whole-tensor slot (-1: none). The same rows can be used many times (a tensor seen by
    several calls is read once). The position mixing and the per-request sums of every use run
    together, vectorised, when the sink is read. Slot 0 collects masked rows and is never read.
    Uses are columns, not an object each, because a recorder appends one per hashed tensor:
    thousands per forward, which the cyclic garbage collector would otherwise scan.
    """

    def __init__(self, impl: str = "auto", defer: bool = False) -> None:
        if impl not in IMPLS:
            raise ValueError(f"hash_impl: {impl!r} is not accepted; expected one of {', '.join(map(repr, IMPLS))}")
        self.impl = impl
        self.defer = defer  # Triton arenas queue their reads until `flush` (`_Arena`)
        self.describe: Callable[[list], str] | None = None  # a StaleReadError's message from its reads' tags
        self.n_slots = 1
        self.kinds: list[RowsKind] = []
        self.starts: list[int] = []
        self.bases: list[int] = []
        self.wholes: list[int] = []
        self._arenas: dict[torch.device, _Arena] = {}
        self._last: _Arena | None = None  # the arena used last
        self._read: tuple[tuple[int, int], np.ndarray] | None = None  # ((n_slots, n_tensors) when read, the hashes)

    @property
    def n_tensors(self) -> int:
        """Tensors added (uses of rows)."""
        return len(self.kinds)

    @property
    def n_read(self) -> int:
        """Row stages run or queued (tensors read from memory)."""
        return sum(a.n_read for a in self._arenas.values())

    @property
    def n_flush(self) -> int:
        """Flushes that ran queued reads (deferring arenas)."""
        return sum(a.n_flush for a in self._arenas.values())

    def flush(self) -> None:
        """Run every arena's queued reads (`_Arena.flush`)."""
        for arena in self._arenas.values():
            arena.flush()

    def queues_any(self, tensors: list[torch.Tensor]) -> bool:
        """Whether a queued read's tensor lies in the storage of one of `tensors`: a write to them
        could change its bits before it is read."""
        for arena in self._arenas.values():
            spans = [
                (storage.data_ptr(), storage.data_ptr() + storage.nbytes())
                for storage in (t.untyped_storage() for t in tensors if t.device == arena.device)
            ]
            if spans and arena.queue:
                for words, *_ in arena.queue:
                    ptr = words.data_ptr()
                    if any(lo <= ptr < hi for lo, hi in spans):
                        return True
        return False

    def slots(self, n: int) -> int:
        base = self.n_slots
        self.n_slots += n
        return base

    def impl_on(self, device: torch.device) -> str:
        """The row stage `device`'s tensors get. "triton" where Triton cannot run (a CPU tensor a
        GPU model makes, without TRITON_INTERPRET) is torch's there, which gives the same hashes:
        a side tensor must not fail a forward that is being recorded."""
        try:
            return resolve_impl(self.impl, device)
        except ValueError:  # self.impl was accepted when the sink was made: Triton cannot run here
            return "torch"

    def arena(self, device: torch.device) -> _Arena:
        """The arena of `device`, where its tensors' rows are read."""
        last = self._last
        if last is not None and last.device == device:  # one device per trace, most often
            return last
        arena = self._arenas.get(device)
        if arena is None:
            arena = self._arenas[device] = _Arena(device, self.impl_on(device), self.defer, self.describe)
        self._last = arena
        return arena

    def add(
        self,
        t: torch.Tensor,
        *,
        seg: torch.Tensor | None = None,
        pos: torch.Tensor | None = None,
        base: int = 0,
        whole_slot: int | None = None,
    ) -> None:
        """Read t (now, or at the next flush when the sink defers) and add it: its rows to slots
        base + seg (when seg is given; a negative seg drops the row), its whole hash to `whole_slot`
        (when given)."""
        arena = self.arena(t.device)
        words, n, f, salt = _words(t, arena.impl)
        start = arena.read(words, n, f)
        whole = -1 if whole_slot is None else whole_slot
        self.use(RowsKind(arena, n, salt, seg, pos), start, base if seg is not None else -1, whole)

    def use(self, kind: RowsKind, start: int, base: int, whole: int) -> None:
        """Use the rows of `kind` read at arena row `start`: into request slots base + seg (base -1:
        none) and the whole-tensor slot `whole` (-1: none)."""
        self.kinds.append(kind)
        self.starts.append(start)
        self.bases.append(base)
        self.wholes.append(whole)

    def read(self) -> np.ndarray:
        """Every slot's hash (int64 [n_slots]); one device-to-host copy per device, cached until the next add.
        Queued reads run first (`flush`)."""
        self.flush()
        state = (self.n_slots, self.n_tensors)  # what an add or a slot changes: derived, not kept at every add
        if self._read is None or self._read[0] != state:
            total = np.zeros(self.n_slots, dtype=np.int64)
            # torch functions off: a trace read inside a recording block (its own, at level="ops")
            # must not record the combine's torch calls
            with torch._C.DisableTorchFunction():
                for arena in self._arenas.values():
                    # Each slot is filled on one device; the others hold zeros there.
                    total += self._reduce(arena).cpu().numpy()
            self._read = (state, total)
        return self._read[1]

    def _reduce(self, arena: _Arena) -> torch.Tensor:
        """Every slot's sum on the arena's device: one vectorised combine over its uses.

        Uses are grouped by what their rows share: per-request uses by their (seg, pos) tables,
        whole-tensor uses by their row count. A group's rows are then one [uses, rows] gather with
        its per-use start, salt and slot broadcast along the rows, so the host handles one small
        table per use and nothing per row (a trace holds millions of rows on a GPU).
        """
        out = torch.zeros(self.n_slots, dtype=torch.int64, device=arena.device)
        groups: dict[Any, tuple[int, torch.Tensor | None, torch.Tensor | None, list[tuple[int, int, int]]]] = {}
        for kind, start, base, whole in zip(self.kinds, self.starts, self.bases, self.wholes):
            if kind.arena is not arena or not kind.n:
                continue
            if base >= 0:
                key = (id(kind.seg), id(kind.pos))  # the tables outlive the sink (held by kinds): ids stay unique
                group = groups.get(key)
                if group is None:
                    group = groups[key] = (kind.n, kind.seg, kind.pos, [])
                group[3].append((start, kind.salt, base))
            if whole >= 0:
                group = groups.get(kind.n)
                if group is None:
                    group = groups[kind.n] = (kind.n, None, None, [])
                group[3].append((start, kind.salt, whole))
        if not groups:
            return out
        # (start, salt, slot base) of every use, one host-to-device copy
        table = torch.from_numpy(np.array([u for g in groups.values() for u in g[3]], dtype=np.int64)).to(arena.device)
        chunks = arena.chunks
        rows = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
        parts, first = [], 0
        for n, seg, pos, uses in groups.values():
            t = table[first : first + len(uses)]
            first += len(uses)
            steps = _arange(n, str(arena.device))
            shape = (len(uses), n)
            if seg is None:  # whole-tensor hashes: rows at positions 0..n-1 into the use's slot
                pos, slot = steps.expand(shape), t[:, 2:3].expand(shape)
            else:  # slot 0 takes the masked rows (negative seg)
                pos, slot = pos.expand(shape), torch.where(seg >= 0, seg + t[:, 2:3], 0)
            parts.append((rows[t[:, 0:1] + steps], t[:, 1:2].expand(shape), pos, slot))
        values, salt, pos, idx = (torch.cat([p.reshape(-1) for p in x]) for x in zip(*parts))
        return out.index_add_(0, idx, contributions(values, salt, pos))
