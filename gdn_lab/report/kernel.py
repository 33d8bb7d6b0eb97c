"""The Jupyter kernel the suite's notebooks run in: this interpreter, encrypted, quiet, cleaned up.

- `kernelspec(dir, env)` writes a `python3` kernelspec that runs this interpreter with the given
  environment (PYTHONPATH so the kernel imports the runner's gdn_lab; TRITON_INTERPRET fixed
  per notebook by its device), so papermill never picks another Python's `python3` and the runner
  never has to change its own environment.
- `SuiteKernelManager` is the kernel manager papermill gets (`kernel_manager_class`):
  - it provisions CurveZMQ keys (`transport_encryption`), so the kernel's channels are encrypted
    and ipykernel no longer warns "Kernel is running over TCP without encryption" on every start;
  - it does not interrupt a kernel it is shutting down: jupyter_client sends SIGINT before every
    shutdown request, and when that signal lands while ipykernel is still inside a message handler
    (the last cell's reply), the kernel logs "KeyboardInterrupt caught in kernel" after a notebook
    that finished normally;
  - `logging_to(path)` gives it a file for the kernel process's own stdout and stderr, so
    ipykernel's messages (e.g. a ZMQ "Socket operation on non-socket" logged at an ordinary
    shutdown on a loaded machine) go to the notebook's folder, not into the run's log;
  - it keeps a registry of live kernels, so an interrupted run (Ctrl-C) stops its kernels
    (`kill_live_kernels`) instead of leaving them to notice their parent is gone; after that, a
    kernel a parallel run (`--jobs`) was about to start is refused until `allow_kernels()`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import zmq
from jupyter_client.manager import AsyncKernelManager
from traitlets import default

from gdn_lab.report.io import atomic_write_json

KERNEL_NAME = "python3"
KERNEL_LOG = "kernel.log"
ENCRYPTED = zmq.has("curve")
_live: weakref.WeakSet[SuiteKernelManager] = weakref.WeakSet()
_stopped = threading.Event()  # set by kill_live_kernels: no new kernel starts until allow_kernels()


def kernelspec(folder: Path, env: Mapping[str, str]) -> Path:
    """Write `<folder>/kernels/python3/kernel.json` for this interpreter; returns the kernelspec folder."""
    spec = folder / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    metadata: dict[str, Any] = {"debugger": False}
    if ENCRYPTED:
        metadata["supported_encryption"] = ["curve"]
    atomic_write_json(
        spec / "kernel.json",
        {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Python 3 ({sys.executable})",
            "language": "python",
            "env": dict(env),
            "metadata": metadata,
        },
    )
    return spec


class SuiteKernelManager(AsyncKernelManager):
    """papermill's kernel manager for the suite (see the module docstring)."""

    log_path: Path | None = None  # the kernel process's stdout and stderr (`logging_to`); None: inherited

    @default("transport_encryption")
    def _encrypted_by_default(self) -> str:
        return "required" if ENCRYPTED else "disabled"

    async def start_kernel(self, **kw: Any) -> None:  # type: ignore[override]
        _refuse_if_stopped()
        with contextlib.ExitStack() as stack:
            if self.log_path is not None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                log = stack.enter_context(open(self.log_path, "wb"))  # the kernel keeps its own copy
                kw.setdefault("stdout", log)
                kw.setdefault("stderr", log)
            await super().start_kernel(**kw)
        _live.add(self)
        if _stopped.is_set():  # interrupted while this one started
            kill_live_kernels()
        _refuse_if_stopped()

    async def _async_interrupt_kernel(self) -> None:
        if self.shutting_down:  # every cell has run; a SIGINT now can only produce a spurious error log
            return
        await super()._async_interrupt_kernel()


def logging_to(path: Path) -> type[SuiteKernelManager]:
    """`SuiteKernelManager` whose kernel writes its own stdout and stderr to `path` (one per notebook)."""
    return type(SuiteKernelManager.__name__, (SuiteKernelManager,), {"log_path": path})


def _refuse_if_stopped() -> None:
    if _stopped.is_set():
        raise RuntimeError("the run was interrupted: no new kernel starts")


def allow_kernels() -> None:
    """Let kernels start again (a run begins) after an interrupted one."""
    _stopped.clear()


def kill_live_kernels() -> int:
    """Kill the kernel processes this process started and has not shut down (after Ctrl-C), and
    refuse new ones until `allow_kernels()`; returns how many were killed."""
    _stopped.set()
    killed = 0
    for km in list(_live):
        process = getattr(km.provisioner, "process", None) if km.provisioner is not None else None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=10)
            killed += 1
    _live.clear()
    return killed
