"""Our Triton kernel modules load on a backend's first run, never when ops register or route.

Only kernel modules (`*triton_kernels.py` and the helpers they share) import triton at module
level; registering every op and explaining its routing imports none of them. (triton itself may
be loaded by then: AITER's probe loads AITER's Triton kernels under the interpreter.)
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import gdn_lab.ops

OPS = Path(gdn_lab.ops.__file__).parent
SHARED_KERNEL_MODULES = ("delta_rule_triton", "paged_kv_triton", "triton_common")


def _is_kernel_module(name: str) -> bool:
    return name.split(".")[-1].endswith("triton_kernels") or name.split(".")[-1] in SHARED_KERNEL_MODULES


def _module_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_kernel_modules_import_triton_at_load():
    offenders = {}
    for path in sorted(OPS.rglob("*.py")):
        if _is_kernel_module(path.stem):
            continue
        bad = {m for m in _module_level_imports(path) if m.split(".")[0] == "triton" or _is_kernel_module(m)}
        if bad:
            offenders[str(path.relative_to(OPS))] = sorted(bad)
    assert not offenders


def test_registering_and_routing_load_no_kernel_module():
    code = (
        "import sys, gdn_lab.ops, gdn_lab.routing as r\n"
        "from gdn_lab.ops import spec\n"
        "for op in spec.names(): r.explain(op)\n"
        f"bad = [m for m in sys.modules if m.startswith('gdn_lab.') and (m.endswith('triton_kernels')"
        f" or m.split('.')[-1] in {SHARED_KERNEL_MODULES!r})]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
