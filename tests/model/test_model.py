"""The tiny hybrid model, dense (`tiny`) and with Qwen3-Next's sparse MoE block (`tiny-moe`): against an
independent step-by-step reference, and alone vs batched."""

import math

import pytest
import torch

from gdn_lab.model import OPS, Model, ModelConfig
from gdn_lab.trace import Layout, diff, first_culprit, record, summarize

PROMPTS = [[5, 17, 3, 99, 42, 8, 1], [64, 2], [7, 7, 7, 120, 33]]
TARGET = 1  # the two-token prompt: 2 rows alone, 14 in the batch (the CPU's float32 GEMM switches paths below 8)
# The model is float32 with float32/float64 roundings at the ops' boundaries (and a chunked GDN prefill);
# the reference is float64 throughout, token by token. Measured: max |logit difference| 7.7e-6 on logits
# up to 3.3, max |logprob difference| 3.7e-6, every greedy token equal; the bound leaves 13x room.
LOGIT_ATOL = 1e-4


@pytest.fixture(scope="module", params=["tiny", "tiny-moe"])
def model(request) -> Model:
    return Model(ModelConfig.from_name(request.param))


# -- an independent reference: the Qwen3-Next math, one token at a time, in float64 --


def rmsnorm0(x, w, eps):  # zero-centred: (1 + w)
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * (1 + w)


def silu(x):
    return x / (1 + torch.exp(-x))


def swiglu(w, p, x):
    return w[p + "down_proj.weight"] @ (silu(w[p + "gate_proj.weight"] @ x) * (w[p + "up_proj.weight"] @ x))


