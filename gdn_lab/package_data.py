"""Where the lab's data files are: presets, notebooks and the tables the dispatch rules read.

One copy of each lives in the repository, where users edit and open them (`notebooks/`,
`data/presets/`, `data/aiter/`). A wheel carries them inside the package (`gdn_lab/_data/<kind>/`,
copied at build time by setup.py), so an installed gdn_lab runs from any directory. `path(kind)`
returns the wheel's copy when there is one, else the checkout's folder (an editable install or
PYTHONPATH).

Example:
    >>> path("presets").name
    'presets'
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
BUNDLED = PACKAGE / "_data"
# kind -> (folder in the repository, the files a wheel carries); setup.py reads this table.
LAYOUT: dict[str, tuple[str, str]] = {
    "notebooks": ("notebooks", "[0-9][0-9]_*.ipynb"),
    "presets": ("data/presets", "*.yaml"),
    "aiter": ("data/aiter", "*.csv"),
}


def path(kind: str) -> Path:
    """The folder holding one kind of data file ("notebooks", "presets", "aiter").

    Raises:
        ValueError: an unknown kind (the message lists the kinds).
    """
    if kind not in LAYOUT:
        raise ValueError(f"kind: {kind!r} is not accepted; expected one of {', '.join(LAYOUT)}")
    bundled = BUNDLED / kind
    return bundled if bundled.is_dir() else PACKAGE.parent / LAYOUT[kind][0]


def source_root() -> Path:
    """The folder that holds the `gdn_lab` package (a checkout's root, or site-packages)."""
    return PACKAGE.parent
