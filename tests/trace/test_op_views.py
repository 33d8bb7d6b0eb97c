"""op_views.split_args: its shortcuts (plain ops, one slot index per address) split as the general rule does."""

import pytest
import torch

from gdn_lab.trace.op_views import OP_ARGS, OpArgs, pool_view, split_args


def test_a_plain_op_splits_as_an_op_with_empty_roles(monkeypatch):
    args = {"x": torch.randn(3, 4), "w": torch.randn(4, 4), "out_dtype": None}
    shortcut = (split_args("matmul", args, 3), split_args("matmul", args, 3, after=True))
    monkeypatch.setitem(OP_ARGS, "matmul", OpArgs())  # the general path, every role empty
    general = (split_args("matmul", args, 3), split_args("matmul", args, 3, after=True))
    assert shortcut == general == (([], list(args.items())), ([], []))


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
def test_pools_of_one_address_share_its_index_and_read_as_alone(after):
    g = torch.Generator().manual_seed(0)
    conv, delta = torch.randn(6, 8, 3, generator=g), torch.randn(6, 2, 4, 4, generator=g)
    slots = torch.tensor([4, -1, 0], dtype=torch.int32)  # a padding slot: read as row 0, ignored
    args = {
        "projected_qkvz": torch.randn(5, 8, generator=g), "projected_ba": torch.randn(5, 4, generator=g),
        "conv_state": conv, "delta_state": delta, "cache_indices": slots, "cu_seqlens": torch.tensor([0, 2, 3, 5]),
        "has_initial_state": torch.ones(3, dtype=torch.bool), "conv_weight": torch.randn(8, 4, generator=g),
        "A_log": torch.randn(2, generator=g), "dt_bias": torch.randn(2, generator=g),
        "norm_weight": torch.randn(4, generator=g),
    }  # fmt: skip
    views, _ = split_args("gdn_layer_prefill", args, 3, after=after)
    by_name = dict(views)
    assert by_name["conv_state"].seg is by_name["delta_state"].seg  # one index for the address
    for name, pool in (("conv_state", conv), ("delta_state", delta)):
        alone = pool_view(pool, slots)
        got = by_name[name]
        assert torch.equal(got.rows, alone.rows) and torch.equal(got.seg, alone.seg) and torch.equal(got.pos, alone.pos)
        assert torch.equal(got.rows[0], pool[4]) and got.seg.tolist() == [0, -1, 2]


def test_an_op_whose_signature_lost_a_role_argument_is_named():
    with pytest.raises(RuntimeError, match="gdn_decode has no argument slots"):
        split_args("gdn_decode", {"state": torch.zeros(2, 1)}, 2)
