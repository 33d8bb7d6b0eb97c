"""A notebook's derived cell: its parameters as one checked Config, where it runs, where it writes.

Example (the cell after `parameters`):

    from gdn_lab.experiments.batch_invariance import InvarianceByOpConfig
    from gdn_lab.report.notebook import setup

    p = setup(InvarianceByOpConfig, "01_batch_invariance", preset=preset, out_dir=out_dir, ops=ops, ...)
    table = batch_invariance.run(p.config)   # p.config is what the experiment runs with; p.out the table folder
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gdn_lab.experiments.config import ExperimentConfig
from gdn_lab.report import parameters, quiet
from gdn_lab.report.io import atomic_write_json

CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class NotebookRun:
    """A notebook's resolved parameters.

    Attributes:
        notebook: the notebook's stem.
        config: its Config, every value checked: what the experiment runs with.
        out: the folder its tables, headline.json, config.json and warnings.json go to.
        preset: the preset it was resolved against.
    """

    notebook: str
    config: ExperimentConfig
    out: Path
    preset: str

    @property
    def device(self) -> torch.device:
        return self.config.torch_device


def setup(config: type[ExperimentConfig], notebook: str, *, preset: str, out_dir: str, **values: Any) -> NotebookRun:
    """Resolve a notebook's parameters into its Config and prepare where it runs.

    Values written `...` come from the preset (its entry for `notebook`, then its shared
    `parameters`), else the Config's default (`gdn_lab.report.parameters.resolve`); the preset is
    read only if some value is `...`, so a notebook the runner executed (every value injected) runs
    with exactly the values its injected cell shows. Then:

    - on the CPU, TRITON_INTERPRET=1 is set unless the environment sets it (the lab's Triton
      kernels, imported on first use, run in Triton's interpreter);
    - out_dir is created, and `config.json` in it records the Config the experiment gets;
    - known noise (Triton interpreter RuntimeWarnings, fla's platform warning) is counted into
      `warnings.json` there instead of shown (`gdn_lab.report.quiet`);
    - pandas shows whole cells, so long reasons wrap instead of being cut.

    Args:
        config: the notebook's Config class (the one its metadata names).
        notebook: the notebook's stem.
        preset: a preset name or path.
        out_dir: where the tables go.
        **values: every field of `config`, as the parameters cell holds it (`...` when not set there).

    Returns:
        A NotebookRun: `.config`, `.out`, `.device`, `.notebook`.

    Raises:
        ValueError: a field missing from or unknown to the cell, or a value the Config rejects
            (the message names the notebook, the parameter, the value and what is accepted).
    """
    from gdn_lab.device import interpreter_default
    from gdn_lab.report import presets

    parameters.check_declared(notebook, config, [*values, "preset", "out_dir"])
    unset = [k for k, v in values.items() if v is parameters.UNSET]
    p = presets.load(preset) if unset else None
    cfg = parameters.resolve(config, notebook, preset=p, given=values)
    interpreter_default(cfg.torch_device)  # on the CPU: TRITON_INTERPRET=1 unless set
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    quiet.install(out / quiet.WARNINGS_FILE)
    _display_whole_cells()
    atomic_write_json(
        out / CONFIG_FILE,
        {
            "notebook": notebook,
            "config": parameters.config_name(config),
            "preset": str(preset),
            "out_dir": str(out_dir),
            "parameters": cfg.plain(),
        },
    )
    return NotebookRun(notebook, cfg, out, str(preset))


def _display_whole_cells() -> None:
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        return
    pd.set_option("display.max_colwidth", None)
    pd.set_option("display.max_rows", 200)
