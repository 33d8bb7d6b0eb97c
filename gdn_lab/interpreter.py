"""Triton's CPU interpreter without three pieces of work it repeats to no effect (Triton 3.9).

- Under TRITON_INTERPRET=1, Triton patches triton.language's builtins (`_patch_lang`: an
  `inspect.getmembers` pass over tl, tl.tensor, tl.math, ...) when a kernel launches, restores
  them when it ends, and patches again on every call of a @triton.jit device function inside it
  (`InterpretedFunction.__call__`; tl.sum and tl.cumsum are such functions too), where the
  launch's patch is still in force: about 0.2 ms a call, which the chunked delta rule's helpers
  pay tens of thousands of times in the cpu-smoke suite.
- `_get_np_dtype`, called on every interpreted op, builds its 19-entry dtype table anew each time
  (about 20 us).
- Every value an interpreted op returns is a `tl.tensor`, whose constructor rebuilds its shape as
  a triton.language tuple and derives that tuple's type; every `tl.block_type` re-validates its
  shape and formats its name; and each broadcast compares shapes through triton.language's tuple
  equality, which first rebuilds the other side. Results that depend only on the shape (and the
  element type's name): dropping the rebuilds halves the interpreter's time on the chunked delta
  rule (1.28M instead of 2.44M Python calls for one gdn_prefill call at the tests' shapes).

`skip_repeated_work()` wraps `_patch_lang` so that a call made while a launch runs (one made by a
device function: a kernel cannot launch a kernel) returns an empty patch when every language
module the function sees is already patched in this launch: by the launch itself, or by an
earlier device-function call (Triton never restores those before the launch ends; the
triton.language functions see `triton.language.core`, which the kernel's own patch leaves alone,
so the first of them in a launch patches it). Any other call gets Triton's own patch, so every
kernel runs under the same patches. It also memoizes `_get_np_dtype` by scalar type name, and
(`_shared_shapes`) makes block types share one (shape, numel, name) per element type name and
extents, tensors one shape tuple (and numel) per block type shape, and compares those shapes as
the ints they are, after checking on probe values that the shortcuts build and compare exactly as
Triton's own do; where they do not, Triton's stay. The tables of the cpu-smoke suite are the same
bits with and without (`gdn-lab compare`).
"""

from __future__ import annotations

import math
from typing import Any

_MARK = "__gdn_lab_skips_repeated_work__"


def skip_repeated_work() -> bool:
    """Install the wrappers in this process when Triton's interpreter is on (once; later calls do
    nothing). Off the interpreter nothing is touched: tl.tensor and tl.block_type also serve
    Triton's compiler.

    Returns:
        True if the launch and dtype wrappers are in place: the interpreter is on and has
        `_patch_lang` and `_get_np_dtype` (Triton 3.9's does); False otherwise, when Triton is left
        as it is. The shared shapes come with them where their self-check passes.
    """
    from gdn_lab.device import interpreting

    if not interpreting():
        return False
    from triton.language import core
    from triton.runtime import interpreter

    if not all(hasattr(interpreter, name) for name in ("_patch_lang", "_LangPatchScope", "_get_np_dtype")):
        return False
    if not getattr(interpreter._patch_lang, _MARK, False):
        interpreter._patch_lang = _once_per_launch(interpreter._patch_lang, interpreter._LangPatchScope)
        interpreter._get_np_dtype = _memoized_np_dtype(interpreter._get_np_dtype)
        _shared_shapes(core)
        setattr(interpreter._patch_lang, _MARK, True)
    return True


def _once_per_launch(patch_lang: Any, empty_scope: Any) -> Any:
    """`patch_lang` for launches and for device-function calls that see a language module not
    yet patched in the running launch; an empty scope for the others."""
    launches: list[set[int]] = []  # per running launch: the language modules patched in it so far

    def patch(fn: Any) -> Any:
        langs = _language_modules(fn)
        if launches:  # a device-function call inside a launch
            if langs and langs <= launches[-1]:  # no langs: Triton's own call raises, so let it
                return empty_scope()
            scope = patch_lang(fn)
            launches[-1] |= langs
            return scope
        scope = patch_lang(fn)
        launches.append(set(langs))
        restore = scope.restore

        def restore_and_end() -> None:
            try:
                restore()
            finally:
                launches.pop()

        scope.restore = restore_and_end
        return scope

    return patch


def _language_modules(fn: Any) -> frozenset[int]:
    """The ids of the modules `_patch_lang` patches for `fn`: triton.language and its core, where
    `fn`'s globals hold them."""
    import triton.language as tl

    return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)


def _memoized_np_dtype(get_np_dtype: Any) -> Any:
    """`get_np_dtype` remembered per scalar type (a block's is its element's; names are unique)."""
    import triton.language as tl

    known: dict[str, Any] = {}

    def np_dtype(tt_dtype: Any) -> Any:
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if not isinstance(scalar, tl.dtype):  # not a type the table holds: Triton's own answer
            return get_np_dtype(tt_dtype)
        if scalar.name not in known:
            known[scalar.name] = get_np_dtype(scalar)
        return known[scalar.name]

    return np_dtype


