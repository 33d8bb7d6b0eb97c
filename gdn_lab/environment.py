"""The environment fingerprint every result table carries, composed from the packages it asks.

`fingerprint(device)` is one flat dict, so runs from two machines join on it:

- package versions and the device's facts (`gdn_lab.device`: platform, name, arch, SM/CU count,
  fp8 dtype, CUDA/HIP, how Triton runs there, TRITON_INTERPRET, OS, Python executable);
- gdn_lab's provenance (`provenance()`): its version, the git commit of the checkout it was
  imported from and whether that checkout has changes, and the folder it was imported from, also
  when it runs from PYTHONPATH without an install;
- how AITER's Triton kernels load here (`aiter_fields()`, from `gdn_lab.aiter`): the route, the
  arch AITER is told and the CU count it sees, and whether that is the default emulation.

It sits above `device` and `aiter` (it asks both), beside the experiments and the report, which
use it; nothing below imports it. Everything is cheap and never raises.

Example:
    >>> fp = fingerprint("cpu")
    >>> fp["arch"], "gdn_lab_commit" in fp
    ('cpu', True)
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
from pathlib import Path

import torch

import gdn_lab
from gdn_lab import aiter
from gdn_lab.device import device_fields, package_versions
from gdn_lab.rules import aiter_pa_ragged

# Git variables that would point `git -C <root>` at another repository (set inside git hooks).
_GIT_VARIABLES = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR", "GIT_OBJECT_DIRECTORY")
GIT_TIMEOUT_S = 5.0


def package_dir() -> Path:
    """The folder the running gdn_lab was imported from (a checkout's gdn_lab/, or site-packages/gdn_lab)."""
    return Path(gdn_lab.__file__).resolve().parent


def _git(root: Path, *args: str) -> str | None:
    """stdout of `git -C root args...`, or None when git is missing, fails or times out."""
    env = {k: v for k, v in os.environ.items() if k not in _GIT_VARIABLES}
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _checkout_root(pkg: Path) -> Path | None:
    """The git work tree whose top level holds `pkg` (…/repo/gdn_lab), or None.

    A package installed into a venv that happens to live inside a checkout is not that checkout's
    code: the work tree's top level must be the package's parent folder.
    """
    top = _git(pkg.parent, "rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != pkg.parent:
        return None
    return pkg.parent


def _installed_commit(pkg: Path) -> str | None:
    """The commit pip recorded (PEP 610 direct_url.json, `pip install git+URL`) for this very copy."""
    try:
        dist = importlib.metadata.distribution("gdn_lab")
        here = Path(str(dist.locate_file("gdn_lab/__init__.py"))).resolve()
        if here != pkg / "__init__.py":
            return None  # metadata of another copy (e.g. an install shadowed by PYTHONPATH)
        text = dist.read_text("direct_url.json")
        commit = json.loads(text).get("vcs_info", {}).get("commit_id") if text else None
        return str(commit) if commit else None
    except Exception:  # provenance must never fail a run
        return None


def provenance() -> dict[str, object]:
    """gdn_lab's part of the fingerprint.

    Returns:
        gdn_lab: the version of the imported code (`gdn_lab.__version__`);
        gdn_lab_commit: `git rev-parse HEAD` of the checkout gdn_lab was imported from (editable
            install or PYTHONPATH), else the commit pip recorded for a VCS install, else None
            (an installed wheel, a copy without .git);
        gdn_lab_dirty: whether `git status --porcelain` lists anything in that checkout (changed,
            staged or untracked files that are not ignored); None when there is no checkout;
        gdn_lab_path: the folder gdn_lab was imported from.

    A copy of a checkout sent elsewhere (a GPU machine that receives the working tree with another
    checkout's history, or none) states its code with GDN_LAB_COMMIT and GDN_LAB_DIRTY (0/1),
    which win over what git says there.
    """
    pkg = package_dir()
    commit: str | None = None
    dirty: bool | None = None
    root = _checkout_root(pkg)
    if os.environ.get("GDN_LAB_COMMIT"):
        commit = os.environ["GDN_LAB_COMMIT"]
        dirty = os.environ.get("GDN_LAB_DIRTY") not in (None, "", "0")
    elif root is not None:
        head = _git(root, "rev-parse", "HEAD")
        commit = head.strip() if head else None
        status = _git(root, "status", "--porcelain")
        dirty = None if status is None else bool(status.strip())
    else:
        commit = _installed_commit(pkg)
    return {
        "gdn_lab": getattr(gdn_lab, "__version__", None),
        "gdn_lab_commit": commit,
        "gdn_lab_dirty": dirty,
        "gdn_lab_path": str(pkg),
    }


def aiter_fields(device: torch.device | str | None = None) -> dict[str, object]:
    """AITER's part of the fingerprint (its version is `package_versions()["aiter"]`).

    Returns:
        aiter_route: the route the loads took, or the one they would take (None: no aiter);
        aiter_route_note: why the route taken differs from the probe's ("" when it does not);
        aiter_arch: the arch AITER dispatches for: the device's on ROCm, else the emulated one;
        aiter_num_cus: the CU count its heuristics see;
        aiter_emulation: "native" on ROCm, "default" off ROCm outside any `aiter.emulate()`
            block (gfx950, the GPU's own CUs or the MI350X's on the CPU), "emulate()" inside one.
        The last three are None when aiter is not installed.
    """
    p = aiter.probe()
    route, note = aiter.current_route()
    arch: str | None = None
    cus: int | None = None
    emulation: str | None = None
    if p.installed:
        try:
            arch, cus = aiter.effective_arch(device), aiter.effective_num_cus(device)
        except Exception:  # the fingerprint must never fail
            arch, cus = None, None
        emulation = "native" if aiter.on_rocm() else ("emulate()" if aiter.emulating() else "default")
    return {
        "aiter_route": route,
        "aiter_route_note": note,
        "aiter_arch": arch,
        "aiter_num_cus": cus,
        "aiter_emulation": emulation,
    }


def fingerprint(device: torch.device | str | None = None) -> dict[str, object]:
    """The environment fingerprint every result table carries, so runs from two machines join.

    Args:
        device: the device the run uses (default: the current accelerator, else the CPU).

    Returns:
        A flat dict: package versions (python, torch, triton, fla, aiter, flydsl), gdn_lab's
        provenance (`provenance()`), the device's facts (`gdn_lab.device.device_fields`) and
        AITER's route and emulation (`aiter_fields()`), and `aiter_pa_ragged_max_context`: the
        deployment the `aiter` decode backend runs as (SGLang's context_len, which fixes
        paged_attention_ragged's max_num_partitions; `gdn_lab.rules.aiter_pa_ragged.deployment`).
    """
    fp: dict[str, object] = dict(package_versions())
    fp.update(provenance())
    fp.update(device_fields(device))
    fp.update(aiter_fields(device))
    fp["aiter_pa_ragged_max_context"] = aiter_pa_ragged.current_deployment().max_context
    return fp


def notes(fp: dict[str, object]) -> dict[str, str]:
    """What a reader needs beside some fingerprint values (for `gdn-lab env`): key -> note.

    Example:
        >>> notes({"aiter_route": "init-bypass", "aiter_arch": "gfx950", "aiter_num_cus": 256,
        ...        "aiter_emulation": "default", "platform": "cpu", "gdn_lab_commit": "abc"})["aiter_arch"]
        'default emulation off ROCm: no aiter.emulate() block is active'
    """
    out: dict[str, str] = {}
    emulation, arch = fp.get("aiter_emulation"), fp.get("aiter_arch")
    if emulation == "default":
        out["aiter_arch"] = "default emulation off ROCm: no aiter.emulate() block is active"
        if fp.get("platform") == "cpu":
            name = aiter.EMULATED_DEVICES[arch].name if arch in aiter.EMULATED_DEVICES else "the emulated device"
            out["aiter_num_cus"] = f"{name}'s CUs: the default emulation on the CPU"
        else:
            out["aiter_num_cus"] = "this GPU's own count: the default emulation"
    elif emulation == "emulate()":
        out["aiter_arch"] = out["aiter_num_cus"] = "set by an active aiter.emulate() block"
    elif emulation == "native":
        out["aiter_arch"] = "the device's own (ROCm: no emulation)"
    elif fp.get("aiter_route") is None:
        out["aiter_arch"] = "aiter is not installed"
    if fp.get("gdn_lab_commit") is None:
        out["gdn_lab_commit"] = "not a git checkout (an installed wheel, or a copy without .git)"
    return out
