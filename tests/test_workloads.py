"""Seeded workloads: the target's content never depends on its batch; batches follow the seed."""

import pytest
import torch

from gdn_lab.ops import spec
from gdn_lab.ops.paged_kv import gather_request
from gdn_lab.workloads import (
    AttentionShape,
    BuildOptions,
    GDNShape,
    LinearShape,
    MoEShape,
    alone,
    build,
    derive_seed,
    fresh_copy,
    make_batch,
    resolve_device,
    resolve_dtype,
    resolve_kv_dtype,
    target_request,
    view,
)

ATT = AttentionShape(4, 2, 32, page_size=4)
GDN = GDNShape(2, 4, 32)
SHAPES = {AttentionShape: ATT, GDNShape: GDN, LinearShape: LinearShape(32, 16), MoEShape: MoEShape(32, 8, 3, 16)}
OPTS = BuildOptions(dtype=torch.float32)
# the input each op's rows are compared on (any op not listed: its first tensor argument)
ROW_INPUT = {"gdn_decode": "v", "gdn_prefill": "v", "gdn_layer_prefill": "projected_qkvz"}


def shape_for(op):
    return SHAPES[spec.get(op).shape]


def test_batches_follow_the_seed():
    t = target_request(50, seed=7)
    a = make_batch(t, 8, seed=7, max_len=100)
    assert a == make_batch(t, 8, seed=7, max_len=100)
    assert a != make_batch(t, 8, seed=8, max_len=100)
    assert a != make_batch(t, 8, seed=7, trial=1, max_len=100)
    assert a.target == t and a.size == 8
    assert all(1 <= n <= 100 for n in a.lengths)
    assert len({r.seed for r in a.requests}) == 8
    assert target_request(50, seed=7) == t and target_request(51, seed=7).seed != t.seed


def test_positions_cover_the_batch():
    t = target_request(5, seed=0)
    positions = {make_batch(t, 4, seed=0, trial=i, max_len=10).position for i in range(40)}
    assert positions == {0, 1, 2, 3}
    assert make_batch(t, 4, seed=0, position=2).position == 2


@pytest.mark.parametrize("op", spec.names())
def test_target_content_is_the_same_alone_and_in_a_batch(op):
    fixed = spec.get(op).fixed_length
    t = target_request(fixed or 37, seed=3, new_tokens=5 if op == "prefill_attention" else None)
    solo = alone(t, seed=3)
    batch = make_batch(t, 5, seed=3, max_len=fixed or 60, new_tokens=t.new_tokens)
    a1, ab = build(op, solo, shape_for(op), OPTS), build(op, batch, shape_for(op), OPTS)
    v1, vb = view(op, solo, a1), view(op, batch, ab)
    first = ROW_INPUT.get(op) or next(k for k, v in a1.items() if isinstance(v, torch.Tensor))
    assert torch.equal(a1[first][v1.rows], ab[first][vb.rows])
    for routed in ("topk_weights", "topk_ids"):  # fused_moe: a token's experts and weights are its request's
        if routed in a1:
            assert torch.equal(a1[routed][v1.rows], ab[routed][vb.rows])
    if spec.get(op).kv_cache:
        for cache in ("k_cache", "v_cache"):
            mine = [
                gather_request(args[cache], args["kv_indptr"].tolist(), args["kv_indices"], view, t.length, None)
                for args, view in ((a1, 0), (ab, batch.position))
            ]
            assert torch.equal(*mine)
        pages_alone = a1["kv_indices"].tolist()
        lo, hi = ab["kv_indptr"][batch.position : batch.position + 2].tolist()
        assert sorted(pages_alone) != pages_alone, "pages are shuffled over the pool"
        assert ab["kv_indices"][lo:hi].tolist() != pages_alone, "the target lands on other pages in a batch"
    for key in spec.get(op).states:
        assert torch.equal(a1[key][v1.slot], ab[key][vb.slot])
        owned = {view(op, batch, ab, i).slot for i in range(batch.size)}
        others = [s for s in range(ab[key].shape[0]) if s not in owned]
        assert others and torch.isnan(ab[key][others]).all()


def test_prefill_attention_new_tokens_are_the_last_ones():
    t = target_request(20, seed=0, new_tokens=6)
    b = make_batch(t, 3, seed=0, max_len=30, new_tokens=6)
    args = build("prefill_attention", b, ATT, OPTS)
    v = view("prefill_attention", b, args)
    assert v.rows.stop - v.rows.start == 6
    assert args["qo_indptr"][-1] == sum(min(6, n) for n in b.lengths)


def test_fp8_kv_uses_fixed_scales():
    t = target_request(30, seed=0)
    opts = BuildOptions(dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fnuz, k_scale=0.5, v_scale=0.25)
    args = build("decode_attention", alone(t, 0), ATT, opts)
    assert args["k_cache"].dtype == torch.float8_e4m3fnuz
    assert float(args["k_scale"]) == 0.5 and float(args["v_scale"]) == 0.25


def test_fresh_copy_protects_states():
    t = target_request(9, seed=0)
    args = build("gdn_layer_prefill", alone(t, 0), GDN, OPTS)
    copy = fresh_copy("gdn_layer_prefill", args)
    copy["delta_state"].zero_()
    copy["conv_state"].zero_()
    assert not torch.equal(copy["delta_state"], args["delta_state"])
    assert copy["projected_qkvz"] is args["projected_qkvz"], "inputs that are only read are shared"


def test_resolvers():
    assert resolve_dtype("bf16") is torch.bfloat16 and resolve_dtype("float32") is torch.float32
    assert resolve_kv_dtype("fp8", torch.bfloat16, "gfx942") is torch.float8_e4m3fnuz
    assert resolve_kv_dtype("fp8", torch.bfloat16, "gfx950") is torch.float8_e4m3fn
    assert resolve_kv_dtype(None, torch.float16, "cpu") is torch.float16
    assert resolve_device("cpu") == torch.device("cpu")
    assert derive_seed(1, "a") == derive_seed(1, "a") != derive_seed(1, "b")


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: resolve_dtype("int8"), "dtype: 'int8'"),
        (lambda: resolve_kv_dtype("fp4", torch.bfloat16, "cpu"), "kv_dtype"),
        (lambda: resolve_device("tpu"), "device"),
        (lambda: make_batch(target_request(3, 0), 4, seed=0, position=4), "position"),
        (lambda: make_batch(target_request(3, 0), 0, seed=0), "batch_size"),
        (lambda: make_batch(target_request(3, 0), 2, seed=0, min_len=5, max_len=4), "max_len"),
        (lambda: target_request(0, 0), "target length"),
        (lambda: build("mm", alone(target_request(3, 0), 0), ATT), "op"),
        (lambda: build("gdn_prefill", alone(target_request(3, 0), 0), ATT), "GDNShape"),
        (lambda: AttentionShape(6, 4, 32), "divisible"),
        (lambda: GDNShape(2, 4, 32, conv_width=1), "conv_width"),
    ],
)
def test_bad_parameters_are_rejected(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_cuda_without_a_gpu_is_rejected():
    with pytest.raises(ValueError, match="no CUDA"):
        resolve_device("cuda")
