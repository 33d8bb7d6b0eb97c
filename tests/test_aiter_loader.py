"""The AITER loader: routes, reversibility, scoped shims, and a missing aiter as a reason.

Uses the installed amd-aiter wheel where present (the lab's extra `aiter-triton`), and small fake
`aiter` packages in tmp_path to exercise the AITER_TRITON_ONLY route, which the wheel predates.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap

import pytest
import torch

from gdn_lab import aiter_loader, routing
from gdn_lab.device import fingerprint

HAVE_AITER = aiter_loader.probe().installed
needs_aiter = pytest.mark.skipif(
    not HAVE_AITER, reason="amd-aiter is not installed (pip install 'gdn_lab[aiter-triton]')"
)


def aiter_modules() -> set[str]:
    return {n for n in sys.modules if n == "aiter" or n.startswith("aiter.")}


@pytest.fixture
def fresh_loader():
    """Start and end with nothing loaded, whatever the test did."""
    aiter_loader.unload()
    yield
    aiter_loader.unload()


class _HideAiter:
    """A meta-path finder that makes `aiter` unimportable, as on a machine without the wheel."""

    def find_spec(self, name, path=None, target=None):
        if name == "aiter" or name.startswith("aiter."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)")
        return None


def test_probe_is_cheap_and_names_a_route():
    before = aiter_modules()
    p = aiter_loader.probe()
    assert aiter_modules() == before  # the probe imports nothing
    if p.installed:
        expected = aiter_loader.ROUTE_OFFICIAL if torch.version.hip else p.route
        assert p.route == expected and p.route in aiter_loader.ROUTES
        assert p.version and p.location and p.route in p.reason
    else:
        assert p.route is None and "not installed" in p.reason


def test_missing_aiter_is_a_reason_not_a_crash(fresh_loader, monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [_HideAiter(), *sys.meta_path])
    p = aiter_loader.probe()
    assert not p.installed and "not installed" in p.reason and "aiter-triton" in p.reason
    ok, reason = aiter_loader.kernel_available("pa_decode")
    assert not ok and "not installed" in reason
    with pytest.raises(aiter_loader.AiterUnavailable, match="not installed"):
        aiter_loader.load("pa_decode")
    from gdn_lab.ops import spec

    decode = spec.get("decode_attention")

    args = decode.example(dtype=torch.float16)
    d = routing.decide("decode_attention", args, "aiter-triton-pa")
    assert d.backend is None and "not installed" in d.reason
    fp = fingerprint("cpu")
    assert fp["aiter_route"] is None and fp["aiter_arch"] is None


@needs_aiter
def test_load_and_unload_restore_sys_modules(fresh_loader):
    before = aiter_modules()
    module = aiter_loader.load("pa_decode", "gfx950")
    assert hasattr(module, "paged_attention_decode")
    loaded = aiter_loader.loaded()
    assert loaded is not None and loaded.route == aiter_loader.probe().route and loaded.arch == "gfx950"
    assert set(loaded.added) == aiter_modules() - before
    assert aiter_loader.load("pa_decode", "gfx950") is module  # loaded once
    aiter_loader.unload()
    assert aiter_modules() == before and aiter_loader.loaded() is None


@needs_aiter
@pytest.mark.skipif(bool(torch.version.hip), reason="on ROCm AITER dispatches for the device's own arch")
def test_another_arch_reloads(fresh_loader):
    first = aiter_loader.load("unified_attention", "gfx950")
    types = sys.modules["aiter.ops.triton.utils.types"]
    assert types.e4m3_dtype == torch.float8_e4m3fn  # AITER fixes its fp8 format at import, from the arch
    again = aiter_loader.load("unified_attention", "gfx942")
    assert again is not first and aiter_loader.loaded().arch == "gfx942"
    assert sys.modules["aiter.ops.triton.utils.types"].e4m3_dtype == torch.float8_e4m3fnuz


@needs_aiter
@pytest.mark.skipif(bool(torch.version.hip), reason="the shims are a no-op on ROCm")
def test_shims_answer_for_aiter_and_restore_everything(fresh_loader):
    import triton

    unified = aiter_loader.load("unified_attention", "gfx950")
    arch_info = sys.modules["aiter.ops.triton.utils._triton.arch_info"]
    device_info = sys.modules["aiter.ops.triton.utils.device_info"]
    original = (arch_info.get_arch, device_info.get_num_sms, unified.get_num_sms)
    driver_before = getattr(triton.runtime.driver, "_active", None)
    kernel = unified.kernel_unified_attention_2d
    assert "run" not in vars(kernel)
    with aiter_loader.shims("gfx942", 7):
        assert arch_info.get_arch() == "gfx942"
        assert unified.get_num_sms() == 7 and device_info.get_num_sms() == 7
        assert "run" in vars(kernel)
        if os.environ.get("TRITON_INTERPRET") == "1":
            assert triton.runtime.driver.active.get_current_target().arch == "gfx942"
        with aiter_loader.shims("gfx950", 3):  # nests
            assert arch_info.get_arch() == "gfx950" and unified.get_num_sms() == 3
        assert arch_info.get_arch() == "gfx942" and unified.get_num_sms() == 7
    assert (arch_info.get_arch, device_info.get_num_sms, unified.get_num_sms) == original
    assert "run" not in vars(kernel)
    assert getattr(triton.runtime.driver, "_active", None) is driver_before
    with pytest.raises(RuntimeError, match="boom"), aiter_loader.shims("gfx950", 5):
        raise RuntimeError("boom")
    assert (arch_info.get_arch, unified.get_num_sms) == original[::2]
    assert getattr(triton.runtime.driver, "_active", None) is driver_before


@needs_aiter
@pytest.mark.skipif(bool(torch.version.hip), reason="the shims are a no-op on ROCm")
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

    aiter_loader.load("pa_decode", "gfx950")
    fake = type(sys)("aiter.ops.triton._gdn_lab_fake")
    fake.kernel = Recorder("aiter.ops.triton._gdn_lab_fake")
    other = Recorder("not_aiter.kernels")
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    with aiter_loader.shims("gfx950", 4):
        fake.kernel[(1,)](0, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2, num_warps=4)
        other[(1,)](0, waves_per_eu=2, num_warps=4)
    assert fake.kernel.seen == {"num_warps": 4}
    assert other.seen == {"waves_per_eu": 2, "num_warps": 4}
    assert "run" not in vars(fake.kernel)


def test_fingerprint_records_the_route():
    fp = fingerprint("cpu")
    for key in ("aiter", "aiter_route", "aiter_route_note", "aiter_arch", "aiter_num_cus"):
        assert key in fp
    if HAVE_AITER and not torch.version.hip:
        assert fp["aiter_arch"] == "gfx950" and fp["aiter_num_cus"] == 256  # MI350X's CUs on the CPU
        with aiter_loader.emulate("gfx942"):
            assert fingerprint("cpu")["aiter_num_cus"] == 80  # MI308X


def test_row_arch_names_the_emulated_arch_for_aiter_triton_rows_only():
    with aiter_loader.emulate("gfx942"):
        expected = None if torch.version.hip else "gfx942"
        assert aiter_loader.row_arch("aiter-triton-pa") == expected
        assert aiter_loader.row_arch("triton") is None


def test_emulation_validates_and_nests():
    with pytest.raises(ValueError, match="arch"):
        aiter_loader.Emulation("gfx90a")
    with pytest.raises(ValueError, match="num_cus"):
        aiter_loader.Emulation("gfx950", 0)
    outer = aiter_loader.current_emulation()
    with aiter_loader.emulate("gfx942", 12):
        with aiter_loader.emulate("gfx950"):
            assert aiter_loader.current_emulation() == aiter_loader.Emulation("gfx950", None)
        assert aiter_loader.effective_num_cus("cpu") == 12
    assert aiter_loader.current_emulation() == outer


def _fake_aiter(root, init_body: str) -> None:
    """A minimal aiter package: the submodules the loader and shims import, and one kernel module."""
    files = {
        "aiter/__init__.py": init_body,
        "aiter/ops/__init__.py": "",
        "aiter/ops/triton/__init__.py": "",
        "aiter/ops/triton/utils/__init__.py": "",
        "aiter/ops/triton/utils/_triton/__init__.py": "",
        "aiter/ops/triton/utils/_triton/arch_info.py": "def get_arch():\n    raise RuntimeError('no driver')\n",
        "aiter/ops/triton/utils/device_info.py": "def get_num_sms():\n    raise RuntimeError('no cuda')\n",
        "aiter/ops/triton/pa_decode.py": textwrap.dedent(
            """
            import os
            from aiter.ops.triton.utils._triton import arch_info
            TRITON_ONLY_AT_IMPORT = os.environ.get("AITER_TRITON_ONLY")
            ARCH_AT_IMPORT = arch_info.get_arch()
            """
        ),
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.skipif(bool(torch.version.hip), reason="ROCm takes the official route")
def test_triton_only_route_when_the_init_supports_it(fresh_loader, tmp_path, monkeypatch):
    _fake_aiter(
        tmp_path,
        "import os\nif os.environ.get('AITER_TRITON_ONLY') != '1':\n    raise ImportError('needs ROCm')\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert aiter_loader.probe().route == aiter_loader.ROUTE_TRITON_ONLY
    before_env = os.environ.get("AITER_TRITON_ONLY")
    module = aiter_loader.load("pa_decode", "gfx942")
    assert module.__file__.startswith(str(tmp_path))
    assert module.TRITON_ONLY_AT_IMPORT == "1" and module.ARCH_AT_IMPORT == "gfx942"
    assert os.environ.get("AITER_TRITON_ONLY") == before_env  # set for the import only
    assert aiter_loader.loaded().route == aiter_loader.ROUTE_TRITON_ONLY
    assert fingerprint("cpu")["aiter_route"] == aiter_loader.ROUTE_TRITON_ONLY


@pytest.mark.skipif(bool(torch.version.hip), reason="ROCm takes the official route")
def test_failed_triton_only_import_falls_back_to_the_bypass_and_says_so(fresh_loader, tmp_path, monkeypatch):
    _fake_aiter(tmp_path, "# mentions AITER_TRITON_ONLY but fails anyway\nraise ImportError('C++ ops')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    module = aiter_loader.load("pa_decode", "gfx950")
    assert module.ARCH_AT_IMPORT == "gfx950"
    loaded = aiter_loader.loaded()
    assert loaded.route == aiter_loader.ROUTE_BYPASS and "C++ ops" in loaded.note
    assert fingerprint("cpu")["aiter_route_note"] == loaded.note


@pytest.mark.skipif(bool(torch.version.hip), reason="ROCm takes the official route")
def test_later_aiter_layout_is_found(fresh_loader, tmp_path, monkeypatch):
    _fake_aiter(tmp_path, "")
    old = tmp_path / "aiter/ops/triton/pa_decode.py"
    new = tmp_path / "aiter/ops/triton/attention/pa_decode.py"
    new.parent.mkdir()
    (new.parent / "__init__.py").write_text("")
    old.rename(new)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert aiter_loader.load("pa_decode", "gfx950").__name__ == "aiter.ops.triton.attention.pa_decode"


@pytest.mark.skipif(bool(torch.version.hip), reason="ROCm takes the official route")
def test_a_kernel_that_does_not_import_is_a_remembered_reason(fresh_loader, tmp_path, monkeypatch):
    _fake_aiter(tmp_path, "")
    (tmp_path / "aiter/ops/triton/mha.py").write_text("raise ValueError('incompatible triton')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    ok, reason = aiter_loader.kernel_available("mha")
    assert not ok and "incompatible triton" in reason
    with pytest.raises(aiter_loader.AiterUnavailable, match="incompatible triton"):
        aiter_loader.load("mha", "gfx950")
    assert "aiter.ops.triton.mha" not in sys.modules
    assert aiter_loader.load("pa_decode", "gfx950").ARCH_AT_IMPORT == "gfx950"  # the others still load
