"""`gdn_lab.ops.triton_support`: Triton's contraction default, fixed before any kernel compiles."""

from __future__ import annotations

import os
import subprocess
import sys


def _default_after_import(value: str | None) -> str:
    """TRITON_DEFAULT_FP_FUSION in a fresh process that imports gdn_lab.ops, started with `value`."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_DEFAULT_FP_FUSION"}
    if value is not None:
        env["TRITON_DEFAULT_FP_FUSION"] = value
    code = "import os, gdn_lab.ops; print(os.environ.get('TRITON_DEFAULT_FP_FUSION'))"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()


def test_fp_fusion_default_is_set_once_the_backends_register():
    assert _default_after_import(None) == "1"


def test_fp_fusion_default_keeps_the_users_value():
    assert _default_after_import("0") == "0"
