"""The loader's ROCm-only kernels and the interpreter's tl.assume shim."""

from __future__ import annotations

import os

import pytest
import torch

from gdn_lab import aiter

off_rocm = pytest.mark.skipif(bool(torch.version.hip), reason="off ROCm only")


def test_every_rocm_only_kernel_has_a_module():
    assert set(aiter.KERNEL_MODULES) >= aiter.ROCM_ONLY
    assert {"pa_decode", "unified_attention", "mha", "gemm_a16w16", "gdn_decode_triton"}.isdisjoint(aiter.ROCM_ONLY)


@off_rocm
@pytest.mark.parametrize("kernel", sorted(aiter.ROCM_ONLY))
def test_rocm_only_kernels_are_refused_off_rocm_without_importing(kernel, fresh_loader, aiter_modules):
    before = aiter_modules()
    with pytest.raises(aiter.AiterUnavailable, match="runs on ROCm"):
        aiter.load(kernel)
    ok, why = aiter.kernel_available(kernel)
    assert not ok and "torch.version.hip is None" in why
    assert aiter_modules() == before and aiter.loaded() is None


@off_rocm
@pytest.mark.skipif(not aiter.probe().installed, reason="amd-aiter is not installed")
def test_assume_is_a_hint_inside_the_shims_under_the_interpreter(fresh_loader):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only")
    from triton.runtime import interpreter

    aiter.load("gemm_a16w16", "gfx950")
    original = interpreter.InterpreterBuilder.create_assume
    with aiter.shims("gfx950", 1):
        assert interpreter.InterpreterBuilder.create_assume(None, False) is None
        with aiter.shims("gfx942", 1):  # nests
            assert interpreter.InterpreterBuilder.create_assume(None, False) is None
        assert interpreter.InterpreterBuilder.create_assume is not original
    assert interpreter.InterpreterBuilder.create_assume is original
    with pytest.raises(AssertionError):
        original(None, False)
