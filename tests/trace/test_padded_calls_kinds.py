"""Three additions for whole-model runs: padded layouts (a Hugging Face batch), call descriptions kept
for dispatch rules, and diff restricted to some kinds of call (the module level of an ops trace)."""

import pytest
import torch
from torch import nn

from gdn_lab.ops import decode_attention, matmul
from gdn_lab.trace import Layout, diff, first_culprit, record, row_hashes
from gdn_lab.trace.op_views import SMALL_INDEX_NUMEL, TensorMeta


def test_a_left_padded_request_hashes_like_the_request_alone():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 8, generator=g), torch.randn(5, 8, generator=g)
    batch = torch.zeros(2, 5, 8)
    batch[0, 2:], batch[1] = a, b  # a: 3 tokens after 2 of padding
    batch[0, :2] = 7.0  # whatever the padding holds is left out
    lay = Layout.padded([3, 5], request_ids=["a", "b"])
    assert (lay.kind, lay.num_rows, lay.padded_len) == ("padded", 10, 5)
    got = row_hashes(batch, lay)
    assert got[0] == row_hashes(a[None], Layout.padded([3], ["a"]))[0]
    assert got[1] == row_hashes(b[None], Layout.padded([5], ["b"]))[0]
    # the flattened [N * T, ...] view holds the same rows; other [N, ...] tensors are whole rows
    assert torch.equal(row_hashes(batch.reshape(10, 8), lay), got)
    assert lay.alignment(torch.zeros(2, 4, 5, 8)) == "requests" and lay.alignment(torch.zeros(3, 5)) == "unaligned"
    right = torch.zeros(2, 5, 8)
    right[0, :3] = a
    assert row_hashes(right, Layout.padded([3, 5], ["a", "b"], side="right"))[0] == got[0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(lengths=[3, 0], request_ids=[0, 1]), "lengths: expected positive ints"),
        (dict(lengths=[3], request_ids=[0, 1]), "request_ids: 2 ids for 1 requests"),
        (dict(lengths=[3, 1], request_ids=[0, 1], side="middle"), "side: 'middle'"),
    ],
    ids=["zero", "ids", "side"],
)
def test_bad_padded_layouts_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Layout.padded(**kwargs)


class Attend(nn.Module):
    def forward(self, q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens):
        return decode_attention(q, k_cache, v_cache, kv_indptr, kv_indices, seq_lens, backend="torch")


def test_keep_calls_describes_lab_op_arguments_cheaply():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 8, generator=g)
    k, v = torch.randn(6, 1, 1, 8, generator=g), torch.randn(6, 1, 1, 8, generator=g)
    indptr, indices = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([4, 0, 1, 2, 3], dtype=torch.int32)
    lens = torch.tensor([2, 3], dtype=torch.int32)
    net = Attend()
    for keep in (False, True):
        with record(net, Layout.per_request([0, 1]), level="ops", keep_calls=keep) as tr:
            net(q, k, v, indptr, indices, lens)
        (op,) = [e for e in tr.entries if e.kind == "lab_op"]
        if not keep:
            assert op.call is None
            continue
        call = op.call
        assert isinstance(call["q"], TensorMeta) and call["q"].shape == (2, 2, 8) and call["q"].dtype == torch.float32
        assert isinstance(call["k_cache"], TensorMeta)  # the big tensors: shape only
        assert torch.equal(call["seq_lens"], lens) and call["seq_lens"] is not lens  # a copy
        assert call["page_size"] == 1 and SMALL_INDEX_NUMEL >= 65536
    with (
        pytest.raises(ValueError, match="keep_calls: expected true or false"),
        record(net, Layout.per_request([0]), keep_calls="yes"),
    ):
        pass


class Gate(nn.Module):
    def forward(self, x):
        return torch.add(x, 1e-3 * x.shape[0])  # a batch-variant function inside a module


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate, self.proj = Gate(), nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(self.gate(x)) + matmul(x, torch.eye(4), backend="torch")


def test_kinds_module_on_ops_traces_is_the_modules_level_diff():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    net = Net()
    traces = {}
    for level in ("modules", "ops"):
        with record(net, Layout.per_request([0, 1, 2]), level=level) as batched:
            net(x)
        with record(net, Layout.per_request([1]), level=level) as alone:
            net(x[1:2])
        traces[level] = (alone, batched)
    ops = diff(*traces["ops"], 1)
    assert first_culprit(ops)["name"] == "gate.torch.add"
    modules = diff(*traces["modules"], 1)
    restricted = diff(*traces["ops"], 1, kinds=("module",))
    cols = ["name", "kind", "parent", "input_equal", "output_equal", "culprit"]
    assert restricted[cols].values.tolist() == modules[cols].values.tolist()
    assert first_culprit(restricted)["name"] == "gate"
    lab = diff(*traces["ops"], 1, kinds=("lab_op",))
    assert lab.name.tolist() == ["Net.matmul"] and lab.parent.tolist() == [""] and not lab.culprit.any()
    with pytest.raises(ValueError, match="kinds: \\['aten'\\] not accepted"):
        diff(*traces["ops"], 1, kinds=("aten",))
