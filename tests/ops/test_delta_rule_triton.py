"""The shared Triton helpers of gdn_lab.ops.delta_rule_triton: `round_rne` against torch's own casts,
bit for bit, on the test device (its GPU, or the CPU interpreter)."""

import pytest
import torch
import triton
import triton.language as tl

from gdn_lab.ops.delta_rule_triton import grid_of, round_rne


@triton.jit
def _round_kernel(x, out, n, MANT: tl.constexpr, TINY: tl.constexpr, MAGIC: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(out + o, round_rne(tl.load(x + o, mask=m, other=0.0), MANT, TINY, MAGIC), mask=m)


def values(dtype: torch.dtype) -> torch.Tensor:
    """Signed zeros, values that round to -0.0, subnormals, ties, and random magnitudes in range."""
    g = grid_of(dtype)
    tiny = g.tiny
    step = tiny * 2.0**-g.mant  # the subnormal spacing
    special = [0.0, -0.0, step / 4, -step / 4, -step / 2, step / 2, -1.5 * step, 2.5 * step, tiny, -tiny]
    special += [1.0 + 2.0 ** -(g.mant + 1), -(1.0 + 3 * 2.0 ** -(g.mant + 1)), g.max, -g.max]  # ties, the max
    gen = torch.Generator().manual_seed(0)
    scale = torch.exp2(torch.randint(-20 if g.max > 1e4 else -8, 8, (2000,), generator=gen).float())
    rand = torch.randn(2000, generator=gen) * scale
    return torch.cat([torch.tensor(special), rand.clamp(-g.max, g.max)])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn], ids=str)
def test_round_rne_is_torchs_cast(device, dtype):
    x = values(dtype)
    g = grid_of(dtype)
    out = torch.empty_like(x, device=device)
    BLOCK = 1024
    _round_kernel[(triton.cdiv(x.numel(), BLOCK),)](
        x.to(device), out, x.numel(), MANT=g.mant, TINY=g.tiny, MAGIC=g.magic, BLOCK=BLOCK
    )
    want = x.to(dtype).float()  # torch's cast on the CPU: round to nearest, ties to even
    got = out.cpu()
    wrong = got.view(torch.int32) != want.view(torch.int32)
    assert not wrong.any(), f"{int(wrong.sum())} values round otherwise than torch's cast, e.g. {x[wrong][:8].tolist()}"
    assert torch.signbit(got[1]) and torch.signbit(got[3]), "-0.0 and a negative that rounds to zero keep the sign"
