"""gdn_lab.out_of_bounds under Triton's interpreter: an access past a view's last element, or
before its first, is found with its kernel, kind and nearest tensor; masked-off addresses and a
view's own elements are not; the hooks are restored after the block, also after an exception."""

import pytest
import torch

from gdn_lab.device import interpreting
from gdn_lab.out_of_bounds import out_of_bounds

pytestmark = pytest.mark.skipif(not interpreting(), reason="the interpreter's hooks (a CPU session)")

import triton  # noqa: E402  (after the skip: a GPU session compiles these kernels instead)
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402


@triton.jit
def _copy_kernel(x, y, n, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(y + o, tl.load(x + o + SHIFT, mask=o < n, other=0.0), mask=o < n)


def copy(x: torch.Tensor, shift: int) -> torch.Tensor:
    y = torch.zeros_like(x)
    _copy_kernel[(1,)](x, y, x.numel(), SHIFT=shift, BLOCK=16)
    return y


def test_a_kernel_inside_its_views_is_clean_and_masked_addresses_do_not_count():
    base = torch.arange(20, dtype=torch.float32)
    with out_of_bounds() as found:
        y = copy(base[2:12], 0)  # a block of 16 over a view of 10: six lanes masked off
    assert found == [] and torch.equal(y, base[2:12])


@pytest.mark.parametrize("shift", [1, -1], ids=["past-the-end", "before-the-start"])
def test_an_access_outside_the_view_is_found_even_inside_its_storage(shift):
    base = torch.arange(20, dtype=torch.float32)
    x = base[2:12]  # its storage holds both neighbours: in bounds for the allocator, not for the view
    with out_of_bounds() as found:
        copy(x, shift)
    assert len(found) == 1, found
    (a,) = found
    assert (a.kernel, a.kind, a.count) == ("_copy_kernel", "load", 1)
    assert a.address == x.data_ptr() + (10 if shift > 0 else -1) * 4
    assert a.nearest == "x[10] float32"


def test_the_hooks_come_back_after_an_exception():
    hooks = (interpreter.GridExecutor.__call__, interpreter.InterpreterBuilder.create_masked_load)
    with pytest.raises(ValueError, match="inside"), out_of_bounds():
        raise ValueError("inside")
    assert (interpreter.GridExecutor.__call__, interpreter.InterpreterBuilder.create_masked_load) == hooks
