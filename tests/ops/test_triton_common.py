"""`gdn_lab.ops.triton_common.launch_cached`: the compiled launcher, with tensors or int pointers."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from gdn_lab.ops import triton_common


@triton.jit(do_not_specialize=["n"])  # the key below leaves n out
def _scaled_copy(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(out_ptr + o, tl.load(x_ptr + o, mask=m) * scale, mask=m)


def _launch(x: torch.Tensor, out: torch.Tensor, scale: float, ints: bool) -> tuple:
    """out = x * scale through launch_cached; returns the key of its compiled-kernel cache."""
    n, block = x.numel(), 128
    args = (x, out, n, scale, block)
    key = (block, x.dtype, x.data_ptr() & 15 == 0, out.data_ptr() & 15 == 0)
    launch_args = (x.data_ptr(), out.data_ptr(), n, scale, block) if ints else None
    triton_common.launch_cached(_scaled_copy, (triton.cdiv(n, block), 1, 1), args, key, launch_args)
    return id(_scaled_copy), key, torch.cuda.current_device()


@pytest.mark.parametrize("ints", [False, True], ids=["tensors", "int-pointers"])
def test_the_cached_launch_writes_what_the_first_one_compiled_for(on_gpu, device, ints):
    """The first call compiles through kernel[grid]; the later ones go through the compiled
    launcher, with each call's own tensors (new ones each time: a launcher that kept the first
    call's pointers would write the first output)."""
    if not on_gpu:
        pytest.skip("launch_cached runs on a GPU only (the interpreter compiles nothing)")
    g = torch.Generator(device="cpu").manual_seed(0)
    for i, n in enumerate((300, 1000, 77)):
        x = torch.randn(n, generator=g).to(device)
        out = torch.full_like(x, float("nan"))
        cache_key = _launch(x, out, 1.5 + i, ints)
        assert cache_key in triton_common._COMPILED  # so the later calls took the compiled launcher
        torch.testing.assert_close(out, x * (1.5 + i), rtol=0, atol=0)
