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


def _attributes(value) -> dict:
    return {k: [repr(x) for x in v.values] if isinstance(v, tl.core.tuple) else repr(v) for k, v in vars(value).items()}


@pytest.mark.parametrize(
    "element,shape",
    [(tl.float32, [4, 8]), (tl.float16, [tl.constexpr(16)]), (tl.pointer_type(tl.int8), [2, 1, 4]), (tl.int1, [1])],
)
def test_shared_shapes_build_what_triton_builds(element, shape):
    """Block types and tensors get the attributes Triton's own constructors give them, on the first
    (computed) and second (remembered) construction; their shapes compare as Triton compares them."""
    assert skip_repeated_work()
    block_init, tensor_init, eq = tl.block_type.__init__, tl.tensor.__init__, tl.core.tuple.__eq__
    assert all(hasattr(f, "__wrapped__") for f in (block_init, tensor_init, eq)), "installed on this Triton"
    for _ in range(2):
        ours, theirs = object.__new__(tl.block_type), object.__new__(tl.block_type)
        block_init(ours, element, shape)
        block_init.__wrapped__(theirs, element, shape)
        assert _attributes(ours) == _attributes(theirs)
        for our_type, their_type in ((ours, theirs), (element, element)):
            a, b = object.__new__(tl.tensor), object.__new__(tl.tensor)
            tensor_init(a, None, our_type)
            tensor_init.__wrapped__(b, None, their_type)
            assert _attributes(a) == _attributes(b)
        extents = [int(s) if isinstance(s, int) else s.value for s in shape]
        for other in (theirs.shape, extents, extents[::-1], [*extents, 1], [tl.constexpr(e) for e in extents]):
            assert bool(eq(ours.shape, other)) == bool(eq.__wrapped__(theirs.shape, other))


def test_shapes_triton_rejects_still_raise_its_errors():
    assert skip_repeated_work()
    tl.block_type(tl.float32, [4, 8])  # remembered
    with pytest.raises(ValueError, match="power of 2"):
        tl.block_type(tl.float32, [4, 6])
    with pytest.raises(TypeError, match="constexpr"):
        tl.block_type(tl.float32, [4, 8.0])
    with pytest.raises(TypeError, match="0d block_type"):
        tl.block_type(tl.float32, [])


@triton.jit
def _broadcast_kernel(x_ptr, y_ptr, out_ptr, N: tl.constexpr, M: tl.constexpr):
    rows, cols = tl.arange(0, N), tl.arange(0, M)
    x = tl.load(x_ptr + rows)[:, None]  # [N, 1] against [1, M] and a scalar
    y = tl.load(y_ptr + cols)[None, :]
    tl.store(out_ptr + rows[:, None] * M + cols[None, :], x * y + 1.0 - tl.sum(y, 1)[:, None])


def test_broadcasts_compute_what_torch_computes():
    assert skip_repeated_work()
    x, y = torch.randn(8), torch.randn(4)
    for _ in range(2):
        out = torch.full((8, 4), float("nan"))
        _broadcast_kernel[(1,)](x, y, out, N=8, M=4)
        assert torch.equal(out, x[:, None] * y[None, :] + 1.0 - y.sum())
