"""model_invariance: each mode on the tiny lab model (invariant backends: zero culprits; the control:
caught and named, with its step and token), the workloads, the rule columns of a ruled culprit, and
a Hugging Face model built from a config (when transformers is installed)."""

import pytest
import torch

from gdn_lab import routing
from gdn_lab.experiments import model_invariance as mi
from gdn_lab.ops.decode_attention import reference as decode_reference
from gdn_lab.rules.base import Predicted

SMALL = dict(model="tiny", prompt_lens=[5], batch_sizes=[3], max_new_tokens=3, device="cpu")


@pytest.fixture(scope="module")
def tiny():
    return mi.run(mi.Config(**SMALL), progress=False)


@pytest.mark.parametrize("mode", mi.MODES)
def test_invariant_backends_give_zero_culprits_and_the_control_is_caught_and_named(tiny, mode):
    t = tiny.table[tiny.table["mode"] == mode]
    plain, ctrl = t[~t.is_control], t[t.is_control]
    assert (plain.status == "compared").all() and plain.bitwise_equal.all()
    traced = plain[plain.traced]
    assert len(traced) >= 1 and (traced.n_culprits == 0).all() and (traced.calls_compared > 0).all()
    assert traced.logits_equal.all() and traced.culprit_name.isna().all()
    assert set(ctrl.control) == {"matmul:torch-splitk-by-batch"}  # "auto" on the CPU
    assert ctrl.control_caught.eq(True).all() and not t.insensitive.any()
    differ = ctrl[~ctrl.bitwise_equal.astype(bool)]
    assert not differ.empty
    r = differ.iloc[0]
    assert (r.culprit_kind, r.culprit_op, r.culprit_backend) == ("lab_op", "matmul", "torch-splitk-by-batch")
    assert r.culprit_name.endswith(".matmul") and r.control_named
    # the rows say where: the culprit's step, the first step whose output differs, the tokens there
    assert r.step >= 0 and r.first_diff_step >= r.step and r.token_alone >= 0 and r.token_batched >= 0
    assert r.module_culprit == r.culprit_name.removesuffix(".matmul")  # the Linear module around it


def test_the_calls_and_layers_tables(tiny):
    calls = tiny.calls[~tiny.calls.is_control.astype(bool)]
    assert {"module", "function", "lab_op"} <= set(calls.kind)
    lab = calls[calls.kind == "lab_op"].set_index(["mode", "op"])
    for mode in mi.MODES:  # every op of the hybrid model was compared, none changed
        assert {"matmul", "rms_norm", "gdn_layer_prefill", "gdn_decode", "decode_attention"} <= set(lab.loc[mode].index)
    assert calls.culprits.sum() == 0 and calls.outputs_changed.sum() == 0
    layers = tiny.layers
    assert set(layers.layer_label) >= {"embed", "0", "1", "2", "3", "head"}
    ctrl = layers[layers.is_control.astype(bool) & (layers.culprits > 0)]
    assert not ctrl.empty and ctrl.first_changed.str.endswith("matmul").all()


def test_headline_and_conclusion_are_computed_from_the_table(tiny):
    line = mi.headline(tiny.table)
    assert line.startswith("tiny: ") and "0 culprits" in line and "caught in mixed, prefix, single" in line
    text = mi.conclusion(tiny.table, tiny.calls)
    assert "control matmul=torch-splitk-by-batch (single): caught" in text
    assert "Calls compared with invariant backends" in text and "culprits 0" in text
    s = mi.summarize(tiny.table)
    assert set(s[~s.is_control].verdict) == {"invariant"} and set(s[s.is_control].verdict) == {"caught"}


def test_no_control_means_insensitive():
    res = mi.run(mi.Config(**{**SMALL, "modes": ["single"], "max_new_tokens": 2, "control": None}), progress=False)
    assert res.table.insensitive.all() and res.table.control_caught.isna().all()
    assert "NO control" in mi.headline(res.table)


