"""Under Triton's interpreter, device-function calls skip the repeated patch of triton.language and
compute what they computed before; every launch still patches (and restores) on its own; numpy
dtypes are Triton's own."""

import numpy as np
import pytest
import torch

from gdn_lab.device import interpreting

pytestmark = pytest.mark.skipif(not interpreting(), reason="the interpreter's patches (a CPU session)")

import triton  # noqa: E402  (after the skip: a GPU session compiles these kernels instead)
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter as triton_interpreter  # noqa: E402

from gdn_lab.interpreter import skip_repeated_work  # noqa: E402


@triton.jit
def _row_sum(x):
    return tl.sum(x, 0)  # tl.sum is a device function too, one that sees triton.language.core only


@triton.jit
def _row_sums_kernel(x_ptr, out_ptr, N: tl.constexpr, R: tl.constexpr):
    o = tl.arange(0, N)
    for r in range(R):
        tl.store(out_ptr + r, _row_sum(tl.load(x_ptr + r * N + o)))


def test_device_calls_patch_nothing_again_and_compute_the_same(monkeypatch):
    assert skip_repeated_work() and skip_repeated_work(), "installed once, then left as it is"
    patched = []
    original = triton_interpreter._patch_lang_core

    def counting(lang, scope):
        patched.append(lang)
        return original(lang, scope)

    monkeypatch.setattr(triton_interpreter, "_patch_lang_core", counting)
    x = torch.arange(32 * 16, dtype=torch.float32).reshape(32, 16)
    for _ in range(2):
        patched.clear()
        out = torch.full((32,), float("nan"))
        _row_sums_kernel[(1,)](x, out, N=16, R=32)
        assert torch.equal(out, x.sum(1))
        # the launch patches tl, the first tl.sum what it sees (triton.language.core, and tl once
        # Triton's rewrite has copied it into its globals), the other 63 device calls nothing
        # (Triton's own path patches on each of them: 65 patches a launch)
        assert patched[0] is tl and len(patched) <= 3, [m.__name__ for m in patched]
        assert tl.core.is_builtin(tl.load), "the launch restored triton.language"


def test_numpy_dtypes_are_tritons_own():
    assert skip_repeated_work()
    get = triton_interpreter._get_np_dtype
    for _ in range(2):  # computed, then remembered
        assert get(tl.float16) == np.float16 and get(tl.bfloat16) == np.uint16 and get(tl.int1) == np.bool_
        assert get(tl.block_type(tl.float32, [4, 8])) == np.float32
        assert get(tl.pointer_type(tl.float32)) == np.uint64
        assert get(tl.block_type(tl.pointer_type(tl.int8), [4])) == np.uint64
