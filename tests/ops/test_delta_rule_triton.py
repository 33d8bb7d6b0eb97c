"""The shared Triton helpers of gdn_lab.ops.delta_rule_triton (and triton_common's `round_rne`) on the
test device (its GPU, or the CPU interpreter): `round_rne` against torch's own casts, bit for bit;
both inverses of I + A against a float64 inverse; `plan_chunks` against torch's cumsum and
searchsorted; the three launches on column views of wider rows (the layer's conv output, its
interleaved gates) against the same tensors copied out contiguous, bit for bit; the chunk dots'
operand rule per input dtype, and the scratch kept on their grid against float32 scratch, bit for
bit; the output launch's grouped programs against one head and tile a program, bit for bit."""

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from gdn_lab.ops.delta_rule_triton import (
    INVERSES,
    _unit_lower_inverse,
    _unit_lower_inverse_doubling,
    chunked_run,
    plan_chunks,
    run_output_kernel,
    run_prepare_kernel,
    run_state_kernel,
)
from gdn_lab.ops.triton_common import DotPrecision, grid_of, round_rne
from gdn_lab.ops.triton_support import interpreting


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


@triton.jit
def _inverse_kernel(a, out, BT: tl.constexpr, DOUBLING: tl.constexpr):
    o = tl.arange(0, BT)
    p = o[:, None] * BT + o[None, :]
    if DOUBLING:
        tl.store(out + p, _unit_lower_inverse_doubling(tl.load(a + p), BT, "ieee"))
    else:
        tl.store(out + p, _unit_lower_inverse(tl.load(a + p), BT, "ieee"))


