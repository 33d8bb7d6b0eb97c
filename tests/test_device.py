import pytest
import torch

from gdn_lab import device


@pytest.mark.parametrize(
    "arch, expected",
    [
        ("gfx942", torch.float8_e4m3fnuz),
        ("gfx950", torch.float8_e4m3fn),
        ("sm_90", torch.float8_e4m3fn),
        ("cpu", torch.float8_e4m3fn),
    ],
)
def test_fp8_dtype_per_arch(arch, expected):
    assert device.fp8_dtype_for(arch) == expected


def test_fp8_dtype_unknown_arch_names_accepted_ones():
    with pytest.raises(ValueError, match="gfx90a.*accepted: gfx942, gfx950"):
        device.fp8_dtype_for("gfx90a")


@pytest.mark.parametrize(
    "arch, dtype",
    [("gfx942", torch.float8_e4m3fn), ("gfx950", torch.float8_e4m3fnuz), ("sm_90", torch.float8_e4m3fnuz)],
)
def test_fp8_dtype_the_arch_does_not_have(arch, dtype):
    with pytest.raises(ValueError, match=rf"k_cache: .* is not an fp8 format of arch {arch}; accepted"):
        device.check_fp8_dtype("k_cache", dtype, arch)


def test_cpu_emulates_both_fp8_formats():
    for d in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        device.check_fp8_dtype("k_cache", d, "cpu")


def test_detect_cpu():
    info = device.detect("cpu")
    assert (info.platform, info.arch) == ("cpu", "cpu")
    assert info.num_sms == torch.get_num_threads()


def test_fingerprint_names_every_version_and_the_device():
    fp = device.fingerprint("cpu")
    for key in ("python", "torch", "triton", "fla", "aiter", "flydsl", "device", "arch", "platform", "num_sms"):
        assert key in fp
    assert fp["torch"] == torch.__version__
    assert fp["arch"] == "cpu"


def test_triton_mode_on_cpu_depends_on_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert device.triton_mode("cpu")[0] == "interpreter"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    mode, reason = device.triton_mode("cpu")
    assert mode is None and "TRITON_INTERPRET" in reason
