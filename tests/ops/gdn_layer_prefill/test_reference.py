"""The GDN layer chain against an independent composition (F.conv1d, the recurrent rule, F.rms_norm)."""

import pytest
import torch
import torch.nn.functional as F

from gdn_lab.ops import causal_conv1d_update, gdn_layer_prefill, gdn_prefill
from gdn_lab.quant import dequantize_groups


def interleave(q, k, v, z, b, a, hk):
    """Qwen3-Next's checkpoint layout, built from the parts: per key head [q | k | v(r heads) | z(r heads)], [b | a]."""
    L, hv, d = v.shape
    r = hv // hk
    blocks, ba = [], []
    for h in range(hk):
        heads = slice(h * r, (h + 1) * r)
        blocks += [q[:, h], k[:, h], v[:, heads].reshape(L, -1), z[:, heads].reshape(L, -1)]
        ba += [b[:, heads], a[:, heads]]
    return torch.cat(blocks, 1), torch.cat(ba, 1)


def conv_ref(x, history, weight, bias):
    """Depthwise causal conv with F.conv1d over [history | x], then SiLU. x [L, C] -> [L, C]."""
    full = torch.cat([history.float(), x.float().T], 1)[None]
    y = F.conv1d(full, weight.float()[:, None, :], bias.float() if bias is not None else None, groups=x.shape[1])
    return F.silu(y[0]).T


