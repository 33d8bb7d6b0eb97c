"""Presets: named sets of notebook parameters (data/presets/<name>.yaml, or any YAML file).

A preset file holds:

```yaml
description: one line
parameters:          # given to every notebook whose parameters cell leaves the parameter `...`
  device: cpu
  seed: 0
notebooks:           # per-notebook values, replacing `parameters`
  01_batch_invariance:
    ops: [decode_attention, gdn_decode]
    arches: null     # null is a value: it is passed on as None
gate:                # the cases `gdn-lab fingerprint` records (gdn_lab.gate.fingerprint.GateConfig)
  device: cpu
  cases:
    - {op: decode_attention, backends: [triton], targets: [1, 257], batch_sizes: [2, 8]}
longest_first: [01_batch_invariance, 05_layer_hash_bisect]  # `--jobs N > 1` starts these first
```

`longest_first` changes no value, only the order in which `--jobs N > 1` starts the notebooks: those
named, in its order, then the others in file order. Naming them longest first, as measured with the
preset, leaves short notebooks for last, so the kernels running side by side end close together.

`load(name_or_path)` reads and checks the file's structure (every error names the file and the key);
the values themselves are checked against each notebook's Config by
`gdn_lab.report.parameters.resolve`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gdn_lab import package_data

PRESET_DIR = package_data.path("presets")
TOP_LEVEL_KEYS = ("description", "parameters", "notebooks", "gate", "longest_first")


@dataclass(frozen=True)
class Preset:
    """A loaded preset.

    Attributes:
        name: the file's stem for a preset of the lab (`cpu-smoke`), else the path given.
        description: one line.
        parameters: values for every notebook that declares them.
        notebooks: {notebook stem: values for that notebook}.
        gate: the regression gate's fields (`GateConfig`), or empty.
        longest_first: notebook stems that `--jobs N > 1` starts first, in this order.
        path: the YAML file.
    """

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
    notebooks: dict[str, dict[str, Any]] = field(default_factory=dict)
    gate: dict[str, Any] = field(default_factory=dict)
    longest_first: tuple[str, ...] = ()
    path: Path | None = None

    def for_notebook(self, notebook: str) -> dict[str, Any]:
        """The preset's values for one notebook: `parameters` replaced by its `notebooks` entry."""
        return {**self.parameters, **self.notebooks.get(notebook, {})}

    def source(self, notebook: str, key: str) -> str:
        """Where the preset's value of `key` for `notebook` comes from, for messages."""
        where = f"notebooks.{notebook}" if key in self.notebooks.get(notebook, {}) else "parameters"
        return f"preset {self.name}, {where}.{key}"


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """PyYAML's safe loader (its libyaml parser where PyYAML has it: about 10x faster to read a
    preset), except that a key given twice in one mapping is an error (PyYAML keeps the last one
    silently)."""

    def construct_mapping(self, node, deep=False):  # noqa: ANN001, ANN201
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def yaml_load(text: str) -> Any:
    """YAML as presets and `-p` values are read: safe, and no key given twice in one mapping.

    Raises:
        yaml.YAMLError: malformed YAML or a repeated key (with the line in its `problem_mark`).
    """
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)


def available(preset_dir: Path = PRESET_DIR) -> list[str]:
    """The names of the presets in `preset_dir`."""
    return sorted(p.stem for p in preset_dir.glob("*.yaml"))


def describe(preset_dir: Path = PRESET_DIR) -> dict[str, str]:
    """{name: description} of the presets in `preset_dir` (a file that does not load says why)."""
    out = {}
    for name in available(preset_dir):
        try:
            out[name] = load(name, preset_dir).description
        except ValueError as exc:
            out[name] = f"(does not load: {exc})"
    return out


def _is_path(name: str) -> bool:
    return os.sep in name or "/" in name or name.endswith((".yaml", ".yml"))


def load(name: str | os.PathLike, preset_dir: Path = PRESET_DIR) -> Preset:
    """Load a preset by name (data/presets/<name>.yaml) or by a path to a YAML file.

    Raises:
        ValueError: an unknown name (the message lists the available presets), a path that is not
            a readable file, malformed YAML (with its line), an empty file, or a file whose
            structure is not `description` / `parameters: {name: value}` / `notebooks: {stem: {name: value}}`.
    """
    text = str(name)
    if not text.strip():
        raise ValueError(f"preset: expected a name or a path; accepted: {', '.join(available(preset_dir))}")
    path = Path(text).expanduser() if _is_path(text) else preset_dir / f"{text}.yaml"
    if not path.exists():
        if _is_path(text):
            raise ValueError(f"preset: the file {text!r} does not exist")
        raise ValueError(
            f"preset: {text!r} is not known; accepted: {', '.join(available(preset_dir))} (or a path to a YAML file)"
        )
    if not path.is_file():
        raise ValueError(f"preset: {text!r} is not a file")
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"preset {path}: cannot be read ({type(exc).__name__}: {exc})") from None
    try:
        data = yaml_load(raw)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"preset {path}: not valid YAML{at}: {problem}") from None
    if data is None:
        raise ValueError(f"preset {path}: the file is empty; expected {', '.join(TOP_LEVEL_KEYS)}")
    if not isinstance(data, dict):
        raise ValueError(
            f"preset {path}: expected a mapping with keys {', '.join(TOP_LEVEL_KEYS)}, got a {type(data).__name__}"
        )
    unknown = sorted(map(str, set(data) - set(TOP_LEVEL_KEYS)))
    if unknown:
        raise ValueError(f"preset {path}: unknown top-level keys {unknown}; accepted: {', '.join(TOP_LEVEL_KEYS)}")
    if not any(data.get(k) for k in ("parameters", "notebooks", "gate")):
        raise ValueError(f"preset {path}: sets nothing (`parameters`, `notebooks` and `gate` are all empty)")
    parameters = _mapping(path, "parameters", data.get("parameters"))
    notebooks = {}
    for nb, values in _mapping(path, "notebooks", data.get("notebooks"), names=False).items():
        notebooks[nb] = _mapping(path, f"notebooks.{nb}", values)
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ValueError(f"preset {path}: description must be one line of text, got {description!r}")
    return Preset(
        name=path.stem if path.parent.resolve() == preset_dir.resolve() else str(path),
        description=description,
        parameters=parameters,
        notebooks=notebooks,
        gate=_mapping(path, "gate", data.get("gate"), names=False),
        longest_first=_names(path, "longest_first", data.get("longest_first")),
        path=path,
    )


def _mapping(path: Path, key: str, value: Any, names: bool = True) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"preset {path}: {key} must be a mapping of name: value, got {value!r}")
    bad = [k for k in value if not isinstance(k, str) or (names and not k.isidentifier())]
    if bad:
        what = "parameter names" if names else "notebook names"
        raise ValueError(f"preset {path}: {key} has keys that are not {what}: {bad!r}")
    return dict(value)


def _names(path: Path, key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"preset {path}: {key} must be a list of notebook names, got {value!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"preset {path}: {key} names a notebook twice: {value!r}")
    return tuple(value)
