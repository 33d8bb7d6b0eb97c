"""gdn_lab.aiter.shims: AITER's arch/CU answers and AMD-only launch options, scoped to AITER and the block."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from gdn_lab import aiter

needs_aiter = pytest.mark.skipif(
    not aiter.probe().installed, reason="amd-aiter is not installed (pip install 'gdn_lab[aiter-triton]')"
)
off_rocm = pytest.mark.skipif(bool(torch.version.hip), reason="the shims are a no-op on ROCm")


@needs_aiter
@off_rocm
def test_shims_answer_for_aiter_and_restore_everything(fresh_loader):
    import triton

    unified = aiter.load("unified_attention", "gfx950")
    arch_info = sys.modules["aiter.ops.triton.utils._triton.arch_info"]
    device_info = sys.modules["aiter.ops.triton.utils.device_info"]
    original = (arch_info.get_arch, device_info.get_num_sms, unified.get_num_sms)
    driver_before = getattr(triton.runtime.driver, "_active", None)
    kernel = unified.kernel_unified_attention_2d
    assert "run" not in vars(kernel)
    with aiter.shims("gfx942", 7):
        assert arch_info.get_arch() == "gfx942"
        assert unified.get_num_sms() == 7 and device_info.get_num_sms() == 7
        assert "run" in vars(kernel)
        if os.environ.get("TRITON_INTERPRET") == "1":
            assert triton.runtime.driver.active.get_current_target().arch == "gfx942"
        with aiter.shims("gfx950", 3):  # nests
            assert arch_info.get_arch() == "gfx950" and unified.get_num_sms() == 3
        assert arch_info.get_arch() == "gfx942" and unified.get_num_sms() == 7
    assert (arch_info.get_arch, device_info.get_num_sms, unified.get_num_sms) == original
    assert "run" not in vars(kernel)
    assert getattr(triton.runtime.driver, "_active", None) is driver_before
    with pytest.raises(RuntimeError, match="boom"), aiter.shims("gfx950", 5):
        raise RuntimeError("boom")
    assert (arch_info.get_arch, unified.get_num_sms) == original[::2]
    assert getattr(triton.runtime.driver, "_active", None) is driver_before


@needs_aiter
@off_rocm
def test_launch_option_shim_touches_aiter_kernels_only(fresh_loader, monkeypatch):
    from triton.runtime.jit import KernelInterface

    class Recorder(KernelInterface):
        def __init__(self, module):
            def kernel(x):
                return x

            kernel.__module__ = module
            self.fn = kernel
            self.seen = None

        def run(self, *args, grid, warmup, **kwargs):
            self.seen = kwargs

    aiter.load("pa_decode", "gfx950")
    fake = type(sys)("aiter.ops.triton._gdn_lab_fake")
    fake.kernel = Recorder("aiter.ops.triton._gdn_lab_fake")
    other = Recorder("not_aiter.kernels")
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    with aiter.shims("gfx950", 4):
        fake.kernel[(1,)](0, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2, num_warps=4)
        other[(1,)](0, waves_per_eu=2, num_warps=4)
    assert fake.kernel.seen == {"num_warps": 4}
    assert other.seen == {"waves_per_eu": 2, "num_warps": 4}
    assert "run" not in vars(fake.kernel)
    assert set(aiter.AMD_ONLY_LAUNCH_OPTIONS) == {"waves_per_eu", "matrix_instr_nonkdim", "kpack"}


@off_rocm
def test_the_stub_driver_follows_the_interpreter_setting(fresh_loader, monkeypatch):
    """Without aiter loaded and with the package not needed, only the driver is touched, and only
    under the interpreter (`gdn_lab.device.interpreting`)."""
    pytest.importorskip("triton")
    from triton.runtime import driver

    before = getattr(driver, "_active", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with aiter.shims("gfx942", need_package=False):
        assert driver.active.get_current_target().arch == "gfx942"
    assert getattr(driver, "_active", None) is before
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with aiter.shims("gfx942", need_package=False):
        assert getattr(driver, "_active", None) is before