def _shared_shapes(core: Any) -> bool:
    """Replace tl.tensor's and tl.block_type's constructors by ones that reuse, per shape, what
    Triton's own derive from the shape alone, and triton.language's tuple equality by one that
    compares remembered shapes directly; True if installed (see the module docstring).

    Sound because none of it is changed in place: a block type's shape is a triton.language tuple
    of ints, its numel an int and its name a string; a tensor's shape is a tuple of constexprs. A
    shape Triton rejects (not a power of two, too large, not ints) is never remembered: it goes to
    Triton's own constructor every time and raises there.
    """
    tensor_init, block_init, their_eq = core.tensor.__init__, core.block_type.__init__, core.tuple.__eq__
    constexpr, tl_tuple = core.constexpr, core.tuple
    blocks: dict[tuple, tuple] = {}  # (element type name, *extents) -> a block type's (shape, numel, name)
    # id of a remembered block type's shape -> (that shape, a tensor's numel and shape); the shape is
    # held here, so its id is never another object's
    of_shape: dict[int, tuple] = {}
    scalar = (constexpr(1), tl_tuple([]))

    def tensor_shape(shape: Any) -> tuple:
        return constexpr(math.prod(shape)), tl_tuple([constexpr(s) for s in shape])

    def shared_tensor_init(self: Any, handle: Any, type: Any) -> None:
        if type.is_block():
            known = of_shape.get(id(type.shape))
            numel, shape = known[1:] if known is not None and known[0] is type.shape else tensor_shape(type.shape)
        else:
            numel, shape = scalar
        self.handle, self.type, self.dtype = handle, type, type.scalar
        self.numel, self.shape = numel, shape

    def shared_block_init(self: Any, element_ty: Any, shape: Any) -> None:
        name = getattr(element_ty, "name", None)  # a dtype's (its str); anything else is not remembered
        known = None
        if type(name) is str:
            try:  # the extents' types are part of the key: 8.0 == 8, but Triton rejects 8.0
                extents = [s.value if type(s) is constexpr else s for s in shape]
                known = blocks.get((name, *extents, *map(type, extents)))
            except TypeError:  # not a sequence, or an unhashable extent: Triton's own says why
                pass
        if known is None:
            block_init(self, element_ty, shape)  # validates, or raises
            if type(name) is str:
                blocks[(name, *self.shape, *map(type, self.shape))] = (self.shape, self.numel, self.name)
                of_shape[id(self.shape)] = (self.shape, *tensor_shape(self.shape))
            return
        self.element_ty = element_ty
        self.shape, self.numel, self.name = known

    def tuple_eq(self: Any, other: Any) -> Any:
        # a remembered block type's shape (ints) against another or a list of extents (a broadcast's
        # result shape): normalizing `other` would leave the ints as they are
        if id(self) in of_shape:
            if id(other) in of_shape:
                return constexpr(self.values == other.values)
            if type(other) is list:
                return constexpr(self.values == other)
        return their_eq(self, other)

    if not _builds_the_same(core, tensor_init, shared_tensor_init, block_init, shared_block_init):
        return False
    probe = object.__new__(core.block_type)
    shared_block_init(probe, core.float32, [4, 8])
    if not _compares_the_same(core, their_eq, tuple_eq, probe.shape):
        return False
    for ours, theirs in ((shared_tensor_init, tensor_init), (shared_block_init, block_init), (tuple_eq, their_eq)):
        ours.__wrapped__ = theirs  # type: ignore[attr-defined]  # Triton's own, for the tests
    core.tensor.__init__, core.block_type.__init__, tl_tuple.__eq__ = shared_tensor_init, shared_block_init, tuple_eq
    return True


def _builds_the_same(core: Any, tensor_init: Any, shared_tensor: Any, block_init: Any, shared_block: Any) -> bool:
    """Whether the shared constructors give probe values the attributes Triton's own give them,
    twice (computed, then remembered)."""
    probes = [(core.float32, [4, 8]), (core.pointer_type(core.float16), [16]), (core.int1, [core.constexpr(2), 1])]
    for element_ty, shape in probes * 2:
        their_block, our_block = object.__new__(core.block_type), object.__new__(core.block_type)
        block_init(their_block, element_ty, shape)
        shared_block(our_block, element_ty, shape)
        values = [(their_block, our_block)]
        for their_type, our_type in ((their_block, our_block), (element_ty, element_ty)):
            theirs, ours = object.__new__(core.tensor), object.__new__(core.tensor)
            tensor_init(theirs, None, their_type)
            shared_tensor(ours, None, our_type)
            values.append((theirs, ours))
        if any(_described(core, vars(theirs)) != _described(core, vars(ours)) for theirs, ours in values):
            return False
    return True


def _compares_the_same(core: Any, their_eq: Any, our_eq: Any, block_shape: Any) -> bool:
    """Whether `our_eq` says what triton.language's tuple equality says on probe pairs, among them
    a remembered block type's shape."""
    c, t = core.constexpr, core.tuple
    shapes = [t([4, 8]), t([4, 8]), t([8, 4]), t([4]), t([c(4), c(8)]), t([c(4), 8]), t([])]
    shapes.append(block_shape)
    others = [*shapes, [4, 8], [8, 4], [4], (4, 8), [c(4), 8]]
    return all(bool(their_eq(a, b)) == bool(our_eq(a, b)) for a in shapes for b in others)


def _described(core: Any, attributes: dict[str, Any]) -> dict[str, Any]:
    """Constructor attributes as comparable reprs (a triton.language tuple's repr is its address)."""
    return {
        k: [repr(x) for x in v.values] if isinstance(v, core.tuple) else (type(v).__name__, repr(v))
        for k, v in attributes.items()
    }
