"""gdn_lab.aiter.loader: routes, reversibility, remembered failures, and a missing aiter as a reason.

Uses the installed amd-aiter wheel where present (the lab's extra `aiter-triton`), and small fake
`aiter` packages (the `fake_aiter` fixture) to exercise the AITER_TRITON_ONLY route, which the
wheel predates, and later aiter layouts.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

from gdn_lab import aiter, environment, routing

needs_aiter = pytest.mark.skipif(
    not aiter.probe().installed, reason="amd-aiter is not installed (pip install 'gdn_lab[aiter-triton]')"
)
off_rocm = pytest.mark.skipif(bool(torch.version.hip), reason="ROCm takes the official route")


def test_missing_aiter_is_a_reason_not_a_crash(fresh_loader, hide_aiter):
    ok, reason = aiter.kernel_available("pa_decode")
    assert not ok and "not installed" in reason
    with pytest.raises(aiter.AiterUnavailable, match="not installed"):
        aiter.load("pa_decode")
    from gdn_lab.ops import spec

    args = spec.get("decode_attention").example(dtype=torch.float16)
    d = routing.decide("decode_attention", args, "aiter-triton-pa")
    assert d.backend is None and "not installed" in d.reason
    assert aiter.current_route() == (None, "")
    fp = environment.fingerprint("cpu")
    assert fp["aiter_route"] is None and fp["aiter_arch"] is None


def test_bad_kernel_or_arch_names_the_accepted_ones(fresh_loader):
    with pytest.raises(ValueError, match="kernel.*pa_decode"):
        aiter.load("nope")
    if not torch.version.hip:
        with pytest.raises(ValueError, match="arch.*gfx950"):
            aiter.load("pa_decode", "gfx90a")


def test_kernel_available_asks_where_triton_runs(fresh_loader, monkeypatch):
    """A device where Triton does not run is the reason, from `device.triton_mode`, before any import."""
    from gdn_lab.device import triton_mode

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    ok, reason = aiter.kernel_available("pa_decode", "cpu")
    assert not ok
    if aiter.probe().installed:
        assert reason == triton_mode("cpu")[1] and aiter.loaded() is None


@needs_aiter
def test_load_and_unload_restore_sys_modules(fresh_loader, aiter_modules):
    before = aiter_modules()
    module = aiter.load("pa_decode", "gfx950")
    assert hasattr(module, "paged_attention_decode")
    loaded = aiter.loaded()
    assert loaded is not None and loaded.route == aiter.probe().route and loaded.arch == "gfx950"
    assert aiter.current_route() == (loaded.route, loaded.note)
    assert set(loaded.added) == aiter_modules() - before
    assert aiter.load("pa_decode", "gfx950") is module  # loaded once
    aiter.unload()
    assert aiter_modules() == before and aiter.loaded() is None


@needs_aiter
@pytest.mark.skipif(bool(torch.version.hip), reason="on ROCm AITER dispatches for the device's own arch")
def test_another_arch_reloads(fresh_loader):
    first = aiter.load("unified_attention", "gfx950")
    types = sys.modules["aiter.ops.triton.utils.types"]
    assert types.e4m3_dtype == torch.float8_e4m3fn  # AITER fixes its fp8 format at import, from the arch
    again = aiter.load("unified_attention", "gfx942")
    assert again is not first and aiter.loaded().arch == "gfx942"
    assert sys.modules["aiter.ops.triton.utils.types"].e4m3_dtype == torch.float8_e4m3fnuz


@off_rocm
def test_triton_only_route_when_the_init_supports_it(fresh_loader, fake_aiter):
    root = fake_aiter(
        "import os\nif os.environ.get('AITER_TRITON_ONLY') != '1':\n    raise ImportError('needs ROCm')\n"
    )
    assert aiter.probe().route == aiter.ROUTE_TRITON_ONLY
    before_env = os.environ.get("AITER_TRITON_ONLY")
    module = aiter.load("pa_decode", "gfx942")
    assert module.__file__.startswith(str(root))
    assert module.TRITON_ONLY_AT_IMPORT == "1" and module.ARCH_AT_IMPORT == "gfx942"
    assert os.environ.get("AITER_TRITON_ONLY") == before_env  # set for the import only
    assert aiter.loaded().route == aiter.ROUTE_TRITON_ONLY
    assert environment.fingerprint("cpu")["aiter_route"] == aiter.ROUTE_TRITON_ONLY


@off_rocm
def test_failed_triton_only_import_falls_back_to_the_bypass_and_says_so(fresh_loader, fake_aiter):
    fake_aiter("# mentions AITER_TRITON_ONLY but fails anyway\nraise ImportError('C++ ops')\n")
    module = aiter.load("pa_decode", "gfx950")
    assert module.ARCH_AT_IMPORT == "gfx950"
    loaded = aiter.loaded()
    assert loaded.route == aiter.ROUTE_BYPASS and "C++ ops" in loaded.note
    assert aiter.current_route() == (aiter.ROUTE_BYPASS, loaded.note)
    assert environment.fingerprint("cpu")["aiter_route_note"] == loaded.note


@off_rocm
def test_later_aiter_layout_is_found(fresh_loader, fake_aiter):
    root = fake_aiter("")
    new = root / "aiter/ops/triton/attention/pa_decode.py"
    new.parent.mkdir()
    (new.parent / "__init__.py").write_text("")
    (root / "aiter/ops/triton/pa_decode.py").rename(new)
    importlib.invalidate_caches()
    assert aiter.load("pa_decode", "gfx950").__name__ == "aiter.ops.triton.attention.pa_decode"


@off_rocm
def test_a_kernel_that_does_not_import_is_a_remembered_reason(fresh_loader, fake_aiter):
    root = fake_aiter("")
    (root / "aiter/ops/triton/mha.py").write_text("raise ValueError('incompatible triton')\n")
    importlib.invalidate_caches()
    ok, reason = aiter.kernel_available("mha")
    assert not ok and "incompatible triton" in reason
    with pytest.raises(aiter.AiterUnavailable, match="incompatible triton"):
        aiter.load("mha", "gfx950")
    assert "aiter.ops.triton.mha" not in sys.modules
    assert aiter.load("pa_decode", "gfx950").ARCH_AT_IMPORT == "gfx950"  # the others still load
