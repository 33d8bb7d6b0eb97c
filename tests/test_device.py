import os

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


def test_device_fields_are_the_devices_part_of_the_fingerprint():
    fp = device.device_fields("cpu")
    for key in ("platform", "device", "arch", "num_sms", "fp8_dtype", "triton_mode", "triton_interpret"):
        assert key in fp
    assert fp["arch"] == "cpu" and fp["triton_interpret"] == device.interpreting()
    assert fp["triton_mode"] == device.triton_mode("cpu")[0]
    versions = device.package_versions()
    assert versions["torch"] == torch.__version__ and "gdn_lab" not in versions  # gdn_lab's: environment.py
    assert not hasattr(device, "fingerprint")  # composed above: gdn_lab.environment.fingerprint


def test_triton_mode_on_cpu_depends_on_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert device.triton_mode("cpu")[0] == "interpreter"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    mode, reason = device.triton_mode("cpu")
    assert mode is None and "TRITON_INTERPRET" in reason


@pytest.mark.parametrize("value", ["1", "0", "", "true", "TRUE", "on", "yes", "y", "2", "off", "false", " 1", "t"])
def test_interpreting_reads_the_variable_as_triton_does(monkeypatch, value):
    knobs = pytest.importorskip("triton.knobs")
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert device.interpreting() is bool(knobs.runtime.interpret)


def test_triton_mode_without_triton(monkeypatch):
    monkeypatch.setattr(device, "triton_installed", lambda: False)
    assert device.triton_mode("cpu") == (None, "triton is not installed")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_triton_mode_on_a_gpu():
    mode, reason = device.triton_mode("cuda")
    assert mode == "gpu" and device.platform_of("cuda") in reason


def test_interpreter_default_sets_it_on_the_cpu_only_when_unset(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert device.interpreter_default("cuda") is False and "TRITON_INTERPRET" not in os.environ
    assert device.interpreter_default("cpu") is True and os.environ["TRITON_INTERPRET"] == "1"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert device.interpreter_default("cpu") is False and os.environ["TRITON_INTERPRET"] == "0"


def test_one_function_decides_for_every_backend_check(monkeypatch):
    """The backend-facing checks are built on device.triton_mode and device.interpreting."""
    from gdn_lab.ops import fla_support, triton_support
    from gdn_lab.ops.gdn_decode import triton as gdn_decode_triton

    assert triton_support.interpreting is device.interpreting  # kernel modules import it from there
    for value in ("1", "0"):
        monkeypatch.setenv("TRITON_INTERPRET", value)
        mode, reason = device.triton_mode()
        assert triton_support.triton_available() == (mode is not None, reason)
        assert gdn_decode_triton.available() == (mode is not None, reason)
        q = torch.zeros(1, 1, 16)
        assert triton_support.triton_device({"q": q}, "q") == (
            device.triton_mode("cpu")[0] is not None,
            device.triton_mode("cpu")[1],
        )
        ok, why = fla_support.covered_recurrent({"q": q})
        assert ok == (device.triton_mode("cpu")[0] is not None)
        if not ok:
            assert why == device.triton_mode("cpu")[1]
