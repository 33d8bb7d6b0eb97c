"""A notebook's parameters: one typed Config per notebook, resolved once, the same way everywhere.

Each notebook names its schema, a Config dataclass (`gdn_lab.experiments.config.ExperimentConfig`),
in its metadata, and its `parameters` cell declares `preset`, `out_dir` and every field of that
Config, once each:

```python
nb.metadata["gdn_lab"] = {"config": "gdn_lab.experiments.batch_invariance:InvarianceByOpConfig"}
```

A field written `...` in the cell is not set there: it takes the value of `-p` (or of an edit of the
cell), else the preset's (the notebook's own entry, then the preset's shared `parameters`), else the
Config's default. Any other literal is the notebook's own value; only `-p` changes it. `None` is a
value like any other (`arches = None`: the device's arch), never "unset".

`resolve` does this once and builds the Config, so every value is checked (type, range, names of
ops, backends, arches and dtypes) before any kernel runs; the runner (`gdn-lab run`) calls it at plan
time and injects every resolved value into the notebook, and `setup()` calls it again with those
values, which are then all set, so it never reads the preset a second time. Run interactively,
`setup()` resolves the cell's `...` against its `preset` the same way.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from gdn_lab.experiments.config import ExperimentConfig
from gdn_lab.report.presets import Preset

UNSET = Ellipsis  # `...` in a parameters cell: take the value from -p, the preset or the Config's default
RUNNER_KEYS = ("preset", "out_dir")  # every notebook declares them; the runner sets them
METADATA_KEY = "gdn_lab"


class ParameterError(ValueError):
    """A parameter value (or a notebook's declaration of its parameters) that cannot run."""


def config_name(cls: type) -> str:
    """The "module:Class" name a notebook's metadata gives for `cls`."""
    return f"{cls.__module__}:{cls.__qualname__}"


def config_class(name: str) -> type[ExperimentConfig]:
    """The Config class named "package.module:Class".

    Raises:
        ParameterError: a name that does not import, or not an ExperimentConfig dataclass.
    """
    module, sep, qualname = str(name).partition(":")
    if not sep or not module or not qualname:
        raise ParameterError(f"config: expected 'package.module:Class', got {name!r}")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ParameterError(f"config: {name!r} does not import ({type(exc).__name__}: {exc})") from None
    if not (isinstance(obj, type) and issubclass(obj, ExperimentConfig) and is_dataclass(obj)):
        raise ParameterError(f"config: {name!r} is not an ExperimentConfig dataclass")
    return obj


def field_names(cls: type[ExperimentConfig]) -> list[str]:
    return [f.name for f in fields(cls)]


def check_declared(notebook: str, cls: type[ExperimentConfig], names: Any) -> None:
    """The parameters cell declares exactly `preset`, `out_dir` and the Config's fields.

    Raises:
        ParameterError: naming the notebook, the missing and the extra names.
    """
    want = set(RUNNER_KEYS) | set(field_names(cls))
    missing, extra = sorted(want - set(names)), sorted(set(names) - want)
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"not fields of the Config: {', '.join(extra)}"] if extra else []
        )
        raise ParameterError(
            f"{notebook}: its parameters must be preset, out_dir and the fields of {config_name(cls)}; "
            + "; ".join(parts)
        )


@dataclass(frozen=True)
class Schema:
    """What a notebook file declares about its parameters.

    Attributes:
        notebook: the notebook's stem.
        config: its Config class.
        cell: the parameters cell's values by name (UNSET for `...`), preset and out_dir included.
        help: the cell's trailing comment of each parameter.
    """

    notebook: str
    config: type[ExperimentConfig]
    cell: dict[str, Any]
    help: dict[str, str]

    @property
    def fixed(self) -> dict[str, Any]:
        """The Config fields the cell sets to a value of its own (not `...`)."""
        return {k: v for k, v in self.cell.items() if k not in RUNNER_KEYS and v is not UNSET}


