"""Test setup: one device for the whole session, one Triton mode for the whole process.

`pytest --device cpu|cuda` picks the device every test gets through the `device` fixture (default:
cuda when torch sees a GPU, else cpu). Triton reads TRITON_INTERPRET when a kernel is decorated,
and a kernel decorated in one mode cannot be called in the other, so the variable is set once,
here, before any test module imports a kernel: 1 for cpu (Triton's interpreter), 0 for cuda.
A test that needs the other mode runs it in a subprocess with its own environment.

A sticky GPU error (an illegal memory access, a device-side assert) ends the session at the test
where it surfaced: the CUDA context is lost, and every later test of the process would fail for
it, blaming innocent tests (on an H100 at 693088c, one fault failed the 13 tests after it).

As flash-linear-attention's conftest: uninitialized memory is NaN, so a kernel that reads what it
never wrote fails loudly instead of passing on leftover zeros.
"""

import os

import pytest
import torch

DEVICE_KEY = pytest.StashKey[torch.device]()


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="the device every test runs on (default: cuda when torch sees a GPU, else cpu; "
        "cpu runs Triton kernels in its interpreter)",
    )


def pytest_configure(config):
    name = config.getoption("--device") or ("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: torch sees no CUDA/ROCm device; use --device cpu")
    os.environ["TRITON_INTERPRET"] = "1" if name == "cpu" else "0"
    config.stash[DEVICE_KEY] = torch.device(name)
    # Only now: torch.use_deterministic_algorithms imports triton, and triton.language decorates its
    # own jit functions (tl.sum, ...) in the mode TRITON_INTERPRET says at that moment.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True


def pytest_report_header(config):
    dev = config.stash[DEVICE_KEY]
    return f"gdn_lab test device: {dev} (TRITON_INTERPRET={os.environ['TRITON_INTERPRET']})"


# what CUDA (and HIP) say once a kernel has broken the context: every later call fails the same way
STICKY_GPU_ERRORS = (
    "an illegal memory access was encountered",
    "unspecified launch failure",
    "misaligned address",
    "device-side assert triggered",
    "illegal instruction was encountered",
)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    # an assertion's message may quote such an error (a test of this hook): only raised errors count
    if report.failed and call.excinfo is not None and not isinstance(call.excinfo.value, AssertionError):
        text = str(call.excinfo.value)
        sticky = next((e for e in STICKY_GPU_ERRORS if e in text), None)
        if sticky is not None:
            item.session.shouldstop = (
                f"the GPU context is lost ({sticky}) in {item.nodeid}: the later tests of this process "
                "would fail for it; rerun that test alone with CUDA_LAUNCH_BLOCKING=1 to find the launch"
            )
    return report


@pytest.fixture(scope="session")
def device(pytestconfig) -> torch.device:
    """The session's device (`--device`); tensors a Triton kernel reads must live here."""
    return pytestconfig.stash[DEVICE_KEY]


@pytest.fixture(scope="session")
def on_gpu(device) -> bool:
    return device.type == "cuda"
