"""`gdn-lab invariance`: the table on stdout, JSON lines with --json, and an exit status that tells
the truth: 0 invariant with the control caught, 1 variant, 2 bad input, 3 insensitive, 4 incomplete."""

import json

import pytest

from gdn_lab import cli, routing
from gdn_lab.ops.decode_attention.reference import decode_attention_torch


def test_json_lines_one_per_row(capsys, device):
    code = cli.main(
        [
            "invariance",
            "--op",
            "gdn_decode",
            "--backend",
            "torch",
            "--device",
            device.type,
            "--batch-sizes",
            "2,8",
            "--json",
        ]
    )
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert code == 0, captured.err
    torch_rows = [r for r in rows if r["backend"] == "torch"]
    assert len(torch_rows) == 4 and all(r["bitwise_equal"] for r in torch_rows)  # out and state, 2 batch sizes
    assert {r["tensor"] for r in torch_rows} == {"out", "state"}
    assert all(r["target_len"] == 1 and r["seed"] == 0 for r in torch_rows)
    assert (
        "verdict: invariant: torch kept its bits in all 4 comparisons; the control was caught (exit 0)" in captured.err
    )


def test_table_and_summary(capsys, device):
    code = cli.main(
        ["invariance", "--op", "decode_attention", "--backend", "torch-partitioned", "--device", device.type,
         "--targets", "3,257", "--batch-sizes", "2,8", "--seed", "5"]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "torch-partitioned" in captured.out and "invariant" in captured.out and "bitwise_equal" in captured.out


def test_insensitive_run_exits_3(capsys, device):
    """One-token contexts: every split of the control sums the same single token, so it cannot differ."""
    argv = ["invariance", "--op", "decode_attention", "--backend", "torch", "--device", device.type]
    code = cli.main([*argv, "--targets", "1", "--batch-sizes", "2", "--max-context", "1", "--json"])
    assert code == 3
    assert "insensitive: torch kept its bits in all 1 comparisons, but no control" in capsys.readouterr().err


@pytest.fixture
def variant():
    def run(**args):
        return decode_attention_torch(**args) * (1 + 1e-3 * (args["q"].shape[0] - 1))

    routing.register(routing.Backend("decode_attention", "test-variant", run, routing.LIBRARY_TORCH, auto=False))
    yield "test-variant"
    routing._REGISTRY["decode_attention"].pop("test-variant")


def test_variance_exits_1(capsys, device, variant):
    # fp32: the variant's 1e-3 is under bf16's resolution. The control needs batchmates long enough
    # to be split on the device: 8 tokens on the CPU (torch's threads as SMs), 4000 on an H200.
    context = "8" if device.type == "cpu" else "4000"
    argv = ["invariance", "--op", "decode_attention", "--backend", variant, "--device", device.type, "--dtype", "fp32"]
    assert cli.main([*argv, "--targets", "5", "--batch-sizes", "2", "--max-context", context, "--json"]) == 1
    assert f"verdict: variant: {variant} changed bits in 1 of 1 comparisons" in capsys.readouterr().err


def test_a_backend_that_does_not_cover_the_case_exits_4(capsys, device):
    """A backend refused a shape (the chunked Triton kernels take power-of-two head dims only) gives
    not-covered rows, and the run says it is incomplete."""
    argv = ["invariance", "--op", "gdn_prefill", "--backend", "triton", "--device", device.type]
    code = cli.main([*argv, "--targets", "3", "--batch-sizes", "2", "--shape", "head_dim=24", "--json"])
    assert code == 4
    assert "incomplete: triton did not run" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--op", "gdn_decode", "--backend", "nope"], "--backend: 'nope' is not a backend of gdn_decode; accepted: "),
        (["--op", "gdn_decode", "--backend", "torch", "--kv-dtype", "fp8"], "--kv-dtype: gdn_decode has no KV cache"),
        (["--op", "decode_attention", "--backend", "torch", "--shape", "heads=2"], "--shape: heads not accepted"),
        (["--op", "decode_attention", "--backend", "torch", "--shape", "num_kv_heads=3"], "must be divisible by"),
    ],
)
def test_bad_input_exit_2(capsys, argv, message):
    assert cli.main(["invariance", *argv, "--device", "cpu"]) == 2
    assert message in capsys.readouterr().err
