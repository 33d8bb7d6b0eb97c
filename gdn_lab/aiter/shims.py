"""The scoped shims that let AITER's Triton kernels run off ROCm, for AITER alone, for one `with` block.

Off ROCm, AITER's code asks two questions a non-AMD machine answers wrongly and passes launch
options only AMD's backend knows; `shims()` handles all three, restoring everything on every exit
path (the blocks nest):

- the arch: `aiter.ops.triton.utils._triton.arch_info.get_arch()` reads Triton's active target,
  which is an int (90) on an H200 and does not exist under the CPU interpreter; AITER compares it
  with gfx names at import. The shim makes it answer the *emulated* arch (gfx950 or gfx942,
  `gdn_lab.aiter.emulation`). Under the interpreter Triton has no active driver at all, so a stub
  driver whose target is `GPUTarget("hip", arch, 64)` is active inside the block.
- the CU count: `aiter.ops.triton.utils.device_info.get_num_sms()` asks torch.cuda (no answer on
  the CPU); AITER's unified_attention sizes its split from it. The shim answers `num_cus`.
- AMD-only launch options: AITER launches kernels with `waves_per_eu`, `matrix_instr_nonkdim`,
  `kpack`, which the CUDA backend rejects; the shim drops them from the launches of AITER's own
  kernel objects (an instance attribute on each, removed on exit), never from other Triton code.
- `tl.assume` under the interpreter: compiled, an assumption is a hint to the optimizer; the
  interpreter asserts it. AITER's gemm_a16w16 assumes `stride_ck > 0` while it passes 0 when it
  does not split K (its pid_k is then 0, so that stride is never used); inside the block the
  interpreter treats assumptions as the compiler does, as hints.

Nothing here imports aiter or triton at module load; the aiter modules it patches are those the
loader (`gdn_lab.aiter.loader`) imported.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from gdn_lab.aiter.probe import on_rocm
from gdn_lab.device import interpreting

# Launch options only Triton's HIP backend knows; the CUDA backend raises on them.
AMD_ONLY_LAUNCH_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")

ARCH_INFO = "aiter.ops.triton.utils._triton.arch_info"
DEVICE_INFO = "aiter.ops.triton.utils.device_info"


def _stub_driver(arch: str) -> Any:
    """A Triton driver stand-in whose only answer is the emulated AMD target (interpreter only)."""
    from triton.backends.compiler import GPUTarget

    class _EmulatedTarget:
        def get_current_target(self) -> GPUTarget:
            return GPUTarget("hip", arch, 64)

        def is_active(self) -> bool:
            return False

    return _EmulatedTarget()


def aiter_modules() -> list[ModuleType]:
    """The loaded aiter submodules."""
    return [m for n, m in list(sys.modules.items()) if n.startswith("aiter.") and isinstance(m, ModuleType)]


def _launch_targets() -> list[Any]:
    """AITER's kernel objects in the loaded aiter modules (the innermost JIT/interpreted functions,
    which receive the launch options; autotuner and heuristics wrappers pass them down)."""
    from triton.runtime.jit import KernelInterface

    found: dict[int, Any] = {}
    for module in aiter_modules():
        for obj in list(vars(module).values()):
            inner = obj
            while isinstance(getattr(inner, "fn", None), KernelInterface):
                inner = inner.fn
            python_fn = getattr(inner, "fn", None)
            if isinstance(inner, KernelInterface) and (getattr(python_fn, "__module__", None) or "").startswith(
                "aiter."
            ):
                found[id(inner)] = inner
    return list(found.values())


def _dropping_amd_options(run: Any) -> Any:
    def launch(*args: Any, **kwargs: Any) -> Any:
        for key in AMD_ONLY_LAUNCH_OPTIONS:
            kwargs.pop(key, None)
        return run(*args, **kwargs)

    return launch


def _genuine(fn: Any) -> Any:
    """AITER's own function behind a shim's answer (itself if it is not an answer)."""
    return getattr(fn, "__gdn_lab_genuine__", fn)


def _answering(genuine: Any, value: int) -> Any:
    """A stand-in for AITER's `get_num_sms` that answers `value` (and remembers what it replaces,
    so nested blocks and modules that imported the function by name are found again)."""

    def get_num_sms() -> int:
        return value

    get_num_sms.__gdn_lab_genuine__ = genuine  # type: ignore[attr-defined]
    return get_num_sms


@contextlib.contextmanager
def _patched(obj: Any, attr: str, value: Any, instance: bool = False) -> Iterator[None]:
    """Set obj.attr for the block; restore the old value (or remove an instance attribute) after."""
    had = attr in vars(obj) if instance else hasattr(obj, attr)
    old = vars(obj).get(attr) if instance else getattr(obj, attr, None)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, attr, old)
        else:
            delattr(obj, attr)


@contextlib.contextmanager
def _active_driver(driver_obj: Any) -> Iterator[None]:
    from triton.runtime import driver

    previous = getattr(driver, "_active", None)
    driver.set_active(driver_obj)
    try:
        yield
    finally:
        driver.set_active(previous)


@contextlib.contextmanager
def _assume_as_hint() -> Iterator[None]:
    """Under the interpreter, `tl.assume` is a hint (as compiled), not an assertion, for the block."""
    from triton.runtime import interpreter

    def create_assume(self: Any, condition: Any) -> None:
        return None

    with _patched(interpreter.InterpreterBuilder, "create_assume", create_assume):
        yield


@contextlib.contextmanager
def shims(arch: str, num_cus: int | None = None, *, need_package: bool = True) -> Iterator[None]:
    """Answer AITER's arch and CU-count questions and drop AMD-only launch options, for the block.

    A no-op on ROCm (AITER asks the real device there). Off ROCm it patches, for the block only:
    `arch_info.get_arch` (-> `arch`), `device_info.get_num_sms` and its imported copies in loaded
    aiter modules (-> `num_cus`), Triton's active driver under the interpreter (-> a stub whose
    target is `hip`/`arch`) and the interpreter's `tl.assume` (-> a hint), and the `run` of each
    loaded AITER kernel object (drops AMD_ONLY_LAUNCH_OPTIONS). Everything is restored on exit, exceptions included; blocks nest.

    Args:
        arch: the gfx arch AITER is told.
        num_cus: the CU count AITER's heuristics see (None: leave get_num_sms alone, as while
            importing, where a module importing it by name would keep the answer).
        need_package: import arch_info through the loaded `aiter` package (False while the
            package itself is being imported).
    """
    if on_rocm():
        yield
        return
    with contextlib.ExitStack() as stack:
        if interpreting():
            stack.enter_context(_active_driver(_stub_driver(arch)))
            stack.enter_context(_assume_as_hint())
        if need_package or "aiter" in sys.modules:
            arch_info = importlib.import_module(ARCH_INFO)
            device_info = importlib.import_module(DEVICE_INFO)
            stack.enter_context(_patched(arch_info, "get_arch", lambda: arch))
            genuine = _genuine(vars(device_info).get("get_num_sms"))
            if num_cus is not None and genuine is not None:
                answer = _answering(genuine, num_cus)
                for module in aiter_modules():
                    if _genuine(vars(module).get("get_num_sms")) is genuine:
                        stack.enter_context(_patched(module, "get_num_sms", answer))
            for kernel in _launch_targets():
                stack.enter_context(_patched(kernel, "run", _dropping_amd_options(kernel.run), instance=True))
        yield
