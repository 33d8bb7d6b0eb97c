"""record: hash the inputs and outputs of every call, per request, while a model runs.

Three kinds of call are recorded:

- `module`: every call of the given model's modules (any nn.Module), seen around torch's
  `_call_impl` of each (`_module_calls`), with kwargs. Inputs are hashed as the caller passed
  them, before the module's own hooks and forward run, and outputs after them, as the caller gets them.
- `function` (level="ops"): torch functions called while one of the model's modules runs, seen by
  a `TorchFunctionMode` (F.softplus, torch.matmul, Tensor.add_, Tensor.__setitem__, ...). Calls
  that return no tensor (shape, item) and pure aliases (view, reshape of contiguous, transpose,
  basic indexing) carry no new bits and are not recorded. In-place calls (a trailing underscore,
  `__setitem__`, `__i*__`, a torch.ops operator whose schema writes an argument, `out=`,
  `inplace=True`) are hashed before and after; other calls after, since they do not change their
  inputs.
- `lab_op` (level="ops"): every gdn_lab.ops call in the block, with the backend that ran, seen
  through `gdn_lab.routing.observe`; its cache arguments are hashed per request through their
  slots and page tables (`gdn_lab.trace.op_views`). Torch calls inside a lab op (its backend's
  internals, which loop per request in the references) are not recorded: the op is the unit, and
  its backend runs with the function mode stepped aside (`_Recorder.running`).

Why a TorchFunctionMode and not a TorchDispatchMode: it sees the call the model code wrote, under
that name, before CompositeImplicit ops decompose into aten pieces, so the culprit is reported as
`layers.1.mixer.F.softplus`, the line a user can change; the same call is recorded on every device
and with or without autograd. What it costs: one Python call per torch call in a module's forward
(1-3.5 us on a 2-core CPU VM, metadata getters included: `x.shape` takes 0.3 us plain and 3.1 us
through the mode), plus the hashing of recorded calls.
It does not see inside C++ composites (F.linear, SDPA); those calls are recorded as one.

Hashes are taken of the bits a tensor has at hook time, because in-place ops (a fused add-RMSNorm,
a cache write) overwrite what a saved reference would point at, and they stay on the device
(`HashSink`) until the trace is read. Hashing runs with torch functions disabled, so neither this
recorder nor an outer one records its own work.

At level="ops" with reuse on, the Triton row stage does not launch at each hashed tensor: the
reads queue (each holding its tensor, so its memory cannot be reused) and run in batches, one
launch per tile shape (`triton_hash.row_values_many`), because a launch per tensor is most of what
hashing costs a launch-bound forward. The queue is flushed before every write the recorder sees:
a call that writes in place by its name, its schema (a torch.ops operator: aten's, a custom op that
declares its writes), `out=` or `inplace=True`, inside the model or outside it; a lab op whose
state pools hold a queued read (lab ops write nothing else: tests/ops check every backend); 256
queued reads or 1 GiB of their tensors (what the queue keeps alive); reading the trace; the end of
the block. A queued tensor whose version counter moved all the same (written with torch functions
disabled, in a scripted or compiled function) fails the recording at the flush. A write with a raw
kernel moves no counter, and a tensor made under inference_mode has none: code that writes such
tensors unseen needs reuse=False, as it already does for the reuse below.

A tensor that reaches several calls unchanged (a module's output is the next module's input and
its parent's output) is read once: its rows are reused while torch shows it unchanged (the same
object, version counter, data pointer, shape and strides; for a view, the same base and place in
it, so a view made anew at each call, as a weight's `.t()`, is read once too). torch bumps the
version counter on every in-place op and custom op that declares its mutation, but not on a raw
Triton or CUDA kernel launched on an existing tensor, nor a write through `.data`; so a call's
outputs never reuse what was read when the call began (a module or lab op may write its inputs
with such a kernel), and `record(..., reuse=False)` reads every tensor at every call for code that
writes this way between calls. Tensors made under `torch.inference_mode` keep no version counter
at all, so they are read at every call that sees them (torch.no_grad keeps the reuse).

Known limits: state a module reads that is not in its arguments (a cache filled in an earlier step)
is invisible at level="modules"; at level="ops" the lab ops hash it through their slots. A shallow
copy of a module made inside the block (`copy.copy`, DataParallel's replicas) shares the module's
instance attributes, the recorder's `_call_impl` among them, so calling the copy runs the original
module: copy modules before the block (deep copies and pickles inside it are fine).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import itertools
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch.overrides import TorchFunctionMode, resolve_name

from gdn_lab import routing
from gdn_lab.checks import dtype_name
from gdn_lab.trace.hashing import HashSink, RowsKind, as_words, resolve_impl, words_signature, words_view
from gdn_lab.trace.layout import PADDED, UNALIGNED, Layout
from gdn_lab.trace.op_views import RowsView, describe_call, split_args

LEVELS = ("modules", "ops")
MODULE, FUNCTION, LAB_OP = "module", "function", "lab_op"
VIEW = "view"  # a TensorRecord read through a lab op's slots or page table

_INPLACE_DUNDERS = frozenset(
    [
        f"__i{op}__"
        for op in [
            "add",
            "sub",
            "mul",
            "truediv",
            "floordiv",
            "mod",
            "pow",
            "and",
            "or",
            "xor",
            "lshift",
            "rshift",
            "matmul",
        ]
    ]
    + ["__setitem__"]
)
_PREFIXES = (("torch.nn.functional.", "F."), ("torch.Tensor.", "Tensor."))
# Tensor metadata reads: no tensor comes out, so the function mode passes them straight on (they
# are most of the torch calls a forward makes: every op's validation reads shapes and dtypes).
_METADATA = frozenset(
    [
        getattr(torch.Tensor, name).__get__
        for name in ("shape", "dtype", "device", "ndim", "layout", "requires_grad", "is_cuda", "is_leaf",
                     "is_quantized", "is_meta", "is_sparse", "_version", "itemsize", "nbytes")
    ]
    + [
        getattr(torch.Tensor, name)
        for name in ("dim", "size", "stride", "numel", "data_ptr", "element_size", "is_contiguous", "is_complex",
                     "is_floating_point", "storage_offset", "get_device", "__len__")
    ]
)  # fmt: skip
# Results that are never a tensor or a container of one.
_PLAIN = frozenset([type(None), bool, int, float, complex, str, torch.Size, torch.dtype, torch.device, torch.layout])
_SEEN_MIN = 4096  # reads a trace keeps before it first drops those of freed tensors


@dataclass(eq=False, slots=True)  # not frozen: a frozen init costs 7x more, and one is built per hashed tensor
class TensorRecord:
    """One hashed tensor of a call.

    Attributes:
        path: where it sat: "args[0]", "kwargs['mask']", "out[1]", or a lab op's argument name.
        shape: its shape; dtype: its dtype name.
        alignment: "tokens", "requests" or "unaligned" (the layout's leading-dim rule), or "view" (a
            lab op's cache read through its slots or page table).
        layout: the layout it was hashed with.
    """

    path: str
    shape: tuple[int, ...]
    dtype: str
    alignment: str
    layout: Layout
    base: int  # first per-request slot in the trace's HashSink, -1 if none
    whole: int  # whole-tensor slot, -1 if none


@dataclass(eq=False, slots=True)
class _Kind(RowsKind):
    """How a trace hashes tensors of one (layout, dtype, shape, device), derived once
    (`Trace._kind`), or one lab op's view; its sink's rows kind, and what its TensorRecords show."""

    alignment: str
    dims: tuple[int, ...]
    dtype: str  # its name
    flatten: bool  # a padded layout's [N, T, ...]: rows are its N * T positions
    cplx: bool  # complex: hashed as its real view
    view: torch.dtype | None  # the integer view its words are read as (None: as it is, `words_view`)
    f: int  # words per row
    slots: int  # sink slots per use: the whole hash, then one per request when seg is given (a view: one per request)
    as_is: bool  # the row stage reads the tensor itself (no integer view, no flattening: `as_words` would return it)


@dataclass(eq=False, slots=True)
class Entry:
    """One recorded call.

    Attributes:
        index: position in execution order (when the call began).
        step: the trace step it ran in (`Trace.set_layout`).
        name: qualified name: the module path (the root module is its class name); for functions
            and lab ops, the enclosing module's name + "." + the function ("F.softplus") or op.
        kind: "module", "function" or "lab_op".
        op: the module's class, the function's name or the lab op.
        call_index: how many calls of this name came before it in this step.
        module: the module path (modules) or the enclosing module path ("" outside the model).
        parent: index of the enclosing recorded call (module or lab op), None at the top.
        backend: the backend that ran (lab ops), else None.
        inputs, outputs: the hashed tensors.
        error: the call raised (its outputs are missing).
        call: lab ops recorded with `keep_calls=True`: a cheap description of the call's validated
            arguments (`gdn_lab.trace.op_views.describe_call`: shapes, small index tensors, the
            other values), what a dispatch rule needs to predict the launch; else None.
    """

    index: int
    step: int
    name: str
    kind: str
    op: str
    call_index: int
    module: str
    parent: int | None
    backend: str | None
    layout: Layout
    inputs: list[TensorRecord] = field(default_factory=list)
    outputs: list[TensorRecord] = field(default_factory=list)
    error: bool = False
    call: dict[str, Any] | None = None


class Trace:
    """The calls recorded by `record`, with per-request hashes of their inputs and outputs.

    The layout can change between forward calls (a prefill, then decode steps with one row per
    request): `set_layout` or `with trace.step(layout):`. Each layout change starts a step; entries
    are matched between traces by (step, name, call_index).
    """

    def __init__(self, level: str, layout: Layout, sink: HashSink, reuse: bool = True) -> None:
        self.level = level
        self._reuse = reuse
        # id, or for a view (its base's id, pointer, shape, strides) -> (call index when read, weakref
        # to the tensor or the view's base, layout, version, pointer, shape, strides, dtype, kind, arena row)
        self._seen: dict[int, tuple] = {}
        self._prune_at = _SEEN_MIN  # `_prune_seen` when the table grows past this
        self._layout = layout
        self._step = 0
        self._steps = [0]
        self._sink = sink
        # The calls as columns, not an Entry each: a forward records thousands, and objects kept
        # that long are what the cyclic collector scans when the block ends (`Trace.entries` builds
        # the Entries). One tuple per call: (step, name, kind, op, call_index, module, parent,
        # backend, layout, first and end index of its inputs among the hashed tensors, the call's
        # description); its outputs' range when it returned (None until then); the calls that
        # raised. A hashed tensor is a use of the sink (its kind, arena row and slots) with its
        # path here, at the same index.
        self._calls: list[tuple] = []
        sink.describe = functools.partial(_stale_reads, self._calls)  # a queued read's tag -> its call
        self._outs: list[tuple[int, int] | None] = []
        self._errors: set[int] = set()
        self._paths: list[str] = []
        self._built: tuple[tuple[int, ...], list[Entry]] | None = None
        self._counts: dict[tuple[int, str], int] = {}
        self._kinds: dict[tuple[Layout, torch.dtype, torch.Size, torch.device], _Kind] = {}

    @property
    def layout(self) -> Layout:
        """The layout calls are hashed with now."""
        return self._layout

    @property
    def current_step(self) -> int:
        return self._step

    @property
    def steps(self) -> list[int]:
        """Step labels in the order they were first set."""
        return list(self._steps)

    @property
    def n_tensors(self) -> int:
        """How many tensors were hashed (one per call that saw them)."""
        return self._sink.n_tensors

    @property
    def n_read(self) -> int:
        """How many of them were read from memory (the others reused an earlier call's read)."""
        return self._sink.n_read

    @property
    def n_flush(self) -> int:
        """How many batches those reads ran in, when they were queued (level="ops" with reuse, on
        the Triton row stage: one launch per tile shape each); 0 when each ran at its call."""
        return self._sink.n_flush

    def set_layout(self, layout: Layout, step: int | None = None) -> None:
        """Hash the following calls with `layout`, as step `step` (default: the current step + 1).

        Raises:
            ValueError: layout is not a Layout, or step is not an int.
        """
        if not isinstance(layout, Layout):
            raise ValueError(f"layout: expected a gdn_lab.trace.Layout, got {type(layout).__name__}")
        if step is None:
            step = self._step + 1
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"step: expected an int label, got {step!r}")
        self._layout, self._step = layout, step
        if step not in self._steps:
            self._steps.append(step)

    @contextlib.contextmanager
    def step(self, layout: Layout, step: int | None = None) -> Iterator[Trace]:
        """Within the block, calls are hashed with `layout` as step `step`; the previous layout and
        step come back on exit."""
        previous = self._layout, self._step
        self.set_layout(layout, step)
        try:
            yield self
        finally:
            self._layout, self._step = previous

    @property
    def entries(self) -> list[Entry]:
        """Every recorded call in execution order (reading the hashes: one device-to-host copy)."""
        self._sink.read()
        return list(self._entries)

    @property
    def _entries(self) -> list[Entry]:
        """The Entries of the calls recorded so far, built once per state of the trace."""
        # What a recorded call changes (a call returning without outputs adds an empty range: the
        # same Entry either way)
        state = (len(self._calls), len(self._paths), len(self._errors))
        if self._built is None or self._built[0] != state:
            sink, paths = self._sink, self._paths

            def records(lo: int, hi: int, layout: Layout) -> list[TensorRecord]:
                return [
                    TensorRecord(path, kind.dims, kind.dtype, kind.alignment, layout, base, whole)
                    for path, kind, base, whole in zip(
                        paths[lo:hi], sink.kinds[lo:hi], sink.bases[lo:hi], sink.wholes[lo:hi]
                    )
                ]

            built = []
            for index, (call, out) in enumerate(zip(self._calls, self._outs)):
                step, name, kind, op, call_index, module, parent, backend, layout, lo, hi, described = call
                entry = Entry(index, step, name, kind, op, call_index, module, parent, backend, layout,
                              records(lo, hi, layout), records(*out, layout) if out else [], index in self._errors,
                              described)  # fmt: skip
                built.append(entry)
            self._built = (state, built)
        return self._built[1]

    def __len__(self) -> int:
        return len(self._calls)

    def hash_of(self, record: TensorRecord, request_id: int | str) -> int | None:
        """The request's hash of `record` (its rows), or None if the tensor is unaligned or the
        request is not in the layout it was hashed with."""
        if record.base < 0 or request_id not in record.layout:
            return None
        return int(self._sink.read()[record.base + record.layout.index(request_id)])

    def whole_hash_of(self, record: TensorRecord) -> int | None:
        """The whole-tensor hash of `record`, or None for a lab op's per-request view."""
        return None if record.whole < 0 else int(self._sink.read()[record.whole])

    def to_frame(self) -> pd.DataFrame:
        """One row per entry: index, step, name, kind, op, call_index, module, parent, backend,
        n_inputs, n_outputs, error."""
        return pd.DataFrame(
            [
                {
                    "index": e.index, "step": e.step, "name": e.name, "kind": e.kind, "op": e.op,
                    "call_index": e.call_index, "module": e.module, "parent": e.parent, "backend": e.backend,
                    "n_inputs": len(e.inputs), "n_outputs": len(e.outputs), "error": e.error,
                }
                for e in self._entries
            ],
            columns=["index", "step", "name", "kind", "op", "call_index", "module", "parent", "backend",
                     "n_inputs", "n_outputs", "error"],
        )  # fmt: skip

    # -- recording (used by the recorder) --

    def _open(
        self, kind: str, name: str, op: str, module: str, parent: int | None, backend: str | None, lo: int,
        described: dict[str, Any] | None = None,
    ) -> int:  # fmt: skip
        """Record a call whose inputs are the hashed tensors from `lo` on; returns its index."""
        step = self._step
        key = (step, name)
        call_index = self._counts.get(key, 0)
        self._counts[key] = call_index + 1
        self._calls.append(
            (step, name, kind, op, call_index, module, parent, backend, self._layout, lo, len(self._paths), described)
        )
        self._outs.append(None)
        return len(self._calls) - 1

    def _kind(self, layout: Layout, dtype: torch.dtype, shape: torch.Size, device: torch.device) -> _Kind:
        """What hashing a tensor of this dtype, shape and device under `layout` takes, derived once
        per trace (`_hash` looks it up in `_kinds` first: a forward hashes the same few signatures
        thousands of times)."""
        alignment = layout.alignment_of(shape)
        flatten = alignment == PADDED
        rows_shape = torch.Size([shape[0] * shape[1], *shape[2:]]) if flatten else shape
        view, n, f, salt, cplx = words_signature(dtype, rows_shape)
        seg, pos = (None, None) if alignment == UNALIGNED else layout.rows(alignment, device)
        arena = self._sink.arena(device)
        words = words_view(dtype, view, arena.impl)
        kind = _Kind(arena, n, salt, seg, pos, alignment, tuple(shape), dtype_name(dtype), flatten, cplx, words, f,
                     1 if seg is None else 1 + layout.num_requests, words is None and not flatten and not cplx)  # fmt: skip
        self._kinds[(layout, dtype, shape, device)] = kind
        return kind

    def _hash(self, items: Iterable[tuple[str, torch.Tensor]], layout: Layout, since: int = -1, at: int = -1) -> None:
        """Hash each tensor, as call `at` (-1: the last call recorded). With reuse on, a tensor read by
        a call that began after call `since` is not read again if torch shows it unchanged (the same
        object, or for a view the same base, version counter, data pointer, shape, strides and
        dtype) and the layout does not flatten it otherwise than when it was read."""
        sink, paths, kinds = self._sink, self._paths, self._kinds
        seen, reuse = self._seen, self._reuse
        uses, starts, bases, wholes = sink.kinds, sink.starts, sink.bases, sink.wholes
        if at < 0:
            at = len(self._calls) - 1
        for path, t in items:
            hit = None
            try:
                version = t._version if reuse else None
            except RuntimeError:  # an inference tensor keeps no version counter: read at every call
                version = None
            # what torch shows of t, read once (each read is a C call)
            shape, dtype = t.shape, t.dtype
            if version is not None:
                ptr, stride, base = t.data_ptr(), t.stride(), t._base
                # A view is kept under its base (which holds its storage and version counter) and its
                # place in it: a view made anew at every call (a weight's .t()) is read once.
                owner, key = (t, id(t)) if base is None else (base, (id(base), ptr, shape, stride))
                hit = seen.get(key)
            # A reuse hit first: under the layout it was read with, it holds its kind (no lookup).
            if (
                hit is not None
                and hit[0] > since
                and hit[3] == version
                and hit[4] == ptr
                and hit[5] == shape
                and hit[6] == stride
                and hit[7] is dtype
                and hit[1]() is owner
            ):
                start = hit[9]
                kind = hit[8] if hit[2] is layout else None
            else:
                hit, kind, start = None, None, -1
            if kind is None:
                device = t.device
                kind = kinds.get((layout, dtype, shape, device)) or self._kind(layout, dtype, shape, device)
                if hit is not None and kind.flatten != hit[8].flatten:  # rows follow no layout unless it flattens them
                    start = -1
            if start < 0:
                # the row stage now, into its device's arena (most kinds read the tensor as it is)
                words = t if kind.as_is else as_words(t.flatten(0, 1) if kind.flatten else t, kind.view, kind.cplx)
                start = kind.arena.read(words, kind.n, kind.f, (at, path))
                if version is not None:
                    seen[key] = (at, weakref.ref(owner), layout, version, ptr, shape, stride, dtype, kind, start)
                    if len(seen) > self._prune_at:
                        self._prune_seen()
            # the sink's use of these rows (`HashSink.use`, inlined: this runs per hashed tensor)
            whole = sink.n_slots
            sink.n_slots = whole + kind.slots
            uses.append(kind)
            starts.append(start)
            bases.append(-1 if kind.seg is None else whole + 1)
            wholes.append(whole)
            paths.append(path)

    def _prune_seen(self) -> None:
        """Drop the reads of tensors that are gone: a decode loop reads thousands of tensors per
        step, and their entries would otherwise outlive them for the whole trace. The next prune
        waits until the table has doubled, so each read pays for it once."""
        seen = self._seen
        for key in [key for key, hit in seen.items() if hit[1]() is None]:
            del seen[key]
        self._prune_at = max(_SEEN_MIN, 2 * len(seen))

    def _hash_views(self, items: Iterable[tuple[str, RowsView]], layout: Layout, at: int) -> None:
        sink = self._sink
        for path, v in items:
            t = v.rows
            arena = sink.arena(t.device)
            view, n, f, salt, cplx = words_signature(t.dtype, t.shape)
            words = words_view(t.dtype, view, arena.impl)
            kind = _Kind(arena, n, salt, v.seg, v.pos, VIEW, tuple(t.shape), dtype_name(t.dtype), False, cplx, words, f,
                         layout.num_requests, words is None and not cplx)  # fmt: skip
            start = arena.read(as_words(t, words, cplx), n, f, (at, path))
            sink.use(kind, start, sink.slots(kind.slots), -1)
            self._paths.append(path)


def _hashable(t: torch.Tensor) -> bool:
    # is_meta, not device.type: building the device object costs more than the rest of the check
    return t.layout is torch.strided and not t.is_quantized and not t.is_meta


def _tensors(obj: Any, path: str) -> list[tuple[str, torch.Tensor]]:
    """Tensors nested in tuples, lists and dicts, with their paths; other containers are opaque."""
    kind = type(obj)
    if kind is torch.Tensor:  # the common cases first: this runs at every hook
        return [(path, obj)] if _hashable(obj) else []
    if kind in _PLAIN:
        return []
    found: list[tuple[str, torch.Tensor]] = []
    if kind is tuple:  # a module's args, a multi-output function: their first level here
        for i, x in enumerate(obj):
            if type(x) is torch.Tensor:
                if _hashable(x):
                    found.append((f"{path}[{i}]", x))
            elif type(x) not in _PLAIN:
                _collect(x, f"{path}[{i}]", found)
    elif kind is not dict or obj:
        _collect(obj, path, found)
    return found


def _collect(obj: Any, path: str, found: list[tuple[str, torch.Tensor]]) -> None:
    # Exact types are tested before isinstance: an ABC check (Mapping) costs a microsecond, and
    # most values in a module's kwargs are None, bools and ints.
    kind = type(obj)
    if kind in _PLAIN:
        return
    if kind is torch.Tensor or isinstance(obj, torch.Tensor):
        if _hashable(obj):
            found.append((path, obj))
    elif kind is tuple or kind is list or isinstance(obj, (tuple, list)):
        for i, x in enumerate(obj):
            if type(x) not in _PLAIN:
                _collect(x, f"{path}[{i}]", found)
    elif kind is dict or isinstance(obj, Mapping):
        for k, x in obj.items():
            if type(x) not in _PLAIN:
                _collect(x, f"{path}[{k!r}]", found)


_INFO: dict[Any, tuple[str, bool, tuple[tuple[int, str], ...]]] = {}


def _function_info(func: Any) -> tuple[str, bool, tuple[tuple[int, str], ...]]:
    """(the name a function is recorded under, whether it writes in place, the (position, name) of
    each argument its schema declares written). A call writes in place by its name (a trailing
    underscore, `__setitem__`, `__i*__`) or, for a torch.ops operator (aten's, a custom op's), by
    its schema; `out=` and `inplace=True` are the call's, not the function's (`_writes`)."""
    info = _INFO.get(func)
    if info is None:
        name = resolve_name(func) or f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', repr(func))}"
        for long, short in _PREFIXES:
            if name.startswith(long):
                name = short + name[len(long) :]
                break
        base = name.rsplit(".", 1)[-1]
        written = _written(func)
        inplace = (base.endswith("_") and not base.endswith("__")) or base in _INPLACE_DUNDERS or bool(written)
        info = _INFO[func] = (name, inplace, written)
    return info


def _written(func: Any) -> tuple[tuple[int, str], ...]:
    """The arguments a torch.ops operator's schema marks written (`Tensor(a!)`); a packet's (an
    operator called without its overload), those of its first overload that writes."""
    if isinstance(func, torch._ops.OpOverloadPacket):
        schemas = [getattr(func, overload)._schema for overload in func.overloads()]
    elif isinstance(func, torch._ops.OpOverload):
        schemas = [func._schema]
    else:
        return ()
    for schema in schemas:
        written = tuple(
            (i, a.name) for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write
        )
        if written:
            return written
    return ()


def _states(op: str) -> tuple[str, ...] | None:
    """The arguments a lab op writes in place: its registered state pools (`OpSpec.states`; the
    contract every backend keeps, checked in tests/ops/test_call_forms.py), or None for a routed op
    with no spec, whose writes are unknown."""
    from gdn_lab.ops import spec

    try:
        return spec.get(op).states
    except ValueError:  # not a registered op
        return None


def _stale_reads(calls: list[tuple], tags: list[tuple[int, str]]) -> str:
    """What a trace's StaleReadError says: the first tensor written before its queued read, by its
    path and call (`tags`: (call index, path) of each), and what to do."""
    index, path = tags[0]
    return (
        f"record: {path} of call {index} ({calls[index][1]}) was written in place before its queued read "
        f"({len(tags)} tensor(s) in all): its version counter moved in a call the recorder does not see (code run "
        "with torch functions disabled, a scripted or compiled function, a custom op that does not declare the "
        "write). Record with reuse=False: every tensor is then read at its call"
    )


def _writes(inplace: bool, kwargs: dict | None) -> bool:
    """Whether a call may write a tensor it is given: a function that writes in place
    (`_function_info`), or one called with `out=` or `inplace=True`."""
    return inplace or bool(kwargs) and (kwargs.get("out") is not None or kwargs.get("inplace") is True)


def _aliases(outputs: list[tuple[str, torch.Tensor]], inputs: list[tuple[str, torch.Tensor]]) -> bool:
    """Every output is an input or a view of one (a view's `_base` is the first tensor of its
    chain): no new bits. (Storage shared any other way, as detach() shares it, counts as new:
    those calls are recorded, which costs a hash, never a miss.)"""
    roots = set()
    for _, t in inputs:
        base = t._base
        roots.add(id(t) if base is None else id(base))
    for _, t in outputs:
        base = t._base
        if (id(t) if base is None else id(base)) not in roots and not (
            t.is_inference() and _in_storage_of(t, (x for _, x in inputs))
        ):
            return False
    return True


def _in_storage_of(t: torch.Tensor, roots: Iterable[torch.Tensor]) -> bool:
    """t lies in the storage of one of `roots`. torch keeps no `_base` for a view of an inference
    tensor (made under inference_mode), so only the storage shows it; checked last, for inference
    tensors only: it builds a storage object per tensor."""
    ptr = t.untyped_storage().data_ptr()
    return any(r.untyped_storage().data_ptr() == ptr for r in roots)


def _views_of_first(outputs: list[tuple[str, torch.Tensor]], args: tuple) -> bool:
    """Every output is args[0] or a view of its root: what `_aliases` finds for most aliases (view,
    transpose, getitem), found without flattening the call's inputs (a third of a forward's calls)."""
    first = args[0] if args else None
    if type(first) is not torch.Tensor or not _hashable(first):
        return False
    base = first._base
    root = first if base is None else base
    for _, t in outputs:
        base = t._base
        if (t if base is None else base) is not root and not (t.is_inference() and _in_storage_of(t, (root,))):
            return False
    return True


_DisableTorchFunction = torch._C.DisableTorchFunction
_is_grad_enabled = torch._C.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled


class _QuietGrad:
    """`_quiet` while grad mode is on: torch functions off, then grad mode off, restored in reverse."""

    __slots__ = ("_off",)

    def __enter__(self) -> None:
        # torch functions off first: the grad-mode calls would reach the mode too
        self._off = _DisableTorchFunction()
        self._off.__enter__()
        _set_grad_enabled(False)

    def __exit__(self, *exc: object) -> None:
        _set_grad_enabled(True)
        self._off.__exit__(*exc)


def _quiet() -> contextlib.AbstractContextManager[Any]:
    """The recorder's own torch calls must not reach any TorchFunctionMode (ours would record them)
    nor build autograd graphs. It runs at every hook: under inference (grad mode off) it is torch's
    C guard alone, a third of the cost of a Python context manager."""
    return _QuietGrad() if _is_grad_enabled() else _DisableTorchFunction()


class _ModeAside:
    """torch's `_pop_mode_temporarily` without a generator: the function mode on top off the stack
    inside the block, back on exit (the generator context manager took 1.1 us per lab op on the CPU VM, this 0.3)."""

    __slots__ = ("_mode",)

    def __enter__(self) -> None:
        self._mode = torch._C._pop_torch_function_stack()

    def __exit__(self, *exc: object) -> None:
        torch._C._push_on_torch_function_stack(self._mode)


@dataclass(slots=True)
class _Frame:
    index: int  # the call's index in the trace
    kind: str
    key: Any  # the module object, or the lab op's name
    module: str  # the module path (modules) or the enclosing module's
    layout: Layout  # the layout its inputs were hashed with


class _Recorder:
    """The module wrappers' calls, the function mode and the lab-op observer of one `record` block."""

    def __init__(
        self, root: str, modules: list[tuple[str, torch.nn.Module]], trace: Trace, keep_calls: bool = False
    ) -> None:
        self.trace = trace
        self.keep_calls = keep_calls
        self.root = root  # the model's class name: its own calls' name
        self.modules = modules  # (path, module) of the model's modules when the block began
        self.closed = False
        self.frames: list[_Frame] = []
        self.module_depth = 0
        self.labop_depth = 0
        self.mode: _FunctionMode | None = None  # level="ops": the function mode, while the block runs
        self.defer = trace._sink.defer  # reads wait for a flush (`record`)

    def label(self, path: str) -> str:
        return path or self.root

    def _enclosing(self) -> tuple[str, int | None]:
        """(enclosing module path, parent call index) for a call starting now."""
        frames = self.frames
        if not frames:
            return "", None
        top = frames[-1]
        if top.kind == MODULE:  # most often: a call in a module's own forward
            return top.module, top.index
        for f in reversed(frames):
            if f.kind == MODULE:
                return f.module, top.index
        return "", top.index

    def _push(self, frame: _Frame) -> None:
        self.frames.append(frame)
        self.module_depth += frame.kind == MODULE
        self.labop_depth += frame.kind == LAB_OP

    def _pop_to(self, kind: str, key: Any) -> _Frame | None:
        """Pop the top-most frame of (kind, key) and every frame above it (calls that raised)."""
        frames = self.frames
        if frames and frames[-1].key is key and frames[-1].kind == kind:  # the call on top returns: most often
            self.module_depth -= kind == MODULE
            self.labop_depth -= kind == LAB_OP
            return frames.pop()
        for i in range(len(frames) - 1, -1, -1):
            f = frames[i]
            if f.kind == kind and (f.key is key or f.key == key):
                for g in frames[i:]:
                    self.module_depth -= g.kind == MODULE
                    self.labop_depth -= g.kind == LAB_OP
                self.trace._errors.update(g.index for g in frames[i + 1 :])
                del frames[i:]
                return f
        return None

    def close(self) -> None:
        self.closed = True
        self.trace._errors.update(f.index for f in self.frames)
        self.frames.clear()
        self.module_depth = self.labop_depth = 0
        # The function mode holds this recorder: a cycle that would keep the trace (its tables,
        # its device arenas) alive until the cyclic collector runs, instead of until its last use.
        self.mode = None

    # -- modules --

    def module_call(self, module: torch.nn.Module, path: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        """One call of a model's module (`_module_calls`): its inputs hashed before `call` (torch's
        call: the module's hooks and forward) runs, its outputs after; an exception marks the call
        and goes on."""
        if self.closed:  # another wrapper, set on top of ours during the block, outlived it
            return call(*args, **kwargs)
        tr = self.trace
        frames = self.frames
        parent = frames[-1].index if frames else None
        layout, lo, index = tr._layout, len(tr._paths), len(tr._calls)
        with _quiet():  # also around the flattening: tensor attribute reads go through torch functions
            items = _tensors(args, "args")
            if kwargs:
                items += _tensors(kwargs, "kwargs")
            tr._hash(items, layout, -1, index)
        tr._open(MODULE, path or self.root, type(module).__name__, path, parent, None, lo)
        self._push(_Frame(index, MODULE, module, path, layout))
        try:
            output = call(*args, **kwargs)
        except BaseException:
            if self._pop_to(MODULE, module) is not None:
                tr._errors.add(index)
            raise
        if self._pop_to(MODULE, module) is not None:  # None: the block closed while it ran
            lo = len(tr._paths)
            with _quiet():
                # since: the module may have written its inputs in place, unseen by their version counters
                tr._hash(_tensors(output, "out"), layout, index)
            tr._outs[index] = (lo, len(tr._paths))
        return output

    # -- lab ops (routing.observe) --

    def running(self, op: str) -> contextlib.AbstractContextManager[Any]:
        """The lab op's backend runs with this recorder's function mode off the mode stack, where
        it is on top: its internals are never recorded, and each of their torch calls (hundreds in
        a torch reference, dozens of metadata reads in a Triton wrapper and its launcher) would
        otherwise pay a Python call into the mode (1-3 us on the CPU). A mode entered later (on
        top) stays, and so does ours beneath it: `labop_depth` passes those calls by."""
        if self.mode is None or torch.overrides._get_current_function_mode() is not self.mode:
            return contextlib.nullcontext()
        return _ModeAside()

    def before(self, op: str, decision: routing.Decision, args: Mapping[str, Any]) -> None:
        module, parent = self._enclosing()
        tr = self.trace
        name = f"{self.label(module)}.{op}" if self.frames else op
        layout, lo, index = tr._layout, len(tr._paths), len(tr._calls)
        with _quiet():
            described = describe_call(args) if self.keep_calls else None
            views, plain = split_args(op, args, layout.num_requests)
            tr._hash_views(views, layout, index)
            tr._hash([item for p, v in plain for item in _tensors(v, p)], layout, -1, index)
            if self.defer:  # its kernels write its state pools, unseen by version counters
                states = _states(op)
                if states is None or tr._sink.queues_any(
                    [t for name in states if isinstance(t := args.get(name), torch.Tensor)]
                ):
                    tr._sink.flush()
        tr._open(LAB_OP, name, op, module, parent, decision.name, lo, described)
        self._push(_Frame(index, LAB_OP, op, module, layout))

    def after(self, op: str, decision: routing.Decision, args: Mapping[str, Any], result: Any) -> None:
        frame = self._pop_to(LAB_OP, op)
        if frame is None:
            return
        tr, layout, index = self.trace, frame.layout, frame.index
        lo = len(tr._paths)
        with _quiet():  # a lab op's kernels write its states in place, unseen by version counters
            views, plain = split_args(op, args, layout.num_requests, after=True)
            tr._hash(_tensors(result, "out"), layout, index)
            tr._hash_views(views, layout, index)
            tr._hash([item for p, v in plain for item in _tensors(v, p)], layout, index)
        tr._outs[index] = (lo, len(tr._paths))

    # -- torch functions (level="ops") --

    def function(self, func: Any, args: tuple, kwargs: dict) -> Any:
        name, inplace, written = _function_info(func)
        if _writes(inplace, kwargs):
            return self._inplace(func, name, written, args, kwargs)
        out = func(*args, **kwargs)
        if type(out) in _PLAIN:
            return out
        with _quiet():
            outputs = _tensors(out, "out")
            if not outputs or _views_of_first(outputs, args):
                return out
            inputs = _tensors(args, "args")
            if kwargs:
                inputs += _tensors(kwargs, "kwargs")
            if _aliases(outputs, inputs):
                return out
            tr = self.trace
            layout, lo, index = tr._layout, len(tr._paths), len(tr._calls)
            tr._hash(inputs, layout, -1, index)
            self._open_function(name, lo)
            lo = len(tr._paths)
            tr._hash(outputs, layout, index)
            tr._outs[index] = (lo, len(tr._paths))
        return out

    def _open_function(self, name: str, lo: int) -> int:
        module, parent = self._enclosing()
        return self.trace._open(FUNCTION, f"{self.label(module)}.{name}", name, module, parent, None, lo)

    def _inplace(self, func: Any, name: str, written: tuple[tuple[int, str], ...], args: tuple, kwargs: dict) -> Any:
        tr = self.trace
        layout, lo, index = tr._layout, len(tr._paths), len(tr._calls)
        with _quiet():
            inputs = [*_tensors(args, "args"), *_tensors({k: v for k, v in kwargs.items() if k != "out"}, "kwargs")]
            tr._hash(inputs, layout, -1, index)
            tr._sink.flush()  # the reads queued so far see the bits before this write
        self._open_function(name, lo)
        try:
            out = func(*args, **kwargs)
        except BaseException:
            tr._errors.add(index)
            raise
        # __setitem__ returns None: what changed is its first argument; an operator returning
        # nothing changed the arguments its schema marks written.
        if name.endswith("__setitem__"):
            changed = args[0]
        elif out is None and written:
            changed = [args[i] if i < len(args) else kwargs.get(arg) for i, arg in written]
        else:
            changed = out
        lo = len(tr._paths)
        with _quiet():
            tr._hash(_tensors(changed, "out"), layout, index)
        tr._outs[index] = (lo, len(tr._paths))
        return out


class _FunctionMode(TorchFunctionMode):
    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _METADATA:
            return func(*args, **kwargs) if kwargs else func(*args)
        kwargs = kwargs or {}
        rec = self.recorder
        # Only calls inside the model's modules, and not inside a lab op (its backend's internals);
        # a write elsewhere still runs the reads queued before it.
        if rec.module_depth == 0 or rec.labop_depth > 0:
            if rec.defer and _writes(_function_info(func)[1], kwargs):
                with _quiet():
                    rec.trace._sink.flush()
            return func(*args, **kwargs)
        return rec.function(func, args, kwargs)


def _state_device(modules: list[tuple[str, torch.nn.Module]]) -> torch.device | None:
    """The device of the first parameter or buffer of `modules` (None: they hold none). Not
    `model.parameters()`: without parameters it walks every module, then again for the buffers."""
    for _, m in modules:
        for t in itertools.chain(m._parameters.values(), m._buffers.values()):
            if t is not None:
                return t.device
    return None


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block, back as it was after.

    The recorder allocates a few objects per hashed tensor, and they live as long as the trace:
    each full collection they trigger walks the whole heap (torch, the model), and cost more
    than the hashing itself (measured: registering the hooks of 927 modules took 55 ms with the
    collector on, 15 ms with it off). Reference counting frees everything as usual; cycles made
    inside the block are collected after it.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Call(functools.partial):
    """A recorded module's `_call_impl`: `rec.module_call(module, path, call, ...)` (a partial, so
    the call itself is C). A copy or a pickle of the module made inside the block gets torch's
    own back, not the recorder: the copy is not recorded, and a recorder cannot be copied."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict) -> Any:
        return copy.deepcopy(self.args[-1], memo)  # args: (module, path, torch's call)

    def __reduce__(self) -> Any:
        return self.args[-1].__reduce__()


@contextlib.contextmanager
def _module_calls(rec: _Recorder) -> Iterator[None]:
    """Every call of one of rec.modules in the block reaches `rec.module_call`; nothing is left on
    exit.

    nn.Module.__call__ runs `self._call_impl` (the module's hooks and forward), so a `_call_impl`
    set on the instance (in its __dict__, not through Module.__setattr__, which is slow) sees every
    call, however forward is set: code that patches a module's forward inside the block (an
    adapter, HFModel.linear_backend) stays recorded, and inputs are hashed as the caller passed
    them, before the module's own hooks, outputs after them. Not global module hooks: they send
    every module call in the process through torch's hook-dispatch path, about 8 us per call more
    on a 2-core CPU VM; and not a patch of nn.Module.__call__: changing a method of the class
    deoptimises the interpreter's caches for every module type (about 1.5 ms on the next forward).
    """
    if not callable(getattr(torch.nn.Module, "_call_impl", None)):
        raise RuntimeError(f"record: torch {torch.__version__}'s nn.Module has no _call_impl to record calls through")
    installed = []
    try:
        for path, m in rec.modules:
            state = m.__dict__
            own = state.get("_call_impl")  # None: the class's
            wrapper = _Call(rec.module_call, m, path, m._call_impl)
            state["_call_impl"] = wrapper
            installed.append((state, own, wrapper))
        yield
    finally:
        for state, own, wrapper in installed:
            if state.get("_call_impl") is wrapper:  # another one set on top stays (ours then passes calls by)
                if own is None:
                    del state["_call_impl"]
                else:
                    state["_call_impl"] = own


@contextlib.contextmanager
def record(
    model: torch.nn.Module,
    layout: Layout,
    level: str = "modules",
    *,
    hash_impl: str = "auto",
    keep_calls: bool = False,
    reuse: bool = True,
) -> Iterator[Trace]:
    """Record every call of `model` (and, at level="ops", its torch functions and gdn_lab ops)
    with per-request hashes of its inputs and outputs.

    Args:
        model: any nn.Module; every module in `model.named_modules()` is hooked.
        layout: how the rows of the first forward's tensors map to requests; change it between
            forward calls with `trace.set_layout` or `trace.step`.
        level: "modules" (module calls) or "ops" (also torch functions inside the model's modules
            and every gdn_lab.ops call in the block, with the backend that ran).
        hash_impl: "auto", "torch" or "triton" (see `row_hashes`). "triton" must run on the
            model's device (its first parameter's or buffer's); a tensor on a device where it
            cannot (a CPU tensor of a GPU model, without TRITON_INTERPRET) is hashed with torch,
            to the same hash.
        keep_calls: keep, for every lab-op entry, a cheap description of its arguments
            (`Entry.call`: shapes, dtypes and copies of the small integer tensors such as seq_lens,
            never the large tensors), so a backend's dispatch rule can later predict the launch.
        reuse: a tensor seen again (a module's output as the next module's input) reuses the
            rows read earlier when torch shows it unchanged (same object, version counter, pointer,
            shape and strides), except a call's own inputs at its outputs; at level="ops" the
            Triton row stage's reads also queue until a write (see the module docstring). False
            reads every tensor at every call, then (for code that writes tensors in place outside
            torch's view, between two calls).

    Yields:
        The Trace, filled as the model runs; read it (entries, `diff`) after the block.

    Raises:
        ValueError: model is not an nn.Module, layout not a Layout, level/hash_impl not accepted,
            or hash_impl="triton" cannot run on the model's device.
        RuntimeError: (at a flush, the block's end at the latest) a tensor whose read was queued was
            written in place by a call the recorder did not see.

    Every hook handle is removed, the function mode exited and the observer detached on every exit
    path, exceptions included; blocks nest (each records independently).

    Example:
        >>> import torch
        >>> from gdn_lab.trace import Layout, record
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> with record(net, Layout.per_request(["a", "b", "c"]), level="ops") as tr:
        ...     _ = net(torch.randn(3, 4))
        >>> [(e.name, e.kind) for e in tr.entries]
        [('Sequential', 'module'), ('0', 'module'), ('0.F.linear', 'function'), ('1', 'module'), ('1.F.relu', 'function')]
    """
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(layout, Layout):
        raise ValueError(f"layout: expected a gdn_lab.trace.Layout, got {type(layout).__name__}")
    if level not in LEVELS:
        raise ValueError(f"level: {level!r} is not accepted; expected one of {', '.join(map(repr, LEVELS))}")
    for name, flag in (("keep_calls", keep_calls), ("reuse", reuse)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name}: expected true or false, got {flag!r}")
    sink = HashSink(hash_impl, defer=level == "ops" and reuse)
    modules = list(model.named_modules())  # the model's modules when the block began
    device = _state_device(modules)
    if device is not None:
        resolve_impl(hash_impl, device, "hash_impl")  # a clear error before anything runs
    trace = Trace(level, layout, sink, reuse)
    with contextlib.ExitStack() as stack:
        stack.callback(sink.flush)  # last: the reads still queued run once nothing records
        stack.enter_context(_collector_paused())
        rec = _Recorder(type(model).__name__, modules, trace, keep_calls)
        stack.callback(rec.close)
        stack.enter_context(_module_calls(rec))
        if level == "ops":
            stack.enter_context(routing.observe(rec))
            rec.mode = stack.enter_context(_FunctionMode(rec))
        yield trace
