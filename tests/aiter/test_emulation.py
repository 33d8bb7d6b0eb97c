"""gdn_lab.aiter.emulation: the arch and CU count AITER is told off ROCm; validated, scoped, nesting."""

from __future__ import annotations

import pytest
import torch

from gdn_lab import aiter

off_rocm = pytest.mark.skipif(bool(torch.version.hip), reason="on ROCm AITER dispatches for the device's own arch")


def test_emulation_validates_and_nests():
    with pytest.raises(ValueError, match="arch"):
        aiter.Emulation("gfx90a")
    with pytest.raises(ValueError, match="num_cus"):
        aiter.Emulation("gfx950", 0)
    outer = aiter.current_emulation()
    assert outer == aiter.Emulation() and not aiter.emulating()
    with aiter.emulate("gfx942", 12):
        assert aiter.emulating()
        with aiter.emulate("gfx950"):
            assert aiter.current_emulation() == aiter.Emulation("gfx950", None)
        assert aiter.effective_num_cus("cpu") == 12
    assert aiter.current_emulation() == outer and not aiter.emulating()


def test_emulation_is_restored_when_the_block_raises():
    with pytest.raises(RuntimeError, match="boom"), aiter.emulate("gfx942"):
        raise RuntimeError("boom")
    assert aiter.current_emulation().arch == aiter.DEFAULT_ARCH and not aiter.emulating()


@off_rocm
def test_default_is_gfx950_with_the_emulated_devices_cus_on_the_cpu():
    assert aiter.effective_arch("cpu") == aiter.DEFAULT_ARCH == "gfx950"
    assert aiter.effective_num_cus("cpu") == aiter.EMULATED_DEVICES["gfx950"].num_cus == 256  # MI350X
    with aiter.emulate("gfx942"):
        assert aiter.effective_arch("cpu") == "gfx942"
        assert aiter.effective_num_cus("cpu") == 80  # MI308X


@pytest.mark.skipif(not torch.cuda.is_available() or bool(torch.version.hip), reason="needs an NVIDIA GPU")
def test_on_a_gpu_the_default_cu_count_is_the_gpus_own():
    from gdn_lab.device import detect

    assert aiter.effective_num_cus("cuda") == detect("cuda").num_sms
