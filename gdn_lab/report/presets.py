"""Presets: named sets of notebook parameters (data/presets/<name>.yaml).

A preset file holds:

```yaml
description: one line
parameters:          # given to every notebook that declares the parameter
  device: cpu
  seed: 0
notebooks:           # per-notebook values, replacing `parameters`
  01_batch_invariance:
    ops: [decode_attention, gdn_decode]
gate:                # the cases `gdn-lab fingerprint` records (gdn_lab.gate.fingerprint.GateConfig)
  device: cpu
  cases:
    - {op: decode_attention, backends: [triton], targets: [1, 257], batch_sizes: [2, 8]}
```

`notebook_parameters(preset, notebook, **given)` resolves what one notebook runs with: the preset's
values, replaced by every `given` value that is not None (a notebook's parameters cell passes its
own values; those left at None come from the preset).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PRESET_DIR = Path(__file__).resolve().parents[2] / "data" / "presets"
TOP_LEVEL_KEYS = {"description", "parameters", "notebooks", "gate"}


@dataclass(frozen=True)
class Preset:
    """A loaded preset.

    Attributes:
        name: the file's stem (or the path given).
        description: one line.
        parameters: values for every notebook that declares them.
        notebooks: {notebook stem: values for that notebook}.
        gate: the regression gate's fields (`GateConfig`), or empty.
        path: the YAML file.
    """

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
    notebooks: dict[str, dict[str, Any]] = field(default_factory=dict)
    gate: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def for_notebook(self, notebook: str) -> dict[str, Any]:
        """The preset's values for one notebook: `parameters` replaced by its `notebooks` entry."""
        return {**self.parameters, **self.notebooks.get(notebook, {})}

    @property
    def device(self) -> str:
        return str(self.parameters.get("device", "auto"))


def available(preset_dir: Path = PRESET_DIR) -> list[str]:
    """The names of the presets in `preset_dir`."""
    return sorted(p.stem for p in preset_dir.glob("*.yaml"))


def load(name: str | os.PathLike, preset_dir: Path = PRESET_DIR) -> Preset:
    """Load a preset by name (data/presets/<name>.yaml) or by a path to a YAML file.

    Raises:
        ValueError: an unknown name (the message lists the available presets) or a malformed file.
    """
    path = Path(name)
    if path.suffix not in (".yaml", ".yml") or not path.exists():
        path = preset_dir / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"preset: {str(name)!r} is not known; accepted: {', '.join(available(preset_dir))}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or set(data) - TOP_LEVEL_KEYS:
        extra = sorted(set(data) - TOP_LEVEL_KEYS) if isinstance(data, dict) else type(data).__name__
        raise ValueError(
            f"preset {path}: unknown top-level keys {extra}; accepted: {', '.join(sorted(TOP_LEVEL_KEYS))}"
        )
    notebooks = data.get("notebooks") or {}
    for nb, values in notebooks.items():
        if not isinstance(values, dict):
            raise ValueError(f"preset {path}: notebooks.{nb} must be a mapping of parameter: value")
    return Preset(
        name=path.stem if path.parent == preset_dir else str(path),
        description=str(data.get("description", "")),
        parameters=dict(data.get("parameters") or {}),
        notebooks={str(k): dict(v) for k, v in notebooks.items()},
        gate=dict(data.get("gate") or {}),
        path=path,
    )


def notebook_parameters(preset: str | Preset, notebook: str, /, **given: Any) -> dict[str, Any]:
    """What a notebook runs with: the preset's values for the keys it declares, then `given`.

    Args:
        preset: a Preset or a preset name.
        notebook: the notebook's stem.
        **given: every parameter the notebook declares, with its value (None: take the preset's).

    Returns:
        {name: value} for every key of `given`; a key that is None in `given` and absent from the
        preset stays None.
    """
    p = preset if isinstance(preset, Preset) else load(preset)
    from_preset = p.for_notebook(notebook)
    return {k: (v if v is not None else from_preset.get(k)) for k, v in given.items()}