def read_schema(path: str | Path) -> Schema:
    """A notebook's Config (from its metadata) and its parameters cell, checked against each other.

    Raises:
        ParameterError: no Config named, one that does not import, a parameters cell that is not
            literals, or one whose names are not preset, out_dir and the Config's fields.
    """
    import nbformat
    import papermill

    path = Path(path)
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as exc:  # any unreadable file is the same error for the user
        raise ParameterError(f"{path.stem}: cannot read {path} ({type(exc).__name__}: {exc})") from None
    name = (nb.metadata.get(METADATA_KEY) or {}).get("config")
    if not name:
        raise ParameterError(
            f"{path.stem}: the notebook names no parameter schema: set its metadata "
            f'{METADATA_KEY}.config = "package.module:Class" (an ExperimentConfig; notebooks/README.md)'
        )
    try:
        cls = config_class(name)
    except ParameterError as exc:
        raise ParameterError(f"{path.stem}: metadata {METADATA_KEY}.{exc}") from None
    declared = papermill.inspect_notebook(str(path))
    cell, help_ = {}, {}
    for key, info in declared.items():
        try:
            cell[key] = ast.literal_eval(info["default"])
        except (ValueError, SyntaxError):
            raise ParameterError(
                f"{path.stem}: parameter {key} = {info['default']} is not a literal (the parameters cell holds literals only)"
            ) from None
        help_[key] = info.get("help") or ""
    check_declared(path.stem, cls, cell)
    return Schema(path.stem, cls, cell, help_)


def _field_of(message: str, names: set[str]) -> str | None:
    """The Config field an error message starts with ("op_overrides.gdn_decode.targets: ..." -> op_overrides)."""
    head = message.split(":", 1)[0].strip()
    top = head.split(".", 1)[0].split("[", 1)[0]
    return top if top in names else None


def resolve(
    config: type[ExperimentConfig],
    notebook: str,
    *,
    preset: Preset | None = None,
    given: Mapping[str, Any] | None = None,
    given_source: Mapping[str, str] | None = None,
) -> ExperimentConfig:
    """Build a notebook's Config: `given` (not `...`), else the preset's value, else the default.

    Args:
        config: the notebook's Config class.
        notebook: the notebook's stem (its entry in the preset).
        preset: the preset, or None when every field is given or left to its default.
        given: values set by the caller (the cell's own values, `-p`); UNSET entries are not set.
        given_source: {field: where its given value came from} for messages (default "the notebook").

    Returns:
        The Config, every value checked.

    Raises:
        ParameterError: "<notebook>: <field>: <what is wrong> (<field>=<value> from <where>; ...)":
            the notebook, the parameter, the value given and what is accepted.
    """
    names = set(field_names(config))
    given = {k: v for k, v in (given or {}).items() if v is not UNSET}
    unknown = sorted(set(given) - names)
    if unknown:
        raise ParameterError(
            f"{notebook}: {', '.join(unknown)} not parameters of {config_name(config)}; accepted: {', '.join(sorted(names))}"
        )
    from_preset = preset.for_notebook(notebook) if preset is not None else {}
    values, sources = {}, {}
    for name in field_names(config):
        if name in given:
            values[name], sources[name] = given[name], (given_source or {}).get(name, "the notebook")
        elif name in from_preset:
            values[name], sources[name] = from_preset[name], preset.source(notebook, name)
    try:
        return config(**values)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        field = _field_of(message, names)
        if field is not None and field in values:
            where = f"{field}={values[field]!r} from {sources[field]}"
        elif field is not None:
            where = f"{field} is the default"
        else:
            where = "values from " + ", ".join(sorted(set(sources.values()))) if sources else "defaults"
        raise ParameterError(f"{notebook}: {message} ({where}; the parameters: {config_name(config)})") from None


def injected(cfg: ExperimentConfig, preset: str, out_dir: str | Path) -> dict[str, Any]:
    """What the runner injects into a notebook: preset, out_dir and every field of its Config, as plain values."""
    return {"preset": str(preset), "out_dir": str(out_dir), **cfg.plain()}
