"""What the Triton attention kernels share (`gdn_lab.ops.paged_kv_triton`): the e4m3 -> fp16 path."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from gdn_lab.ops.paged_kv_triton import e4m3_to_f16, ptx_e4m3


def _sm89(device: torch.device) -> bool:
    return device.type == "cuda" and not torch.version.hip and torch.cuda.get_device_capability(device) >= (8, 9)


def test_ptx_e4m3_only_where_the_ptx_runs(device):
    e4m3 = torch.float8_e4m3fn
    assert not ptx_e4m3(torch.bfloat16, tl.float16, device)
    assert not ptx_e4m3(torch.float8_e4m3fnuz, tl.float16, device)
    assert not ptx_e4m3(e4m3, tl.float32, device)  # float32 operands take torch's conversion
    assert not ptx_e4m3(e4m3, tl.float16, torch.device("cpu"))
    assert ptx_e4m3(e4m3, tl.float16, device) == _sm89(device)


@triton.jit
def _convert_kernel(x, y, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y + o[:, None] * N + o[None, :], e4m3_to_f16(tl.load(x + o[:, None] * N + o[None, :])))


def test_e4m3_to_f16_is_torchs_conversion(device):
    """Every one of the 256 e4m3 bytes (the two NaNs included) converts to torch's float16 bits."""
    if not _sm89(device):
        pytest.skip("e4m3_to_f16 is PTX for sm_89 and newer")
    x = torch.arange(256, dtype=torch.int32, device=device).to(torch.uint8).view(torch.float8_e4m3fn).view(16, 16)
    y = torch.empty(16, 16, dtype=torch.float16, device=device)
    _convert_kernel[(1,)](x, y, N=16)
    want = x.to(torch.float16)
    nan = want.isnan()
    assert torch.equal(y.isnan(), nan) and int(nan.sum()) == 2
    assert torch.equal(y.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
