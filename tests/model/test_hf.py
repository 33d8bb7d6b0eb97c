"""Hugging Face models built from a config: left-padded greedy decoding, the Linear switch, the trace layouts."""

import pytest
import torch

from gdn_lab.trace import Layout, record

transformers = pytest.importorskip("transformers")

from gdn_lab.model import hf  # noqa: E402

PROMPTS = [[5, 17, 3, 99, 42, 8, 1], [64, 2], [7, 7, 7, 120, 33]]


@pytest.fixture(scope="module")
def qwen3():
    return hf.HFModel("hf-qwen3-tiny")


def test_builders_and_bad_names():
    assert set(hf.BUILDERS) == {"hf-qwen3-tiny", "hf-qwen3-next-tiny", "hf-qwen3-next-moe-tiny", "hf-qwen3-8b"}
    assert hf.is_hf("hf-qwen3-tiny") and not hf.is_hf("tiny")
    with pytest.raises(ValueError, match="name: 'gpt2' is not a Hugging Face builder"):
        hf.HFModel("gpt2")


def test_a_padded_request_decodes_like_the_request_alone(qwen3):
    batched = qwen3.generate(PROMPTS, 3)
    assert batched.tokens.shape == (3, 3) and batched.logprobs.dtype == torch.float32
    for i, p in enumerate(PROMPTS):  # padding and positions handled: the same math, up to rounding
        alone = qwen3.generate([p], 3)
        assert torch.equal(alone.tokens[0], batched.tokens[i])
        torch.testing.assert_close(alone.logprobs[0], batched.logprobs[i], atol=1e-5, rtol=0)


def test_generate_states_the_layouts_to_the_trace(qwen3):
    with record(qwen3.model, Layout.per_request([0, 1, 2]), level="modules") as tr:
        qwen3.generate(PROMPTS, 2, request_ids=[0, 1, 2], trace=tr)
    roots = [e for e in tr.entries if e.name == "Qwen3ForCausalLM"]
    assert [(e.step, e.layout.kind) for e in roots] == [(0, "padded"), (1, "per_request")]
    assert roots[0].layout.lengths == (7, 2, 5)
    ids = next(r for r in roots[0].inputs if r.path == "kwargs['input_ids']")
    assert ids.alignment == "padded"


def test_linear_backend_routes_every_linear_through_the_lab_matmul_and_restores(qwen3):
    before = qwen3.generate(PROMPTS[:1], 2)
    with record(qwen3.model, Layout.per_request([0]), level="ops") as tr, qwen3.linear_backend("torch"):
        qwen3.generate(PROMPTS[:1], 2, trace=tr)
    lab = [e for e in tr.entries if e.kind == "lab_op"]
    assert lab and {e.op for e in lab} == {"matmul"} and {e.backend for e in lab} == {"torch"}
    assert "model.layers.0.self_attn.q_proj.matmul" in {e.name for e in lab}
    assert all("forward" not in vars(m) for m in qwen3.model.modules())
    after = qwen3.generate(PROMPTS[:1], 2)
    assert torch.equal(before.tokens, after.tokens) and torch.equal(before.logprobs, after.logprobs)
    with pytest.raises(ValueError, match="backend: 'cublas' is not a matmul backend"), qwen3.linear_backend("cublas"):
        pass


def test_qwen3_next_takes_the_torch_gdn_path_on_the_cpu():
    m = hf.HFModel("hf-qwen3-next-tiny")
    module = hf.qwen3_next_module(torch_path=True)
    assert not hf._calls_fla_on_the_cpu(module)  # even where flash-linear-attention is installed
    out = m.generate(PROMPTS[1:], 2)  # fla's chunk kernel would fail here: it needs a GPU
    assert out.tokens.shape == (2, 2)


@pytest.mark.parametrize(
    ("prompts", "n", "match"),
    [([], 2, "prompts: expected a non-empty"), ([[1, 300]], 2, "token 300"), ([[1]], 0, "max_new_tokens")],
    ids=["empty", "vocab", "n"],
)
def test_bad_input(qwen3, prompts, n, match):
    with pytest.raises(ValueError, match=match):
        qwen3.generate(prompts, n)