class Reference:
    """Reads the model's weights, not its code."""

    def __init__(self, model: Model) -> None:
        self.cfg = c = model.config
        self.w = {k: v.detach().double() for k, v in model.state_dict().items()}
        self.gdn = {}
        self.kv = {}
        for i, kind in enumerate(c.layer_types):
            if kind == "linear_attention":
                self.gdn[i] = [torch.zeros(c.conv_kernel - 1, c.conv_dim, dtype=torch.float64),
                               torch.zeros(c.linear_num_value_heads, c.linear_head_dim, c.linear_head_dim, dtype=torch.float64)]  # fmt: skip
            else:
                self.kv[i] = ([], [])
        self.pos = 0

    def gated_deltanet(self, i, x):
        c, w, p = self.cfg, self.w, f"layers.{i}.linear_attn."
        hk, hv, d = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_head_dim
        r = hv // hk
        qkvz = (w[p + "in_proj_qkvz.weight"] @ x).reshape(hk, 2 * d + 2 * r * d)
        ba = (w[p + "in_proj_ba.weight"] @ x).reshape(hk, 2 * r)
        q, k = qkvz[:, :d], qkvz[:, d : 2 * d]
        v, z = qkvz[:, 2 * d : 2 * d + r * d].reshape(hv, d), qkvz[:, 2 * d + r * d :].reshape(hv, d)
        b, a = ba[:, :r].reshape(hv), ba[:, r:].reshape(hv)
        hist, S = self.gdn[i]
        window = torch.cat([hist, torch.cat([q.flatten(), k.flatten(), v.flatten()])[None]])  # [W, C], oldest first
        self.gdn[i][0] = window[1:]
        y = silu((w[p + "conv_weight"].T * window).sum(0))
        qc, kc, vc = y[: hk * d].reshape(hk, d), y[hk * d : 2 * hk * d].reshape(hk, d), y[2 * hk * d :].reshape(hv, d)
        qn = qc / torch.sqrt((qc * qc).sum(-1, keepdim=True) + 1e-6) * d**-0.5
        kn = kc / torch.sqrt((kc * kc).sum(-1, keepdim=True) + 1e-6)
        g = -torch.exp(w[p + "A_log"]) * torch.log1p(torch.exp(a + w[p + "dt_bias"]))
        beta = 1 / (1 + torch.exp(-b))
        o = torch.empty(hv, d, dtype=torch.float64)
        for h in range(hv):  # value head h reads key head h // r
            kh = h // r
            S[h] = torch.exp(g[h]) * S[h]  # [V, K]
            u = beta[h] * (vc[h] - S[h] @ kn[kh])
            S[h] = S[h] + torch.outer(u, kn[kh])
            o[h] = S[h] @ qn[kh]
        o = o / torch.sqrt((o * o).mean(-1, keepdim=True) + c.rms_norm_eps) * w[p + "norm.weight"] * silu(z)
        return w[p + "out_proj.weight"] @ o.flatten()

    def attention(self, i, x):
        c, w, p = self.cfg, self.w, f"layers.{i}.self_attn."
        hq, hkv, d = c.num_attention_heads, c.num_kv_heads, c.head_dim
        qg = (w[p + "q_proj.weight"] @ x).reshape(hq, 2 * d)
        q, gate = qg[:, :d], qg[:, d:]
        k = (w[p + "k_proj.weight"] @ x).reshape(hkv, d)
        v = (w[p + "v_proj.weight"] @ x).reshape(hkv, d)
        q, k = rmsnorm0(q, w[p + "q_norm.weight"], c.rms_norm_eps), rmsnorm0(k, w[p + "k_norm.weight"], c.rms_norm_eps)
        rot = c.rotary_dim
        ang = self.pos * c.rope_theta ** -(torch.arange(0, rot, 2, dtype=torch.float64) / rot)

        def rope(t):
            x1, x2 = t[:, : rot // 2], t[:, rot // 2 : rot]
            return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin(), t[:, rot:]], -1)

        q, k = rope(q), rope(k)
        keys, values = self.kv[i]
        keys.append(k)
        values.append(v)
        K, V = torch.stack(keys), torch.stack(values)  # [L, Hkv, D], dense: every position so far
        o = torch.empty(hq, d, dtype=torch.float64)
        for h in range(hq):
            s = K[:, h // (hq // hkv)] @ q[h] * d**-0.5
            o[h] = torch.softmax(s, 0) @ V[:, h // (hq // hkv)]
        o = o * (1 / (1 + torch.exp(-gate)))
        return w[p + "o_proj.weight"] @ o.flatten()

    def moe(self, i, x):
        """Qwen3-Next's sparse MoE block, one expert at a time (HF's Qwen3NextSparseMoeBlock math)."""
        c, w, p = self.cfg, self.w, f"layers.{i}.mlp."
        probs = torch.softmax(w[p + "gate.weight"] @ x, 0)
        top = probs.topk(c.num_experts_per_tok)
        out = torch.zeros_like(x)
        for weight, e in zip(top.values / top.values.sum(), top.indices.tolist()):
            gate, up = (w[p + "experts.w13"][e] @ x).split(c.moe_intermediate_size)
            out += weight * (w[p + "experts.w2"][e] @ (silu(gate) * up))
        shared_gate = 1 / (1 + torch.exp(-(w[p + "shared_expert_gate.weight"] @ x)))
        return out + shared_gate * swiglu(w, p + "shared_expert.", x)

    def step(self, token: int) -> torch.Tensor:
        """Feed one token; the logits of the next."""
        c, w = self.cfg, self.w
        h = w["embed_tokens.weight"][token]
        for i, kind in enumerate(c.layer_types):
            x = rmsnorm0(h, w[f"layers.{i}.input_layernorm.weight"], c.rms_norm_eps)
            h = h + (self.gated_deltanet(i, x) if kind == "linear_attention" else self.attention(i, x))
            x = rmsnorm0(h, w[f"layers.{i}.post_attention_layernorm.weight"], c.rms_norm_eps)
            h = h + (self.moe(i, x) if c.num_experts else swiglu(w, f"layers.{i}.mlp.", x))
        self.pos += 1
        return w["lm_head.weight"] @ rmsnorm0(h, w["norm.weight"], c.rms_norm_eps)


def test_prefill_and_decode_match_the_step_by_step_reference(model):
    n_new = 5
    cache = model.new_cache([len(p) for p in PROMPTS], n_new)
    outs = [model.prefill(PROMPTS, cache)]
    for _ in range(n_new - 1):
        outs.append(model.decode_step(outs[-1].tokens, cache))
    for r, prompt in enumerate(PROMPTS):
        ref = Reference(model)
        for t in prompt[:-1]:
            ref.step(t)
        fed = prompt[-1]
        for out in outs:  # teacher-forced with the model's tokens, so a near-tie cannot cascade
            logits = ref.step(fed)
            got = out.logits[r].double()
            assert (got - logits).abs().max() <= LOGIT_ATOL
            top2 = logits.topk(2).values
            if top2[0] - top2[1] > 2 * LOGIT_ATOL:
                assert out.tokens[r].item() == logits.argmax().item()
            assert math.isclose(
                out.logprobs[r].item(), torch.log_softmax(logits, 0)[out.tokens[r]].item(), abs_tol=LOGIT_ATOL
            )
            fed = out.tokens[r].item()


def test_page_and_slot_placement_do_not_change_the_bits(model):
    shuffled = model.generate(PROMPTS, 4, placement_seed=3)
    in_order_cache = model.new_cache([len(p) for p in PROMPTS], 4, shuffle=False)
    out = model.prefill(PROMPTS, in_order_cache)
    assert torch.equal(out.tokens, shuffled.tokens[:, 0]) and torch.equal(out.logprobs, shuffled.logprobs[:, 0])
    assert shuffled.tokens.shape == (3, 4)


@pytest.mark.parametrize("layers", [1, 3])
def test_a_model_without_attention_layers(layers):
    """Fewer than full_attention_interval layers: GDN only, no KV pages (the page table is empty)."""
    model = Model(ModelConfig.from_name("tiny-moe", num_layers=layers))
    assert "full_attention" not in model.config.layer_types
    batched, alone = model.generate(PROMPTS, 3), model.generate([PROMPTS[TARGET]], 3)
    assert torch.equal(alone.tokens[0], batched.tokens[TARGET]) and torch.equal(
        alone.logprobs[0], batched.logprobs[TARGET]
    )


def generate_traced(model, prompts, ids, level):
    with record(model, Layout.per_request(ids), level=level) as tr:
        out = model.generate(prompts, 4, request_ids=ids, trace=tr)
    return out, tr


@pytest.mark.parametrize("level", ["modules", "ops"])
def test_a_request_is_bitwise_equal_alone_and_batched_and_the_trace_agrees(model, level):
    ids = ["a", "t", "c"]
    batched, tb = generate_traced(model, PROMPTS, ids, level)
    alone, ta = generate_traced(model, [PROMPTS[TARGET]], ["t"], level)
    assert torch.equal(alone.tokens[0], batched.tokens[TARGET])
    assert torch.equal(alone.logprobs[0], batched.logprobs[TARGET])
    df = diff(ta, tb, "t")
    assert first_culprit(df) is None
    assert sorted(df["step"].unique()) == [0, 1, 2, 3]
    counts = summarize(df).set_index(["kind", "op"])
    assert counts["culprits"].sum() == 0 and counts["outputs_changed"].sum() == 0
    if level == "ops":
        for op in ("gdn_layer_prefill", "gdn_decode", "causal_conv1d_update", "prefill_attention", "decode_attention"):
            assert counts.loc[("lab_op", op), "compared"] > 0
        # the cache-reading ops compared their caches per request: nothing unaligned about them
        attn = df[df["op"].isin(["decode_attention", "gdn_decode", "gdn_layer_prefill"])]
        assert (attn["unaligned_inputs"] == "").all() and attn["input_equal"].all()

    # The control proves the comparison can fail: torch.matmul in float32 on the CPU takes another
    # path for a 2-row (or 1-row) product than for a 14-row (or 3-row) one.
    model.set_backends({"matmul": "torch-native"})
    try:
        batched, tb = generate_traced(model, PROMPTS, ids, level)
        alone, ta = generate_traced(model, [PROMPTS[TARGET]], ["t"], level)
    finally:
        model.set_backends({"matmul": "torch"})
    assert not torch.equal(alone.logprobs[0], batched.logprobs[TARGET])
    culprit = first_culprit(diff(ta, tb, "t"))
    assert culprit["step"] == 0
    if level == "ops":
        assert (culprit["kind"], culprit["op"], culprit["backend_a"]) == ("lab_op", "matmul", "torch-native")
        assert culprit["name"] == "layers.0.linear_attn.in_proj_qkvz.matmul"
    else:
        assert (culprit["kind"], culprit["name"]) == ("module", "layers.0.linear_attn.in_proj_qkvz")


@pytest.mark.slow
def test_triton_backends_agree_with_the_references(model, device):
    """Our Triton kernels on the test device (the interpreter on the CPU): same tokens, logprobs within 1e-5."""
    ref = model if device.type == "cpu" else Model(model.config, device=device)  # the same seeded weights
    tri = Model(model.config, device=device, backends={
        "matmul": "triton", "rms_norm": "triton", "gdn_layer_prefill": "triton-fused", "gdn_decode": "triton",
        "prefill_attention": "triton", "decode_attention": "triton", "fused_moe": "triton",
    })  # fmt: skip
    prompts = PROMPTS[:2]
    want, got = ref.generate(prompts, 3), tri.generate(prompts, 3)
    assert torch.equal(want.tokens, got.tokens)
    assert (want.logprobs - got.logprobs).abs().max() <= 1e-5


@pytest.mark.parametrize("level", ["modules", "ops"])
def test_the_moe_control_is_named_where_the_batch_crosses_its_switch(level, device):
    """fused_moe's control sums a token's experts atomic-style above E = 8 tokens: the 2-token target
    alone (2 rows) and in the batch (14) take the two sums at the prefill, never in decode (3 rows)."""
    model = Model(ModelConfig.from_name("tiny-moe"), backends={"fused_moe": "triton-atomic-by-batch"}, device=device)
    ids = ["a", "t", "c"]
    batched, tb = generate_traced(model, PROMPTS, ids, level)
    alone, ta = generate_traced(model, [PROMPTS[TARGET]], ["t"], level)
    assert not torch.equal(alone.logprobs[0], batched.logprobs[TARGET])
    culprit = first_culprit(diff(ta, tb, "t"))
    assert culprit["step"] == 0
    if level == "ops":
        assert (culprit["name"], culprit["op"], culprit["backend_a"]) == (
            "layers.0.mlp.experts.fused_moe",
            "fused_moe",
            "triton-atomic-by-batch",
        )
    else:
        assert (culprit["kind"], culprit["name"]) == ("module", "layers.0.mlp.experts")


def test_presets():
    tiny = ModelConfig.from_name("tiny")
    assert tiny.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    tp4 = ModelConfig.from_name("qwen3-next-80b-tp4")
    assert (tp4.hidden_size, tp4.num_layers, tp4.dtype) == (2048, 48, torch.bfloat16)
    assert (tp4.num_attention_heads, tp4.num_kv_heads, tp4.head_dim, tp4.rotary_dim) == (4, 1, 256, 64)
    gdn = (tp4.linear_num_key_heads, tp4.linear_num_value_heads, tp4.linear_head_dim, tp4.conv_kernel)
    assert gdn == (4, 8, 128, 4)
    assert (tp4.conv_dim, tp4.intermediate_size) == (2048, 1408)
    assert tp4.layer_types.count("full_attention") == 12
    assert ModelConfig.from_name("tiny", num_layers=8).layer_types.count("full_attention") == 2
    assert tiny.num_experts == 0 and tp4.num_experts == 0  # the dense stand-in
    moe = ModelConfig.from_name("tiny-moe")
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (8, 3, 160)
    names = dict(Model(moe).named_modules())
    assert {"layers.0.mlp.gate", "layers.0.mlp.experts", "layers.0.mlp.shared_expert_gate"} <= set(names)


@pytest.mark.parametrize(
    "make, match",
    [
        pytest.param(lambda: ModelConfig.from_name("llama"), "name: 'llama' is not a preset", id="preset"),
        pytest.param(lambda: ModelConfig.from_name("tiny", hidden=3), "hidden are not ModelConfig fields", id="field"),
        pytest.param(lambda: ModelConfig.from_name("tiny", num_kv_heads=3), "divisible by num_kv_heads", id="gqa"),
        pytest.param(lambda: ModelConfig.from_name("tiny", linear_num_key_heads=3), "linear_num_key_heads", id="gva"),
        pytest.param(
            lambda: ModelConfig.from_name("tiny", num_layers=0), "num_layers: expected a positive int", id="layers"
        ),
        pytest.param(lambda: ModelConfig.from_name("tiny", dtype=torch.int8), "dtype", id="dtype"),
        pytest.param(
            lambda: ModelConfig.from_name("tiny-moe", num_experts_per_tok=9),
            r"num_experts_per_tok: must be at most num_experts \(=8\), got 9",
            id="top-k",
        ),
        pytest.param(
            lambda: ModelConfig.from_name("tiny", num_experts=-1), "num_experts: expected an int >= 0", id="experts"
        ),
        pytest.param(
            lambda: ModelConfig.from_name("tiny", num_experts=4), "num_experts_per_tok|moe_intermediate_size", id="moe"
        ),
        pytest.param(lambda: ModelConfig.from_name("tiny", partial_rotary_factor=0.01), "rotary", id="rope"),
        pytest.param(
            lambda: ModelConfig.from_name("tiny", rms_norm_eps=float("inf")),
            "rms_norm_eps: expected a positive finite float, got inf",
            id="eps",
        ),
        pytest.param(
            lambda: Model(ModelConfig.from_name("tiny"), backends={"softmax": "torch"}),
            "not called by the model",
            id="op",
        ),
        pytest.param(
            lambda: Model(ModelConfig.from_name("tiny"), backends={"matmul": "cublas"}),
            r"backends\['matmul'\]: 'cublas'",
            id="backend",
        ),
    ],
)
def test_bad_configs_and_backends_are_rejected(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_calls_are_rejected(model):
    cache = model.new_cache([2, 3], 2)
    with pytest.raises(ValueError, match=r"prompts: lengths \[2, 2\]"):
        model.prefill([[1, 2], [3, 4]], cache)
    with pytest.raises(ValueError, match=r"token 128 is not accepted; expected ints in \[0, 128\)"):
        model.prefill([[1, 2], [3, 4, 128]], cache)
    with pytest.raises(ValueError, match="not prefilled yet"):
        model.decode_step(torch.tensor([1, 2]), cache)
    out = model.prefill([[1, 2], [3, 4, 5]], cache)
    with pytest.raises(ValueError, match=r"tokens: expected int64 \[2\]"):
        model.decode_step(out.tokens[:1], cache)
    model.decode_step(out.tokens, cache)
    with pytest.raises(ValueError, match="hold their max_new_tokens already"):
        model.decode_step(out.tokens, cache)
    with pytest.raises(ValueError, match="already prefilled"):
        model.prefill([[1, 2], [3, 4, 5]], cache)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.new_cache([250], 10)
    with pytest.raises(ValueError, match="request_ids: duplicate"):
        model.new_cache([2, 2], 1, request_ids=[0, 0])
    assert set(OPS) == set(model.backends)
