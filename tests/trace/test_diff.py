"""diff and first_culprit: a planted batch-variant call is named, its downstream is not."""

import pytest
import torch
from torch import nn

from gdn_lab.trace import Layout, diff, first_culprit, record, summarize


def batch_eps(x: torch.Tensor, planted: bool) -> torch.Tensor:
    """A functional op that adds a batch-size-dependent epsilon (the planted batch variance)."""
    return torch.add(x, 1e-3 * x.shape[0] if planted else 0.0)


class Block(nn.Module):
    def __init__(self, planted: bool) -> None:
        super().__init__()
        self.planted = planted

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        y = batch_eps(y, self.planted)
        return y * 2.0


class Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x


class Net(nn.Module):
    def __init__(self, planted: bool = True) -> None:
        super().__init__()
        self.pre = Double()
        self.block = Block(planted)
        self.post = Double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.block(self.pre(x)))


def traces(net: nn.Module, level: str, x: torch.Tensor, target: int = 2):
    """The request at row `target` of a batch, and alone (id "t" in both)."""
    ids = [f"r{i}" if i != target else "t" for i in range(x.shape[0])]
    with record(net, Layout.per_request(ids), level=level) as batched:
        net(x)
    with record(net, Layout.per_request(["t"]), level=level) as alone:
        net(x[target : target + 1])
    return alone, batched


X = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))


def test_ops_level_finds_the_function_and_modules_level_the_module():
    alone, batched = traces(Net(), "ops", X)
    df = diff(alone, batched, "t")
    culprit = first_culprit(df)
    assert (culprit["name"], culprit["kind"], culprit["op"]) == ("block.torch.add", "function", "torch.add")
    assert df["culprit"].sum() == 1  # the enclosing block and root are explained by it
    after = df[df["order"] > culprit["order"]]
    assert after[after["kind"] != "module"]["input_equal"].eq(False).all()  # downstream: inputs changed
    before = df[df["order"] < culprit["order"]]
    assert before[before["kind"] != "module"]["output_equal"].all()

    alone, batched = traces(Net(), "modules", X)
    df = diff(alone, batched, "t")
    assert first_culprit(df)["name"] == "block"
    assert df.loc[df["name"] == "post", ["input_equal", "culprit"]].values.tolist() == [[False, False]]
    assert df["culprit"].sum() == 1


def test_an_invariant_model_has_no_culprit():
    for level in ("modules", "ops"):
        alone, batched = traces(Net(planted=False), level, X)
        df = diff(alone, batched, "t")
        assert first_culprit(df) is None
        assert df["output_equal"].all() and df["input_equal"].all()
        counts = summarize(df).set_index(["kind", "op"])
        assert counts.loc[("module", "Double"), "compared"] == 2 and counts["culprits"].sum() == 0


def test_requests_are_matched_by_id_not_position():
    alone, batched = traces(Net(), "ops", X, target=0)
    net = Net()
    with record(net, Layout.per_request(["u", "v", "t"]), level="ops") as other:
        net(torch.cat([X[3:5], X[0:1]]))  # "t" (X[0]) at row 2 of 3
    assert first_culprit(diff(batched, other, "t"))["name"] == "block.torch.add"  # batch 5 vs 3
    with record(net, Layout.per_request(["v", "t", "w", "x", "y"]), level="ops") as same_size:
        net(torch.cat([X[1:2], X[0:1], X[2:5]]))
    assert first_culprit(diff(batched, same_size, "t")) is None  # same batch size, another row
    assert first_culprit(diff(alone, same_size, "t", "t"))["name"] == "block.torch.add"


def test_unaligned_differences_are_not_blamed():
    class Heads(nn.Module):
        def forward(self, x):  # [N, 8] -> [N * 2, 4]: rows are no longer requests
            return (x.reshape(-1, 4) * 3.0).reshape(x.shape)

    net = nn.Sequential(Heads())
    alone, batched = traces(net, "ops", X)
    df = diff(alone, batched, "t")
    mul = df[df["name"] == "0.Tensor.mul"].iloc[0]
    assert (mul["input_equal"], mul["unaligned_inputs"], mul["culprit"]) == (False, "args[0]", False)
    assert first_culprit(df) is None


def test_diverging_structure_is_an_error_unless_not_strict():
    class Branchy(nn.Module):
        def forward(self, x):
            return torch.relu(x) if x.shape[0] > 1 else torch.sigmoid(x)

    alone, batched = traces(nn.Sequential(Branchy()), "ops", X)
    with pytest.raises(
        ValueError, match=r"diverge in structure: calls only in tr_a: 1 \(step 0 '0.torch.sigmoid' #0\)"
    ):
        diff(alone, batched, "t")
    df = diff(alone, batched, "t", strict=False)
    assert df.loc[df["name"] == "0.torch.sigmoid", ["matched", "culprit"]].values.tolist() == [[False, False]]
    assert first_culprit(df)["name"] == "0"  # the innermost matched call: same input, another output


def test_a_layout_that_is_not_the_batch_is_rejected():
    net = Net()
    with record(net, Layout.per_request(["t", "u"])) as wrong:  # the batch has 5 rows
        net(X)
    alone, _ = traces(net, "modules", X)
    with pytest.raises(ValueError, match="tr_b: no tensor of step 0 has a leading dim of its layout's 2 rows"):
        diff(alone, wrong, "t")


def test_bad_arguments_are_rejected():
    alone, batched = traces(Net(), "ops", X)
    _, modules = traces(Net(), "modules", X)
    with pytest.raises(ValueError, match="request_a: request 'nope' is in none"):
        diff(alone, batched, "nope")
    with pytest.raises(ValueError, match=r"request_b: \['t'\] \(list\) is not a request id; accepted: an int or str"):
        diff(alone, batched, "t", ["t"])
    with pytest.raises(ValueError, match="level 'ops' and 'modules'"):
        diff(alone, modules, "t")
    with pytest.raises(ValueError, match="tr_b: expected a gdn_lab.trace.Trace"):
        diff(alone, "batched", "t")
    with pytest.raises(ValueError, match="df: expected a DataFrame"):
        first_culprit(alone.to_frame())
