"""Which code produced a result: a hash of gdn_lab's source, the notebook's, and git's view of them.

`code_version()` identifies the lab's code whatever way it is installed: the SHA-256 of every
`gdn_lab/**/*.py` (a wheel, a checkout, PYTHONPATH), plus the git commit and a dirty flag when the
package sits in a git work tree (`gdn_lab.environment.provenance`). The hash, not the commit, is
what `--resume` compares: a dirty tree has one commit for many versions of the code. `notebook_version(path)` adds the notebook file itself: the suite
runner's `--resume` reruns a notebook whose code or notebook changed.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any

from gdn_lab import __version__, package_data

ENVIRONMENT_KEYS = ("platform", "device", "arch", "python", "torch", "triton", "fla", "aiter", "flydsl")


@cache
def source_hash(package: Path = package_data.PACKAGE) -> str:
    """SHA-256 (hex) of gdn_lab's Python sources: their paths and bytes, in sorted order."""
    h = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts):
        h.update(path.relative_to(package).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def git_state() -> dict[str, Any]:
    """{"commit", "dirty"} of the checkout gdn_lab was imported from (`gdn_lab.environment.provenance`)."""
    from gdn_lab.environment import provenance

    p = provenance()
    return {"commit": p.get("gdn_lab_commit"), "dirty": p.get("gdn_lab_dirty")}


def code_version() -> dict[str, Any]:
    """{"gdn_lab": version, "source": 12-hex source hash, "commit", "dirty"}."""
    return {"gdn_lab": __version__, "source": source_hash()[:12], **git_state()}


def describe(version: dict[str, Any] | None) -> str:
    """One line: "source 1a2b3c4d5e6f (git 8e6c2d2, dirty)"."""
    if not version:
        return "unknown"
    git = ""
    if version.get("commit"):
        git = f" (git {version['commit'][:7]}{', dirty' if version.get('dirty') else ''})"
    return f"source {version.get('source')}{git}"


def notebook_version(path: str | Path) -> str:
    """12 hex digits identifying gdn_lab's source together with one notebook file."""
    h = hashlib.sha256(source_hash().encode())
    h.update(Path(path).read_bytes())
    return h.hexdigest()[:12]


def environment_key(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint fields a result depends on (device, arch, library versions)."""
    return {k: fingerprint.get(k) for k in ENVIRONMENT_KEYS}
