"""The gated-delta-rule references: chunked vs recurrent vs an independent naive loop, decode vs prefill."""

import pytest
import torch
import torch.nn.functional as F

from gdn_lab.ops import gdn_decode, gdn_prefill


def naive_recurrence(q, k, v, a, b, A_log, dt_bias, S0, scale, use_qk_l2norm):
    """fla's naive form, written independently: K-first state [K, V] per head, explicit loops."""
    T, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    rep = HV // HK
    S = S0.double().transpose(-1, -2).clone()  # [HV, K, V]
    out = torch.zeros(T, HV, V, dtype=torch.float64)
    for t in range(T):
        for h in range(HV):
            qt, kt = q[t, h // rep].double(), k[t, h // rep].double()
            if use_qk_l2norm:
                qt = qt / torch.sqrt((qt * qt).sum() + 1e-6)
                kt = kt / torch.sqrt((kt * kt).sum() + 1e-6)
            qt = qt * scale
            g = -torch.exp(A_log[h].double()) * F.softplus(a[t, h].double() + dt_bias[h].double())
            beta = torch.sigmoid(b[t, h].double())
            S[h] = S[h] * torch.exp(g)
            kv_mem = (S[h] * kt[:, None]).sum(0)
            delta = (v[t, h].double() - kv_mem) * beta
            S[h] = S[h] + kt[:, None] * delta[None, :]
            out[t, h] = (S[h] * qt[:, None]).sum(0)
    return out, S.transpose(-1, -2)


def inputs(lengths, hk, hv, d, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(
        q=r(T, hk, d).to(dtype), k=r(T, hk, d).to(dtype), v=r(T, hv, d).to(dtype),
        a=r(T, hv), b=r(T, hv), A_log=r(hv) * 0.5, dt_bias=r(hv) * 0.5,
        cu_seqlens=torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32),
        state=0.1 * r(len(lengths) + 1, hv, d, d),
        slots=torch.arange(len(lengths), dtype=torch.int32).flip(0) + 1,
    )  # fmt: skip


SHAPES = [
    pytest.param([1, 63, 64, 65], 1, 2, 16, id="hk1-hv2-chunk-edges"),
    pytest.param([130, 7], 2, 4, 32, id="hk2-hv4-two-chunks"),
    pytest.param([40], 2, 6, 16, id="ratio3"),
]


@pytest.mark.parametrize("lengths, hk, hv, d", SHAPES)
@pytest.mark.parametrize("use_qk_l2norm", [True, False])
def test_chunked_matches_recurrent_fp32(lengths, hk, hv, d, use_qk_l2norm):
    """Hugging Face's test_gdn_chunked_matches_recurrent tolerance: atol 1e-5, rtol 1e-4 in fp32."""
    x = inputs(lengths, hk, hv, d)
    if not use_qk_l2norm:  # keep the recurrence stable without normalization
        x["q"], x["k"] = x["q"] / d, x["k"] / d
    s1, s2 = x["state"].clone(), x["state"].clone()
    o1 = gdn_prefill(**{**x, "state": s1}, use_qk_l2norm=use_qk_l2norm, backend="torch")
    o2 = gdn_prefill(**{**x, "state": s2}, use_qk_l2norm=use_qk_l2norm, backend="torch-recurrent")
    torch.testing.assert_close(o1, o2, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s1, s2, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("lengths, hk, hv, d", SHAPES[:2])
def test_recurrent_matches_an_independent_naive_loop(lengths, hk, hv, d):
    x = inputs(lengths, hk, hv, d, seed=3)
    s = x["state"].clone()
    out = gdn_prefill(**{**x, "state": s}, scale=0.3, backend="torch-recurrent")
    cu = x["cu_seqlens"].tolist()
    for n, slot in enumerate(x["slots"].tolist()):
        rows = slice(cu[n], cu[n + 1])
        ref_o, ref_s = naive_recurrence(
            *(x[key][rows] for key in ("q", "k", "v", "a", "b")), x["A_log"], x["dt_bias"], x["state"][slot], 0.3, True
        )
        torch.testing.assert_close(out[rows].double(), ref_o, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(s[slot].double(), ref_s, atol=1e-5, rtol=1e-5)


def test_decode_step_by_step_equals_prefill_over_the_same_tokens():
    x = inputs([37], 2, 4, 32, seed=5)
    pre_state = x["state"].clone()
    pre = gdn_prefill(**{**x, "state": pre_state}, backend="torch")
    dec_state = x["state"].clone()
    slot = x["slots"][:1]
    steps = [
        gdn_decode(
            x["q"][t : t + 1],
            x["k"][t : t + 1],
            x["v"][t : t + 1],
            x["a"][t : t + 1],
            x["b"][t : t + 1],
            x["A_log"],
            x["dt_bias"],
            dec_state,
            slot,
            backend="torch",
        )  # fmt: skip
        for t in range(37)
    ]
    torch.testing.assert_close(torch.cat(steps), pre, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(dec_state, pre_state, atol=1e-5, rtol=1e-4)


def test_negative_slots_are_skipped():
    x = inputs([5, 9], 1, 2, 16)
    x["slots"] = torch.tensor([-1, 0], dtype=torch.int32)
    s = x["state"].clone()
    out = gdn_prefill(**{**x, "state": s})
    assert bool((out[:5] == 0).all()) and not bool((out[5:] == 0).all())
    assert torch.equal(s[1:], x["state"][1:]) and not torch.equal(s[0], x["state"][0])
    d = dict(
        q=x["q"][:2], k=x["k"][:2], v=x["v"][:2], a=x["a"][:2], b=x["b"][:2], A_log=x["A_log"], dt_bias=x["dt_bias"]
    )
    s2 = x["state"].clone()
    out = gdn_decode(**d, state=s2, slots=torch.tensor([2, -5], dtype=torch.int32))
    assert bool((out[1] == 0).all()) and torch.equal(s2[:2], x["state"][:2])


@pytest.mark.parametrize("op", ["prefill", "decode"])
def test_reference_is_bitwise_equal_alone_and_batched(op):
    """The target alone, then among batchmates: its outputs and final state are bitwise equal."""
    mates, target = inputs([3, 100], 2, 4, 16, seed=8), inputs([65], 2, 4, 16, seed=9)
    gates = dict(A_log=target["A_log"], dt_bias=target["dt_bias"])
    pool = 0.1 * torch.randn(6, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    s_alone, s_batch = pool.clone(), pool.clone()
    if op == "prefill":
        tokens = {key: target[key] for key in ("q", "k", "v", "a", "b")}
        alone = gdn_prefill(**tokens, **gates, cu_seqlens=torch.tensor([0, 65], dtype=torch.int32), state=s_alone,
                            slots=torch.tensor([2], dtype=torch.int32))  # fmt: skip
        batch = {key: torch.cat([mates[key][:3], target[key], mates[key][3:]]) for key in tokens}
        out = gdn_prefill(**batch, **gates, cu_seqlens=torch.tensor([0, 3, 68, 168], dtype=torch.int32),
                          state=s_batch, slots=torch.tensor([0, 2, 5], dtype=torch.int32))  # fmt: skip
        assert torch.equal(out[3:68], alone)
    else:
        tokens = {key: target[key][:1] for key in ("q", "k", "v", "a", "b")}
        alone = gdn_decode(**tokens, **gates, state=s_alone, slots=torch.tensor([2], dtype=torch.int32))
        batch = {key: torch.cat([mates[key][:2], target[key][:1], mates[key][2:5]]) for key in tokens}
        out = gdn_decode(**batch, **gates, state=s_batch, slots=torch.tensor([0, -1, 2, 3, 4, -1], dtype=torch.int32))
        assert torch.equal(out[2], alone[0])
    assert torch.equal(s_batch[2], s_alone[2])


def test_bad_gdn_input():
    x = inputs([5], 2, 4, 16)
    with pytest.raises(ValueError, match=r"HV \(=3\) must be divisible by HK \(=2\)"):
        gdn_prefill(**{**x, "v": torch.randn(5, 3, 16), "a": torch.randn(5, 3), "b": torch.randn(5, 3)})
    with pytest.raises(ValueError, match=r"state: dtype bfloat16 is not accepted; expected one of float32"):
        gdn_prefill(**{**x, "state": x["state"].bfloat16()})
    with pytest.raises(ValueError, match=r"slots: entry 7 points outside state.shape\[0\]"):
        gdn_prefill(**{**x, "slots": torch.tensor([7], dtype=torch.int32)})
    with pytest.raises(ValueError, match=r"slots: non-negative entries must be distinct"):
        gdn_decode(**{k: x[k][:2] for k in ("q", "k", "v", "a", "b")}, A_log=x["A_log"], dt_bias=x["dt_bias"],
                   state=x["state"], slots=torch.tensor([1, 1], dtype=torch.int32))  # fmt: skip
    with pytest.raises(ValueError, match=r"cu_seqlens \(sequence lengths\): every length must be > 0"):
        gdn_prefill(**{**x, "cu_seqlens": torch.tensor([0, 0, 5], dtype=torch.int32),
                       "slots": torch.tensor([0, 1], dtype=torch.int32)})  # fmt: skip
    with pytest.raises(ValueError, match=r"k: expected shape \[T, HK, K\] with K=16 \(from q\)"):
        gdn_prefill(**{**x, "k": torch.randn(5, 2, 8)})
    with pytest.raises(ValueError, match=r"use_qk_l2norm: expected a bool"):
        gdn_prefill(**x, use_qk_l2norm="yes")