def test_workloads_are_seeded_with_shorter_and_longer_batchmates():
    cfg = mi.Config(model="tiny", prompt_lens=[6, 10], batch_sizes=[2, 4], trials=2, min_len=1, max_len=20,
                    device="cpu")  # fmt: skip
    work = mi.batches(cfg, 128)
    assert work == mi.batches(cfg, 128)
    single = [b for b in work if b.mode == "single"]
    assert all(b.prompts == (b.alone,) * b.batch_size and b.compared == tuple(range(b.batch_size)) for b in single)
    mixed = [b for b in work if b.mode == "mixed"]
    for b in mixed:
        (pos,) = b.compared
        assert b.prompts[pos] == b.alone and len(b.alone) == b.target_len
        mates = [len(p) for i, p in enumerate(b.prompts) if i != pos]
        if b.batch_size >= 3:
            assert min(mates) < b.target_len < max(mates)
        assert all(1 <= n <= 20 for n in mates)
    assert {len(b.prompts[1 - b.compared[0]]) < b.target_len for b in mixed if b.batch_size == 2} == {True, False}
    prefix = [b for b in work if b.mode == "prefix"]
    longest = max(prefix, key=lambda b: b.target_len).alone
    for b in prefix:
        assert all(longest[: len(p)] == p for p in b.prompts)  # shared prefixes of one prompt
        assert {len(p) for p in b.prompts} == {6, 10}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(model="nope"), "model: 'nope'"),
        (dict(modes=["single", "burst"]), "modes: 'burst'"),
        (dict(control="matmul"), "control: 'matmul' is not accepted"),
        (dict(control="matmul:triton"), "not a batch-variant control of matmul"),
        (dict(model="hf-qwen3-tiny", control="decode_attention:triton-splitk-by-batch"), "op one of matmul"),
        (dict(model="hf-qwen3-tiny", backends={"matmul": "triton"}), "backends: .* apply to the lab model"),
        (dict(backends={"softmax": "torch"}), "not called by the model"),
        (dict(prompt_lens=[250], max_new_tokens=10), "exceed tiny's max_position_embeddings"),
        (dict(level="aten"), "level: 'aten'"),
        (dict(min_len=5, max_len=4), "max_len: must be >= min_len"),
    ],
    ids=["model", "mode", "control-form", "control-not-control", "hf-control-op", "hf-backends", "op", "positions",
         "level", "lens"],
)  # fmt: skip
def test_bad_config_is_rejected_before_anything_runs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mi.Config(**{"device": "cpu", **kwargs})


# -- a culprit whose backend carries a dispatch rule --


class ToyRule:
    """Predicts "one pass" for a lone request and "split" for a batch (what the toy backend does)."""

    name = "toy_rule"
    source = "this test"

    def predict(self, args, request, env):
        n = args["q"].shape[0]
        variant = "one pass" if n == 1 else "split"
        return Predicted(variant, variant, f"{n} requests, longest {int(args['seq_lens'].max())} tokens")

    def expect(self, alone_key, batched_key):
        return "equal" if alone_key == batched_key else "switch"


def toy_decode(**args):
    out = decode_reference.decode_attention_torch(**args)
    return out if args["q"].shape[0] == 1 else out * (1 + 2**-12)  # the batch's "split" rounds differently


@pytest.fixture
def ruled_backend():
    b = routing.register(
        routing.Backend(
            "decode_attention",
            "toy-ruled",
            toy_decode,
            library=routing.LIBRARY_TORCH,
            auto=False,
            rule=ToyRule(),
            description="test: batch-variant, with a rule",
        )  # fmt: skip
    )
    yield b
    routing._REGISTRY["decode_attention"].pop("toy-ruled")


def test_a_ruled_culprit_carries_the_rule_for_both_launches(ruled_backend):
    res = mi.run(
        mi.Config(**{**SMALL, "modes": ["mixed"], "backends": {"decode_attention": "toy-ruled"}, "control": None}),
        progress=False,
    )
    r = res.table.iloc[0]
    assert not r.bitwise_equal
    assert (r.culprit_op, r.culprit_backend, r.step) == ("decode_attention", "toy-ruled", 1)  # the first decode step
    assert r.culprit_name == "layers.3.self_attn.decode_attention"
    assert (r.rule, r.rule_alone, r.rule_batched, r.rule_expected) == ("toy_rule", "one pass", "split", "switch")
    assert r.rule_explanation.startswith(
        "toy-ruled: one pass alone (1 requests, longest 6 tokens), split in the batch of 3 (3 requests"
    )


