"""A tiny suite for the runner's tests: a Config module and notebooks that name it, in tmp_path.

The runner imports each notebook's Config at plan time and the notebooks' kernels import it in
`setup()`, so the module's folder goes on sys.path and on PYTHONPATH.
"""

from __future__ import annotations

import textwrap

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

CONFIG_MODULE = '''
from dataclasses import dataclass, field

from gdn_lab.experiments.config import ExperimentConfig, check, positive


@dataclass(frozen=True, kw_only=True)
class TinyConfig(ExperimentConfig):
    """A test notebook's parameters."""

    value: int = field(default=1, metadata=check(positive, "a positive number"))
    label: str | None = "x"
    sizes: tuple[int, ...] | None = (1, 2)
'''

PARAMS = (
    'preset = "x"  # the preset\n'
    'out_dir = "results/tiny"  # tables\n'
    "seed = ...  # seed\n"
    "device = ...  # where\n"
    "dtype = ...  # dtype\n"
    "value = ...  # a number\n"
    'label = "x"  # a label the notebook fixes\n'
    "sizes = ...  # sizes"
)

OK_BODY = (
    "import pandas as pd\n"
    "from gdn_lab.report.io import write_headline, write_table\n"
    "write_table(pd.DataFrame({'value': [value], 'status': ['compared']}), out_dir, 'numbers')\n"
    "write_headline(out_dir, 'nb', f'value is {value}')\n"
    "print('TRITON_INTERPRET', __import__('os').environ.get('TRITON_INTERPRET'))"
)

SETUP_BODY = (
    "from tiny_config import TinyConfig\n"
    "from gdn_lab.report.notebook import setup\n"
    'p = setup(TinyConfig, "01_first", preset=preset, out_dir=out_dir, seed=seed, device=device, dtype=dtype, '
    "value=value, label=label, sizes=sizes)\n"
    "from gdn_lab.report.io import write_headline\n"
    "write_headline(p.out, p.notebook, f'value is {p.config.value}')"
)


def write_notebook(path, *bodies, config="tiny_config:TinyConfig", params=PARAMS):
    cell = new_code_cell(params)
    cell.metadata["tags"] = ["parameters"]
    nb = new_notebook(cells=[cell, *(new_code_cell(b) for b in bodies)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if config:
        nb.metadata["gdn_lab"] = {"config": config}
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def tiny_config(tmp_path, monkeypatch):
    """tiny_config.TinyConfig, importable here and in the notebooks' kernels."""
    mod = tmp_path / "pkg"
    mod.mkdir()
    (mod / "tiny_config.py").write_text(textwrap.dedent(CONFIG_MODULE))
    monkeypatch.syspath_prepend(str(mod))
    # in front of the session's own PYTHONPATH (a machine may install its packages through it)
    from gdn_lab.report.runner import prepended

    monkeypatch.setenv("PYTHONPATH", prepended("PYTHONPATH", mod))
    return mod


@pytest.fixture
def suite(tmp_path, tiny_config):
    """(notebooks folder, preset file): 01 ok (through setup), 02 fails, 03 ok."""
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    write_notebook(nbs / "01_first.ipynb", SETUP_BODY, OK_BODY)
    write_notebook(nbs / "02_broken.ipynb", "raise ValueError('planted failure')")
    write_notebook(nbs / "03_last.ipynb", OK_BODY)
    preset = tmp_path / "tiny.yaml"
    preset.write_text(
        "description: test\nparameters:\n  device: cpu\n  value: 5\n  sizes: null\nnotebooks:\n  03_last:\n    value: 7\n"
    )
    return nbs, preset


@pytest.fixture
def notebook():
    """write_notebook(path, *cell bodies, config=..., params=...) and the bodies it takes, as a namespace."""
    from types import SimpleNamespace

    return SimpleNamespace(write=write_notebook, ok=OK_BODY, setup=SETUP_BODY, params=PARAMS)