@pytest.mark.parametrize("hk, hv, d, lengths", [(1, 2, 64, [5, 70]), (2, 6, 64, [1, 3, 64])])
@pytest.mark.parametrize("has_init", [True, False])
def test_chain_matches_an_independent_composition(hk, hv, d, lengths, has_init):
    g = torch.Generator().manual_seed(0)
    r = lambda *s, sc=1.0: sc * torch.randn(*s, generator=g)  # noqa: E731
    T, N, W = sum(lengths), len(lengths), 4
    C = 2 * hk * d + hv * d
    q, k, v, z = r(T, hk, d), r(T, hk, d), r(T, hv, d), r(T, hv, d)
    b, a = r(T, hv), r(T, hv)
    qkvz, ba = interleave(q, k, v, z, b, a, hk)
    conv_w, conv_b, A_log, dt_bias, norm_w = r(C, W, sc=0.5), r(C, sc=0.1), r(hv), r(hv), 1 + r(d, sc=0.1)
    conv0, delta0 = r(N, C, W - 1), 0.1 * r(N, hv, d, d)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    slots = torch.arange(N, dtype=torch.int32).flip(0)
    init = torch.full((N,), has_init)
    conv_s, delta_s = conv0.clone(), delta0.clone()
    normalized, quantized, scales = gdn_layer_prefill(
        qkvz, ba, conv_s, delta_s, slots, cu, init, conv_w, conv_b, A_log, dt_bias, norm_w,
        num_k_heads=hk, num_v_heads=hv, head_dim=d, quantize_fp8=True, fp8_dtype=torch.float8_e4m3fn,
    )  # fmt: skip
    for n in range(N):
        rows, slot = slice(int(cu[n]), int(cu[n + 1])), int(slots[n])
        L = rows.stop - rows.start
        mixed = torch.cat([q[rows].reshape(L, -1), k[rows].reshape(L, -1), v[rows].reshape(L, -1)], 1)
        hist = conv0[slot] if has_init else torch.zeros(C, W - 1)
        y = conv_ref(mixed, hist, conv_w, conv_b)
        qc, kc, vc = y[:, : hk * d], y[:, hk * d : 2 * hk * d], y[:, 2 * hk * d :]
        state = delta0[slot : slot + 1].clone()
        o = gdn_prefill(
            qc.reshape(L, hk, d), kc.reshape(L, hk, d), vc.reshape(L, hv, d), a[rows], b[rows], A_log, dt_bias,
            torch.tensor([0, L], dtype=torch.int32), state, torch.tensor([0], dtype=torch.int32),
            backend="torch-recurrent",
        )  # fmt: skip
        ref = F.rms_norm(o, (d,), norm_w, eps=1e-6) * F.silu(z[rows])
        torch.testing.assert_close(normalized[rows], ref, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(delta_s[slot], state[0], atol=1e-5, rtol=1e-4)
        expect_hist = torch.cat([hist, mixed.T], 1)[:, -(W - 1) :]
        torch.testing.assert_close(conv_s[slot], expect_hist)
    # group-128 fp8 of the normalized output: e4m3 keeps 3 mantissa bits
    deq = dequantize_groups(quantized, scales).reshape(T, hv, d)
    assert scales.shape == (T, hv * d // 128)
    err = (deq - normalized).abs()
    bound = 2**-4 * normalized.abs() + scales.repeat_interleave(128, 1).reshape(T, hv, d) * 2**-9
    assert bool((err <= bound).all())


def test_two_halves_with_carried_states_equal_one_pass():
    from gdn_lab.ops.gdn_layer_prefill import example

    args = example(lengths=(40,), quantize_fp8=False)
    whole_conv, whole_delta = args["conv_state"].clone(), args["delta_state"].clone()
    one, _, _ = gdn_layer_prefill(**{**args, "conv_state": whole_conv, "delta_state": whole_delta})
    conv, delta = args["conv_state"].clone(), args["delta_state"].clone()
    halves = []
    for s, e, init in ((0, 17, args["has_initial_state"][0]), (17, 40, True)):
        halves.append(
            gdn_layer_prefill(
                **{
                    **args,
                    "projected_qkvz": args["projected_qkvz"][s:e],
                    "projected_ba": args["projected_ba"][s:e],
                    "cu_seqlens": torch.tensor([0, e - s], dtype=torch.int32),
                    "has_initial_state": torch.tensor([bool(init)]),
                    "conv_state": conv,
                    "delta_state": delta,
                }
            )[0]
        )
    torch.testing.assert_close(torch.cat(halves), one, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(conv, whole_conv)
    torch.testing.assert_close(delta, whole_delta, atol=1e-5, rtol=1e-4)


def test_conv_update_token_by_token_equals_the_sequence_conv():
    g = torch.Generator().manual_seed(1)
    C, W, L = 24, 4, 9
    x, w, bias, hist = (torch.randn(*s, generator=g) for s in ((L, C), (C, W), (C,), (C, W - 1)))
    state = torch.zeros(3, C, W - 1)
    state[2] = hist
    steps = [causal_conv1d_update(x[t : t + 1], state, w, bias, torch.tensor([2], dtype=torch.int32)) for t in range(L)]
    torch.testing.assert_close(torch.cat(steps), conv_ref(x, hist, w, bias), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(state[2], torch.cat([hist, x.T], 1)[:, -(W - 1) :])
    out = causal_conv1d_update(x[:2], state, w, None, torch.tensor([-1, 0], dtype=torch.int32), activation=None)
    assert bool((out[0] == 0).all())


def test_conv_update_row_is_the_same_bits_alone_and_in_any_batch():
    g = torch.Generator().manual_seed(2)
    C, W, S = 40, 4, 70
    w, bias, state = torch.randn(C, W, generator=g), torch.randn(C, generator=g), torch.randn(S, C, W - 1, generator=g)
    x = torch.randn(64, C, generator=g)
    alone_state = state.clone()
    alone = causal_conv1d_update(x[5:6], alone_state, w, bias, torch.tensor([7], dtype=torch.int32))
    for B in (2, 9, 64):
        pool = state.clone()
        slots = torch.randperm(S, generator=g)[:B].to(torch.int32)
        pos = int(torch.randint(0, B, (1,), generator=g))
        slots[pos] = 7
        slots[slots == 7] = -1
        slots[pos] = 7
        rows = x[:B].clone()
        rows[pos] = x[5]
        out = causal_conv1d_update(rows, pool, w, bias, slots)
        assert torch.equal(out[pos], alone[0]), B
        assert torch.equal(pool[7], alone_state[7]), B
        assert bool((out[slots < 0] == 0).all())


def test_bad_layer_input():
    from gdn_lab.ops.gdn_layer_prefill import example

    args = example(quantize_fp8=False)
    with pytest.raises(ValueError, match=r"num_v_heads \(=5\) must be divisible by num_k_heads \(=2\)"):
        gdn_layer_prefill(**{**args, "num_v_heads": 5})
    with pytest.raises(ValueError, match=r"projected_qkvz: expected shape \[T, QKVZ\] with QKVZ=384"):
        gdn_layer_prefill(**{**args, "projected_qkvz": args["projected_qkvz"][:, :100]})
    with pytest.raises(ValueError, match=r"conv_state: dim 2 must be the conv width - 1 \(=3\), got 2"):
        gdn_layer_prefill(**{**args, "conv_state": args["conv_state"][..., :2]})
    with pytest.raises(ValueError, match=r"cache_indices: entry 3 points outside conv_state.shape\[0\] \(=3\)"):
        gdn_layer_prefill(**{**args, "cache_indices": torch.tensor([1, 3], dtype=torch.int32)})
    with pytest.raises(ValueError, match=r"has_initial_state: dtype int64 is not accepted; expected one of bool"):
        gdn_layer_prefill(**{**args, "has_initial_state": torch.tensor([1, 0])})
    with pytest.raises(ValueError, match=r"num_v_heads \* head_dim \(=96\) must be divisible by the fp8 group \(128\)"):
        gdn_layer_prefill(**{**example(num_k_heads=1, num_v_heads=3, quantize_fp8=False), "quantize_fp8": True})
    with pytest.raises(ValueError, match=r"head_dim: expected a positive int, got 0"):
        gdn_layer_prefill(**{**args, "head_dim": 0})
    with pytest.raises(ValueError, match=r"activation: 'gelu' is not accepted; expected one of 'silu', None"):
        causal_conv1d_update(torch.randn(1, 4), torch.zeros(1, 4, 3), torch.randn(4, 4), None,
                             torch.tensor([0], dtype=torch.int32), activation="gelu")  # fmt: skip
