"""gdn_decode `sglang-aiter` (SGLang's AiterGDNKernel routing among HIP, FlyDSL and Triton), without AMD hardware.

Test doubles stand in for the three kernels (`kernels=` seam): each records that it ran. The route
must be SGLang's (aiter_contracts.md 3.10): HIP for (HK, HV) = (2, 8) from batch 24 on gfx942 when
it loads, else FlyDSL, else Triton (dt_bias not bf16, or neither loads), and it must be the one
the backend's rule predicts, since the backend asks the rule.
"""

from __future__ import annotations

import pytest
import torch

from gdn_lab import aiter, routing
from gdn_lab.ops import aiter_native
from gdn_lab.ops.gdn_decode import sglang
from gdn_lab.rules import sglang_gdn
from gdn_lab.rules.base import RuleEnv

OP = "gdn_decode"


def recording(kernel_double, name, ran):
    """A double for one of the three kernels: it records its name and returns zeros shaped like its output."""

    def stub(*args, **kwargs):
        """Any call (each kernel's own marshalling is checked in its own test file)."""

    def emulate(args, kwargs):  # the stub's bound arguments
        ran.append(name)
        if name == "flydsl":
            return None  # writes into its `out` argument
        v = kwargs["v"]
        return torch.zeros((1, *v.shape) if name == "triton" else v.shape, dtype=v.dtype)

    return kernel_double(stub, emulate)


@pytest.fixture
def doubles(kernel_double):
    ran: list[str] = []
    return ran, {name: recording(kernel_double, name, ran) for name in sglang.KERNELS}


@pytest.mark.parametrize(
    ("arch", "batch", "heads", "bf16_gates", "loads", "expected"),
    [
        pytest.param("gfx942", 23, (2, 8, 128), True, ("hip", "flydsl", "triton"), "flydsl", id="gfx942-b23"),
        pytest.param("gfx942", 24, (2, 8, 128), True, ("hip", "flydsl", "triton"), "hip", id="gfx942-b24"),
        pytest.param("gfx950", 24, (2, 8, 128), True, ("hip", "flydsl", "triton"), "flydsl", id="gfx950-b24"),
        pytest.param("gfx942", 24, (4, 8, 128), True, ("hip", "flydsl", "triton"), "flydsl", id="heads-4-8"),
        pytest.param("gfx942", 24, (2, 8, 128), True, ("flydsl", "triton"), "flydsl", id="no-hip"),
        pytest.param("gfx942", 24, (2, 8, 128), True, ("triton",), "triton", id="neither"),
        pytest.param("gfx942", 24, (2, 8, 128), False, ("hip", "flydsl", "triton"), "triton", id="fp32-dt_bias"),
        pytest.param("gfx950", 4, (2, 8, 64), True, ("hip", "flydsl", "triton"), "triton", id="K64"),
    ],
)
def test_routes_as_sglang(gdn_decode_args, doubles, arch, batch, heads, bf16_gates, loads, expected):
    ran, kernels = doubles
    args = gdn_decode_args(batch, heads=heads, bf16_gates=bf16_gates)
    with aiter.emulate(arch):
        sglang.gdn_decode_sglang_aiter(**args, kernels={k: v for k, v in kernels.items() if k in loads})
        predicted = sglang.route(args, {k: k in loads for k in ("hip", "flydsl")})[1]
        rule = sglang_gdn.SglangGdnDecodeRule(hip_available="hip" in loads, fly_available="flydsl" in loads)
        assert predicted == rule.predict(args, 0, RuleEnv(arch, 1))
    assert ran == [expected]
    assert predicted.variant.split(":")[0] == expected


def test_the_rule_follows_the_machines_availability(gdn_decode_args, monkeypatch):
    args = gdn_decode_args(24, bf16_gates=True)
    env = RuleEnv("gfx942", 80)
    monkeypatch.setattr(sglang, "kernel_availability", lambda: {"hip": True, "flydsl": True})
    assert sglang.RULE.predict(args, 0, env).key == "hip"
    monkeypatch.setattr(sglang, "kernel_availability", lambda: {"hip": False, "flydsl": True})
    assert sglang.RULE.predict(args, 0, env).key.startswith("flydsl:wtk=")
    assert sglang.RULE.name == sglang_gdn.DECODE_RULE.name and sglang.RULE.source == sglang_gdn.DECODE_RULE.source


def test_registered_with_sglangs_rule():
    b = routing.get(OP, "sglang-aiter")
    assert b.library.name == "sglang-aiter" and b.library.amd and b.rule is sglang.RULE and not b.auto


@pytest.mark.skipif(bool(torch.version.hip), reason="off ROCm only")
def test_unavailable_off_rocm(gdn_decode_args):
    avail, _ = routing.get(OP, "sglang-aiter").check(gdn_decode_args(2))
    assert not avail[0] and "ROCm only" in avail[1]
    assert sglang.kernel_availability() == {"hip": False, "flydsl": False}


def test_covered_takes_sglangs_call_then_the_chosen_kernels_contract(gdn_decode_args, monkeypatch):
    args = gdn_decode_args(24, bf16_gates=True)
    ok, why = sglang.covered({**args, "scale": 0.5}, {"hip": True, "flydsl": True})
    assert not ok and "K ** -0.5" in why
    ok, why = sglang.covered({**args, "use_qk_l2norm": False}, {"hip": True, "flydsl": True})
    assert not ok and "use_qk_l2norm_in_kernel=True" in why
    with aiter.emulate("gfx942"):
        ok, why = sglang.covered(args, {"hip": True, "flydsl": True})  # CPU tensors: HIP's own contract says no
        assert not ok and "SGLang routes to hip" in why and "GPU" in why
        monkeypatch.setattr(aiter_native, "on_device", lambda args, tensor: (True, ""))
        ok, why = sglang.covered(args, {"hip": True, "flydsl": True})
        assert ok and why.startswith("hip: ") and "batch 24 >= 24" in why
