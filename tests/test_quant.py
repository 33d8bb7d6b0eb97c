"""fp8 round trips: the error bounds e4m3 promises (3 mantissa bits, subnormals below 2^-6)."""

import pytest
import torch

from gdn_lab.quant import dequantize, dequantize_groups, fp8_max, quantize_groups, quantize_per_tensor

FP8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]


def round_trip_bound(x_scaled: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half an ulp: 2^-4 relative for normals, half the smallest subnormal step below the normal range."""
    min_normal = 2.0**-6 if dtype == torch.float8_e4m3fn else 2.0**-7
    sub_step = min_normal / 8
    return torch.maximum(x_scaled.abs() * 2**-4, torch.full_like(x_scaled, sub_step / 2))


@pytest.mark.parametrize("dtype", FP8)
def test_fp8_max(dtype):
    assert fp8_max(dtype) == (448.0 if dtype == torch.float8_e4m3fn else 240.0)


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("scale", [None, 0.01, 1.0])
def test_per_tensor_round_trip_error(dtype, scale):
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 3
    xq, s = quantize_per_tensor(x, dtype, scale)
    assert xq.dtype == dtype and s.shape == (1,) and s.dtype == torch.float32
    scaled = (x / s).clamp(-fp8_max(dtype), fp8_max(dtype))
    err = (dequantize(xq, s) - scaled * s).abs()
    assert bool((err <= round_trip_bound(scaled, dtype) * s * 1.0001).all())
    if scale is None:  # amax maps to the largest finite value
        assert float((x / s).abs().max()) == pytest.approx(fp8_max(dtype))


@pytest.mark.parametrize("dtype", FP8)
def test_group_round_trip_error(dtype):
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(1)) * torch.logspace(-3, 2, 512)
    xq, scales = quantize_groups(x, dtype, 128)
    assert scales.shape == (3, 4)
    per_elem = scales.repeat_interleave(128, 1)
    err = (dequantize_groups(xq, scales) - x).abs()
    assert bool((err <= round_trip_bound(x / per_elem, dtype) * per_elem * 1.0001).all())


def test_bad_quant_input():
    with pytest.raises(ValueError, match="dtype: bfloat16 is not an fp8 KV dtype"):
        quantize_per_tensor(torch.ones(2), torch.bfloat16)
    with pytest.raises(ValueError, match=r"x: last dim \(=100\) must be divisible by group \(=128\)"):
        quantize_groups(torch.ones(2, 100), torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="scale: must be > 0"):
        quantize_per_tensor(torch.ones(2), torch.float8_e4m3fn, 0.0)


def test_scales_are_correctly_rounded_on_the_device(device):
    """amax / fp8_max rounded once (a float64 quotient of float32s rounds to float32 exactly as IEEE
    division does): on CUDA, torch's division by a Python scalar is a multiply by its reciprocal."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 1024, generator=g) * torch.rand(64, 1, generator=g) * 8).to(device)
    fmax = fp8_max(torch.float8_e4m3fn)
    _, scales = quantize_groups(x, torch.float8_e4m3fn)
    want = (x.reshape(64, 8, 128).abs().amax(-1).double() / fmax).float()
    assert torch.equal(scales, want)
    _, s = quantize_per_tensor(x, torch.float8_e4m3fn)
    assert torch.equal(s, (x.abs().amax().double() / fmax).float().reshape(1))