def test_aiters_moe_config_switch_is_named_and_explained_in_a_whole_model(device):
    """AITER's Triton MoE in the lab model: a 90-token prompt alone launches small_M (K in 64-wide
    slices), three of them (270 tokens) medium_M (128): the first culprit is layer 0's fused_moe,
    explained by the rule for both launches."""
    from gdn_lab import aiter

    if not aiter.probe().installed:
        pytest.skip(f"aiter is not installed ({aiter.INSTALL_HINT})")
    if device.type != "cpu":
        pytest.skip("an interpreter claim (each K slice a dot of its own); compiled, see test_aiter_triton.py")
    res = mi.run(
        mi.Config(model="tiny-moe", dtype="float16", modes=["single"], prompt_lens=[90], batch_sizes=[3],
                  max_new_tokens=1, max_len=128, backends={"fused_moe": "aiter-triton-moe"}, control=None,
                  device="cpu"),
        progress=False,
    )  # fmt: skip
    r = res.table.iloc[0]
    assert not r.bitwise_equal
    assert (r.culprit_name, r.culprit_backend, r.step) == ("layers.0.mlp.experts.fused_moe", "aiter-triton-moe", 0)
    assert (r.rule, r.rule_expected) == ("aiter_triton_moe", "switch")
    assert "alone (M=90: MI350X-MOE-DEFAULT.json entry small_M" in r.rule_explanation
    assert "in the batch of 3 (M=270: MI350X-MOE-DEFAULT.json entry medium_M" in r.rule_explanation


# -- Hugging Face models built from a config --


def test_hf_qwen3_modes_and_control():
    pytest.importorskip("transformers")
    res = mi.run(
        mi.Config(model="hf-qwen3-tiny", modes=["single", "mixed"], prompt_lens=[6], batch_sizes=[3],
                  max_new_tokens=2, max_len=12, device="cpu"),
        progress=False,
    )  # fmt: skip
    t = res.table
    assert (t.model_kind == "hf").all() and (t.status == "compared").all()
    assert t.control_caught.eq(True).all()
    ctrl = t[t.is_control & t.traced]
    assert ctrl.control_named.all() and (ctrl.culprit_backend == "torch-splitk-by-batch").all()
    # the padded prefill is compared per request (padding left out): the embedding's output is equal
    # (what else runs before layer 0 depends on the transformers version: some versions hash rotary's
    # [N, 1, T] position ids per request, padding included, and see them change, with their inputs)
    mixed = res.layers[(res.layers["mode"] == "mixed") & ~res.layers.is_control.astype(bool)]
    step0 = mixed[(mixed.step == 0) & (mixed.layer_label == "embed")]
    assert not step0.empty and (step0.culprits == 0).all()
    assert not step0.first_changed.str.startswith("model.embed_tokens").any()
    for r in t[t.traced & (t.n_culprits > 0)].itertuples():  # whatever changed is named where it ran
        assert r.culprit_kind in ("function", "lab_op") and isinstance(r.module_culprit, str)


def test_hf_qwen3_next_torch_path_op_level_names_the_call_inside_the_module_blamed():
    pytest.importorskip("transformers")
    # Measured on the 2-core CPU this was written on (torch 2.13, AVX2 kernels): at 31 tokens (batch of
    # 2) Tensor.sigmoid of layer 0's beta gate changes the target's bits and its logprob (vector body vs
    # scalar tail); modules alone blame layers.0.linear_attn, and a hook that does not check inputs
    # blames its out_proj, whose input had changed. Another CPU may round elsewhere.
    res = mi.run(
        mi.Config(model="hf-qwen3-next-tiny", modes=["single"], prompt_lens=[31], batch_sizes=[2], max_new_tokens=1,
                  control=None, device="cpu"),
        progress=False,
    )  # fmt: skip
    r = res.table.iloc[0]
    if r.culprit_name != "model.layers.0.linear_attn.Tensor.sigmoid":
        pytest.skip(f"this CPU's kernels rounded elsewhere (first culprit: {r.culprit_name})")
    assert (r.culprit_kind, r.step, r.culprit_module) == ("function", 0, "model.layers.0.linear_attn")
    assert r.module_culprit == "model.layers.0.linear_attn"
    assert r.first_changed_module == "model.layers.0.linear_attn.out_proj" and not r.first_changed_module_input_equal
    # whether the change reaches the selected token's logprob is the CPU's rounding too: it did on the
    # CPU this was written on (AVX2); on an AVX-512 one (an AMD EPYC VM, 2026-12-02) it stayed equal
    assert r.bitwise_equal or r.first_diff_step == 0


