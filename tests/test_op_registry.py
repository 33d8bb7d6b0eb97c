"""A new op is a new folder: a toy op registered from a temporary module runs through the lab.

The toy op, `running_sum`, is written to a temporary file and imported; it registers its spec and
two backends from there and nothing else in the repository changes. The batch-invariance
experiment and `gdn-lab invariance --op running_sum` then run it, and its deliberately
batch-variant control (a cumulative sum over the whole packed batch, minus the prefix: the rounding
of the batchmates in front leaks into the target's bits) is caught.
"""

import importlib.util
import json
import sys
import textwrap

import pytest

from gdn_lab import cli, routing
from gdn_lab.experiments import batch_invariance
from gdn_lab.ops import spec

TOY = textwrap.dedent(
    '''
    """running_sum: the cumulative sum of each request's token rows (a toy op for the registry test)."""

    from dataclasses import dataclass
    from typing import ClassVar

    import torch

    from gdn_lab import checks
    from gdn_lab.ops import spec
    from gdn_lab.ops.batch import cu_seqlens, packed_view, randn
    from gdn_lab.routing import LIBRARY_TORCH, Backend, dispatch, register

    OP = "running_sum"


    @dataclass(frozen=True)
    class ToyShape:
        param: ClassVar[str] = "toy"
        channels: int = 8


    def validate(x, cu):
        dims = checks.Dims()
        checks.check_tensor("x", x, "T C", dims, (torch.float32,))
        checks.check_tensor("cu", cu, "N+1", dims, (torch.int32,), x.device)
        return {"x": x, "cu": cu}


    def running_sum(x, cu, *, backend="auto"):
        return dispatch(OP, validate(x, cu), backend)[0]


    def example(device="cpu", dtype=torch.float32):
        return validate(torch.ones(5, 8, device=device), torch.tensor([0, 2, 5], dtype=torch.int32, device=device))


    def build(batch, shape, opts):
        x = torch.cat([randn(r.seed, "x", r.length, shape.channels) for r in batch.requests]).to(opts.device)
        return validate(x, cu_seqlens(batch.lengths, opts.device))


    def per_request(x, cu):
        bounds = cu.tolist()
        return torch.cat([x[s:e].cumsum(0) for s, e in zip(bounds, bounds[1:])])


    def whole_batch(x, cu):
        total = x.cumsum(0)  # the batchmates in front change the target's rounding
        starts = cu[:-1].long()
        before = torch.where(starts[:, None] > 0, total[(starts - 1).clamp(min=0)], torch.zeros_like(total[:1]))
        owner = torch.repeat_interleave(torch.arange(len(starts)), cu.diff().long())
        return total - before[owner]


    spec.register(
        spec.OpSpec(
            name=OP, function=running_sum, validate=validate, example=example, shape=ToyShape, build=build,
            outputs=("out",), view=lambda batch, args, i: spec.View(packed_view(args["cu"], i)),
            tolerances={("torch", "out", "float32"): spec.Tolerance("allclose", atol=1e-5, rtol=1e-5)},
        )
    )
    register(Backend(OP, "torch", per_request, LIBRARY_TORCH, description="per request"))
    register(
        Backend(OP, "torch-whole-batch", whole_batch, LIBRARY_TORCH, auto=False, variant_control=True,
                description="CONTROL: one cumulative sum over the packed batch")
    )
    '''
)


@pytest.fixture
def toy_op(tmp_path):
    path = tmp_path / "toy_running_sum.py"
    path.write_text(TOY)
    module_spec = importlib.util.spec_from_file_location("toy_running_sum", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules["toy_running_sum"] = module
    module_spec.loader.exec_module(module)
    try:
        yield "running_sum"
    finally:
        spec.unregister("running_sum")
        routing.unregister("running_sum")
        sys.modules.pop("toy_running_sum", None)


def test_the_experiment_runs_a_toy_op_from_its_own_module(toy_op):
    df = batch_invariance.batch_invariance(
        toy_op, targets=[1, 40], batch_sizes=[2, 6], device="cpu", dtype="float32", max_context=50, progress=False
    )
    ours, control = df[df.backend == "torch"], df[df.backend == "torch-whole-batch"]
    assert len(ours) == 4 and ours.bitwise_equal.astype(bool).all() and ours.ref_within_tolerance.astype(bool).all()
    assert not control.bitwise_equal.astype(bool).all(), "the whole-batch cumsum must leak the batchmates' rounding"
    assert df.control_caught.eq(True).all() and not df.insensitive.any()
    assert batch_invariance.summarize(df).set_index("backend").verdict.to_dict() == {
        "torch": "invariant",
        "torch-whole-batch": "caught",
    }


def test_the_cli_runs_a_toy_op(toy_op, capsys):
    argv = ["invariance", "--op", toy_op, "--backend", "torch", "--device", "cpu", "--targets", "1,40"]
    code = cli.main([*argv, "--batch-sizes", "2,6", "--max-context", "50", "--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (
        code == 0
        and {r["op"] for r in rows} == {toy_op}
        and {r["backend"] for r in rows} == {"torch", "torch-whole-batch"}
    )


def test_env_explains_a_toy_op(toy_op, capsys):
    assert cli.main(["env", "--device", "cpu", "--json"]) == 0
    backends = json.loads(capsys.readouterr().out)["backends"]
    assert {r["backend"] for r in backends if r["op"] == toy_op} == {"torch", "torch-whole-batch"}
