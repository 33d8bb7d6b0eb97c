"""Triton's CPU interpreter without two pieces of work it repeats to no effect (Triton 3.9).

- Under TRITON_INTERPRET=1, Triton patches triton.language's builtins (`_patch_lang`: an
  `inspect.getmembers` pass over tl, tl.tensor, tl.math, ...) when a kernel launches, restores
  them when it ends, and patches again on every call of a @triton.jit device function inside it
  (`InterpretedFunction.__call__`; tl.sum and tl.cumsum are such functions too), where the
  launch's patch is still in force: about 0.2 ms a call, which the chunked delta rule's helpers
  pay tens of thousands of times in the cpu-smoke suite.
- `_get_np_dtype`, called on every interpreted op, builds its 19-entry dtype table anew each time
  (about 20 us).

`skip_repeated_work()` wraps `_patch_lang` so that a call made while a launch runs (one made by a
device function: a kernel cannot launch a kernel) returns an empty patch when every language
module the function sees is already patched in this launch: by the launch itself, or by an
earlier device-function call (Triton never restores those before the launch ends; the
triton.language functions see `triton.language.core`, which the kernel's own patch leaves alone,
so the first of them in a launch patches it). Any other call gets Triton's own patch, so every
kernel runs under the same patches. It also memoizes `_get_np_dtype` by scalar type name. The
tables of the cpu-smoke suite are the same bits with and without (`gdn-lab compare`).
"""

from __future__ import annotations

from typing import Any

_MARK = "__gdn_lab_skips_repeated_work__"


def skip_repeated_work() -> bool:
    """Install both wrappers in this process (once; later calls do nothing).

    Returns:
        True if they are in place: this Triton's interpreter has `_patch_lang` and `_get_np_dtype`
        (Triton 3.9 does); False otherwise, when the interpreter is left as it is.
    """
    from triton.runtime import interpreter

    if not all(hasattr(interpreter, name) for name in ("_patch_lang", "_LangPatchScope", "_get_np_dtype")):
        return False
    if not getattr(interpreter._patch_lang, _MARK, False):
        interpreter._patch_lang = _once_per_launch(interpreter._patch_lang, interpreter._LangPatchScope)
        interpreter._get_np_dtype = _memoized_np_dtype(interpreter._get_np_dtype)
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