def test_hf_qwen3_next_moe_experts_are_blamed_as_a_module():
    pytest.importorskip("transformers")
    # Measured on the 2-core CPU this was written on (an AVX-512 AMD EPYC VM, torch 2.13, transformers
    # 5.25): at 31 tokens in batches of 2 and 5, HF's Qwen3NextExperts changes the target's bits in layer
    # 0. It loops over the experts with F.linear on each expert's gathered tokens, whose leading dim is
    # that expert's token count (neither the batch's rows nor its requests), so the trace reads them
    # whole: those calls have unaligned inputs and cannot be culprits, and the experts module, whose
    # own inputs were equal, is. Another CPU may round elsewhere first.
    res = mi.run(
        mi.Config(model="hf-qwen3-next-moe-tiny", modes=["single"], prompt_lens=[31], batch_sizes=[2, 5],
                  max_new_tokens=1, control=None, device="cpu"),
        progress=False,
    )  # fmt: skip
    t = res.table
    if not (t.culprit_name == "model.layers.0.mlp.experts").any():
        pytest.skip(f"this CPU's kernels rounded elsewhere (first culprits: {sorted(set(t.culprit_name.dropna()))})")
    r = t[t.culprit_name == "model.layers.0.mlp.experts"].iloc[0]
    assert (r.culprit_kind, r.step) == ("module", 0)


def test_any_hugging_face_causal_lm_built_by_the_caller():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, attn_implementation="sdpa")  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg)
    exp = mi.Config(model="hf-custom", modes=["single"], prompt_lens=[5], batch_sizes=[3], max_new_tokens=2,
                    device="cpu")  # fmt: skip
    res = mi.run(exp, progress=False, model=model)
    t = res.table
    assert (t.model == "hf-custom").all() and (t.dtype == "float32").all() and t.control_caught.eq(True).all()
    ctrl = t[t.is_control & t.traced]
    assert ctrl.culprit_name.str.endswith(".matmul").all() and (ctrl.culprit_backend == "torch-splitk-by-batch").all()
    with pytest.raises(ValueError, match="exactly when cfg.model is 'hf-custom'"):
        mi.run(exp, progress=False)


def _num_requests(args) -> int:
    """Requests in an example call: its per-request lengths, offsets or slots, else a matmul's rows."""
    for name, less in (("seq_lens", 0), ("cu_seqlens", 1), ("slots", 0)):
        if name in args:
            return len(args[name]) - less
    return args["x"].shape[0]


def test_every_registered_rule_predicts_the_same_from_a_kept_call_description():
    # What the trace keeps (shapes, small index tensors) is all the lab's dispatch rules read.
    from gdn_lab.ops import spec
    from gdn_lab.rules.base import RuleEnv
    from gdn_lab.trace.op_views import describe_call

    ruled = [b for op in spec.names() for b in routing.backends(op) if b.rule is not None]
    assert {b.name for b in ruled} >= {"aiter-triton-pa", "aiter-triton-unified"}
    for b in ruled:
        args = spec.get(b.op).example(dtype=torch.float16)  # a dtype every AMD kernel takes
        described = describe_call(args)
        for env in (RuleEnv("gfx950", 256), RuleEnv("gfx942", 1)):
            for i in range(_num_requests(args)):  # every request of the example batch
                assert b.rule.predict(described, i, env) == b.rule.predict(args, i, env), b.name