def chunk_matrix(bt: int, seed: int) -> torch.Tensor:
    """A as the chunked delta rule builds it: strict_tril(beta_i (k_i . k_j) exp(G_i - G_j)), unit-norm k."""
    g = torch.Generator().manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(bt, 128, generator=g), dim=-1)
    k[bt // 3 : bt // 3 + 6] = k[bt // 3]  # repeated keys: entries near 1, the hardest case
    beta = torch.sigmoid(torch.randn(bt, generator=g))
    G = torch.cumsum(-torch.rand(bt, generator=g) * 0.1, 0)
    return torch.tril(beta[:, None] * (k @ k.T) * torch.exp(G[:, None] - G[None, :]), -1)


@pytest.mark.parametrize("inverse", INVERSES)
@pytest.mark.parametrize("bt", [16, 32, 64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unit_lower_inverse_is_the_inverse(device, bt, seed, inverse):
    A = chunk_matrix(bt, seed)
    out = torch.empty(bt, bt, device=device)
    _inverse_kernel[(1,)](A.to(device), out, BT=bt, DOUBLING=inverse == "doubling")
    want = torch.linalg.inv(torch.eye(bt, dtype=torch.float64) + A.double())
    # IEEE float32 dots: a few ulps of the inverse's largest entries
    assert (out.cpu().double() - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("lengths", [[4000], [0], [5, 0, 64, 65, 1], "many"], ids=["long", "empty", "mixed", "many"])
@pytest.mark.parametrize(
    "sizes",
    [[(32, 0)], [(64, 100)], [(32, 0), (64, 100)], [(64, 0), (256, 300)]],
    ids=["cut-32", "whole-to-100", "two-plans", "chunks-and-segments"],
)
def test_plan_chunks_counts_and_owns_every_chunk(device, lengths, sizes):
    """Every sequence ceil(length / chunk) chunks, or one if it has 1 to `whole` tokens, for each
    (chunk, whole) of one launch."""
    if lengths == "many":  # more sequences than one block of the plan kernel
        lengths = torch.randint(0, 200, (1500,), generator=torch.Generator().manual_seed(len(sizes))).tolist()
    lens = torch.tensor(lengths)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    plans = plan_chunks(cu.to(device=device, dtype=torch.int32), int(cu[-1]), *sizes)
    assert len(plans) == len(sizes)
    for plan, (chunk, whole) in zip(plans, sizes):
        counts = torch.where(lens <= whole, lens.clamp(max=1), (lens + chunk - 1) // chunk)
        want_cu = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        assert plan.chunk_size == chunk and plan.max_chunks == int(cu[-1]) // chunk + len(lengths)
        want_seq = torch.searchsorted(want_cu[1:], torch.arange(plan.max_chunks), right=True)  # N past the last
        assert plan.chunk_cu.cpu().tolist() == want_cu.tolist()
        assert plan.chunk_seq.cpu().tolist() == want_seq.tolist()


def test_launches_read_column_views_as_their_copies(device):
    """q, k, v as column slices of one wider row and a, b interleaved per key head ([b (R) | a (R)],
    as gdn_layer_prefill's projection): the prepare's scratch, the state launch's v_new and state
    (it reads k and v as given) and the output launch's output (q and k) equal theirs on
    contiguous copies."""
    hk, hv, d, lengths = 2, 4, 32, [70, 1, 33]  # 32 columns: the prepare's two 16-column pieces
    r, T = hv // hk, sum(lengths)
    g = torch.Generator().manual_seed(0)
    wide = (
        torch.randn(T, 2 * hk * d + hv * d + 8, generator=g).to(torch.bfloat16).to(device)
    )  # + 8: rows wider than q|k|v
    q, k = wide[:, : hk * d].view(T, hk, d), wide[:, hk * d : 2 * hk * d].view(T, hk, d)
    v = wide[:, 2 * hk * d : 2 * hk * d + hv * d].view(T, hv, d)
    ba = torch.randn(T, hk, 2 * r, generator=g).to(torch.bfloat16).to(device)
    b, a = ba[..., :r], ba[..., r:]
    A_log, dt_bias = torch.randn(hv, generator=g).to(device), torch.randn(hv, generator=g).to(device)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    slots = torch.arange(len(lengths), dtype=torch.int32, device=device)
    pool = (0.1 * torch.randn(len(lengths), hv, d, d, generator=g)).to(device)
    copied = (q.contiguous(), k.contiguous(), v.contiguous(), a.contiguous().view(T, hv), b.contiguous().view(T, hv))
    results = []
    for args in ((q, k, v, a, b), copied):
        out, state = torch.empty(T, hv, d, dtype=torch.bfloat16, device=device), pool.clone()
        run = chunked_run(cu, out, hk, d, 64)
        qa, ka, va, aa, ba = args
        run_prepare_kernel(run, qa, ka, aa, ba, A_log, dt_bias, cu, slots, True)
        run_state_kernel(run, ka, va, state, slots, cu)
        scratch = [getattr(run.scratch, f).clone() for f in ("norms", "ts", "bs", "gs", "vs")]
        run_output_kernel(run, qa, ka, d**-0.5, out, cu, slots)
        results.append([*scratch, state, out])
    assert not q.is_contiguous() and not v.is_contiguous() and b.stride() == (hk * 2 * r, 2 * r, 1)
    for name, viewed, plain in zip(("norms", "ts", "bs", "gs", "vs", "state", "out"), *results):
        assert torch.equal(viewed, plain), f"{name} differs between the views and their copies"
    spread = wide[:, : 2 * hk * d].view(T, hk, 2 * d)[..., :d]  # heads 2d apart: not packed
    with pytest.raises(ValueError, match="packed heads"):
        run_prepare_kernel(run, spread, k, a, b, A_log, dt_bias, cu, slots, True)
    with pytest.raises(ValueError, match="v needs packed heads"):
        run_state_kernel(run, k, wide[:, : 2 * hv * d].view(T, hv, 2 * d)[..., :d], state, slots, cu)


@pytest.mark.parametrize("d", [16, 32, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_chunk_dots_take_bf16_operands_only_for_bf16_inputs_on_a_gpu(device, dtype, d):
    """bf16 inputs on a GPU: bf16 operands at Triton's default precision in the recurrence and the
    output (T, v_new and the chunk states stored in bf16), and in the prepare's k k^T from head
    dim 64 on; fp16 and float32 inputs, and every input under the interpreter: the float32
    operands of the prepare's inverse."""
    cu = torch.tensor([0, 70], dtype=torch.int32, device=device)
    run = chunked_run(cu, torch.empty(70, 2, d, dtype=dtype, device=device), 1, d, 64)
    narrow = dtype == torch.bfloat16 and not interpreting()
    f32, bf16 = (tl.float32, run.prec), (tl.bfloat16, None)
    assert (run.dot.dtype, run.dot.input_precision) == (bf16 if narrow else f32)
    assert (run.prep.dtype, run.prep.input_precision) == (bf16 if narrow and d >= 64 else f32)
    s = run.scratch
    assert s.ts.dtype == s.vs.dtype == s.hs.dtype == (torch.bfloat16 if narrow else torch.float32)
    assert s.ts.shape == (70, 2, 64) and s.bs.dtype == s.gs.dtype == s.norms.dtype == torch.float32


def _with_operand_scratch(run, dtype: torch.dtype):
    """run on bf16 dots with T, v_new and the chunk states kept in dtype."""
    s = run.scratch
    scratch = dataclasses.replace(s, **{f: torch.empty_like(getattr(s, f), dtype=dtype) for f in ("ts", "vs", "hs")})
    return dataclasses.replace(run, dot=DotPrecision(tl.bfloat16, None), scratch=scratch)


def test_scratch_on_the_operand_grid_gives_the_float32_scratch_bits(device):
    """The prepare stores T, and the state launch v_new and the chunk states, rounded to the bf16
    operands of the dots that read them, as those dots would round them: the output and the pool
    states equal theirs over float32 scratch, bit for bit, over sequences of one chunk, several,
    and a partial last one. The default run keeps that scratch in bf16 exactly where its dots are
    bf16 (bf16 inputs on a GPU)."""
    hk, hv, d, lengths = 1, 2, 32, [70, 5, 130]
    T = sum(lengths)
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(T, hk, d, generator=g).to(torch.bfloat16).to(device) for _ in range(2))
    v = torch.randn(T, hv, d, generator=g).to(torch.bfloat16).to(device)
    a, b = (torch.randn(T, hv, generator=g).to(torch.bfloat16).to(device) for _ in range(2))
    A_log, dt_bias = torch.randn(hv, generator=g).to(device), torch.randn(hv, generator=g).to(device)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    slots = torch.tensor([2, 0, 1], dtype=torch.int32, device=device)
    pool = (0.1 * torch.randn(3, hv, d, d, generator=g)).to(device)
    results = []
    for dtype in (torch.bfloat16, torch.float32):
        out, state = torch.empty(T, hv, d, dtype=torch.bfloat16, device=device), pool.clone()
        default = chunked_run(cu, out, hk, d, 64)
        operand = torch.float32 if default.dot.dtype == tl.float32 else torch.bfloat16
        assert default.scratch.ts.dtype == default.scratch.vs.dtype == default.scratch.hs.dtype == operand
        run = _with_operand_scratch(default, dtype)
        run_prepare_kernel(run, q, k, a, b, A_log, dt_bias, cu, slots, True)
        run_state_kernel(run, k, v, state, slots, cu)
        run_output_kernel(run, q, k, d**-0.5, out, cu, slots)
        results.append((out, state))
    (out_h, state_h), (out_f, state_f) = results
    assert torch.equal(state_h, state_f)
    assert torch.equal(out_h, out_f)
    assert out_h.isfinite().all() and out_h.abs().max() > 0


def _prepared(device, dtype, hk, hv, d):
    """The prepare and state launches over sequences of one chunk (70 tokens), a padding slot (5)
    and several chunks with a partial last one (130): (run, q, k, a, b, A_log, dt_bias, cu, slots,
    out) for the output launch."""
    lengths = [70, 5, 130]
    T = sum(lengths)
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(T, hk, d, generator=g).to(dtype).to(device) for _ in range(2))
    v = torch.randn(T, hv, d, generator=g).to(dtype).to(device)
    a, b = (torch.randn(T, hv, generator=g).to(dtype).to(device) for _ in range(2))
    A_log, dt_bias = torch.randn(hv, generator=g).to(device), torch.randn(hv, generator=g).to(device)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    slots = torch.tensor([2, -1, 1], dtype=torch.int32, device=device)
    state = (0.1 * torch.randn(3, hv, d, d, generator=g)).to(device)
    out = torch.empty(T, hv, d, dtype=dtype, device=device)
    run = chunked_run(cu, out, hk, d, 64)
    run_prepare_kernel(run, q, k, a, b, A_log, dt_bias, cu, slots, True)
    run_state_kernel(run, k, v, state, slots, cu)
    return run, q, k, a, b, A_log, dt_bias, cu, slots, out


@pytest.mark.parametrize("hk, hv", [(2, 4), (3, 3), (1, 4)], ids=["2-per-key", "1-per-key", "4-per-key"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_output_programs_grouped_give_the_ungrouped_bits(device, dtype, hk, hv):
    """The output launch's programs take one or two value heads of a key head and one or two V
    tiles, sharing q k^T: every grouping, the default's (two heads only where they pair up)
    among them, writes every output bit the one-head, one-tile programs write, over sequences of
    one chunk, several, a partial last one and a padding slot (zeros), with 1, 2 and 4 value heads
    per key head. A grouping that does not divide the heads or tiles is refused before the launch.
    Head dim 128 in the backends' tile of 64 values: two tiles a head. (At head dim 32 in tiles of
    16 values this test made an illegal memory access on an H100 with Triton 3.6, as tiles of 32 at
    head dim 128 had in data/bench/h100/diag_output_afb0139.log; the backends' tile is 64 values,
    or the whole row where it is narrower.)"""
    d = 128
    run, q, k, a, b, A_log, dt_bias, cu, slots, out = _prepared(device, dtype, hk, hv, d)
    outs = {}
    r = hv // hk
    for heads, tiles in [(1, 1), (None, None), *((h, t) for h in (1, 2) for t in (1, 2) if r % h == 0)]:
        o = torch.full_like(out, float("nan"))
        run_output_kernel(run, q, k, d**-0.5, o, cu, slots, group_heads=heads, group_tiles=tiles)
        outs[heads, tiles] = o
    assert outs[1, 1].isfinite().all() and outs[1, 1][70:75].eq(0).all() and outs[1, 1].abs().max() > 0
    for grouping, o in outs.items():
        assert torch.equal(o, outs[1, 1]), f"group_heads, group_tiles = {grouping} changed bits"
    for heads, tiles in [(r + 1, 1), (1, 3)]:
        with pytest.raises(ValueError, match="group_heads"):
            run_output_kernel(run, q, k, d**-0.5, out, cu, slots, group_heads=heads, group_tiles=tiles)
    with pytest.raises(ValueError, match="inverse 'lu'"):
        run_prepare_kernel(run, q, k, a, b, A_log, dt_bias, cu, slots, True, inverse="lu")


@pytest.mark.parametrize("d, block_v", [(32, 16), (32, 32), (128, 32), (128, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_every_launch_stays_inside_its_tensors(device, dtype, d, block_v):
    """Under the interpreter, every address the prepare, state and output launches load or store
    (after their masks) lies inside one of their tensor arguments, at the backends' tiles and at
    smaller ones, grouped and not. Tiles of 16 values at head dim 32 and of 32 at head dim 128 made
    illegal memory accesses on an H100 with Triton 3.6 (data/bench/h100/README.md, session 48):
    these addresses are not the cause."""
    if not interpreting():
        pytest.skip("the interpreter's hooks (a CPU session)")
    from gdn_lab.out_of_bounds import out_of_bounds

    with out_of_bounds() as found:
        run, q, k, _, _, _, _, cu, slots, out = _prepared(device, dtype, 2, 4, d)
        for heads, tiles in [(1, 1), (2, d // block_v)]:  # one (head, tile) a program, or all of a key head
            run_output_kernel(run, q, k, d**-0.5, out, cu, slots, block_v=block_v, group_heads=heads, group_tiles=tiles)
    assert found == []
