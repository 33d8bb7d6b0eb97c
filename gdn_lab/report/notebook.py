"""A notebook's derived cell: resolve its parameters against the preset, pick the device, make out_dir.

Example (the cell after `parameters`):

    from gdn_lab.report.notebook import setup
    p = setup("01_batch_invariance", preset=preset, device=device, seed=seed, out_dir=out_dir, ops=ops)
    p.device, p.out, p.ops
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gdn_lab.report.presets import notebook_parameters


def setup(notebook: str, **parameters: Any) -> SimpleNamespace:
    """Resolve a notebook's parameters and prepare where it runs.

    Every parameter left at None takes the preset's value (`presets.notebook_parameters`). The device
    ("auto", "cpu", "cuda") becomes a torch.device; on the CPU, TRITON_INTERPRET=1 is set unless the
    environment already sets it, so the lab's Triton kernels (imported on first use) run in
    Triton's interpreter. out_dir is created.

    Args:
        notebook: the notebook's stem.
        **parameters: every parameter of the notebook's parameters cell, including preset, device,
            seed and out_dir.

    Returns:
        A namespace with every parameter resolved, plus `device` (torch.device), `out` (Path) and
        `notebook`.

    Raises:
        ValueError: a required parameter is missing, or an unknown preset or device.
    """
    from gdn_lab.device import interpreter_default
    from gdn_lab.workloads import resolve_device

    missing = [k for k in ("preset", "device", "seed", "out_dir") if k not in parameters]
    if missing:
        raise ValueError(f"setup: the parameters cell must define {', '.join(missing)}")
    resolved = notebook_parameters(parameters["preset"], notebook, **parameters)
    device = resolve_device(resolved["device"] or "auto")
    interpreter_default(device)  # on the CPU: TRITON_INTERPRET=1 unless set
    out = Path(resolved["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    ns = SimpleNamespace(**resolved)
    ns.device, ns.out, ns.notebook = device, out, notebook
    return ns
