"""Batch-invariance experiment: torch references are invariant, a known-variant backend is caught,
the table is seeded and carries the contract columns, uncovered and failing backends are rows."""

import doctest

import pandas as pd
import pytest

from gdn_lab import routing
from gdn_lab.experiments import batch_invariance as bi
from gdn_lab.experiments.table import COLUMNS
from gdn_lab.ops.decode_attention.reference import decode_attention_torch
from gdn_lab.ops.gdn_prefill.reference import gdn_prefill_torch

ATT = {"num_q_heads": 2, "num_kv_heads": 1, "head_dim": 16}
GDN = {"num_k_heads": 1, "num_v_heads": 2, "head_dim": 16}
SMALL = dict(device="cpu", dtype="float32", max_context=40, progress=False, include_controls=False)
CFG = {k: v for k, v in SMALL.items() if k != "progress"}  # config fields only
BY_OP = {k: v for k, v in CFG.items() if k != "include_controls"}  # InvarianceByOpConfig's (its controls always run)


@pytest.fixture
def test_backends():
    """Test-only decode_attention backends, removed afterwards: a batch-variant control (the output
    moves by one ulp-ish step per extra request), an invariant 'control', one that covers nothing,
    one that raises."""

    def variant(**args):
        out = decode_attention_torch(**args)
        return out + 1e-3 * (args["q"].shape[0] - 1)

    specs = [
        routing.Backend(
            "decode_attention", "test-variant", variant, routing.LIBRARY_TORCH, auto=False, variant_control=True
        ),
        routing.Backend(
            "decode_attention",
            "test-blind",
            decode_attention_torch,
            routing.LIBRARY_TORCH,
            auto=False,
            variant_control=True,
        ),
        routing.Backend(
            "decode_attention",
            "test-uncovered",
            decode_attention_torch,
            routing.LIBRARY_TORCH,
            covered=lambda a: (False, "test: never"),
        ),
        routing.Backend("decode_attention", "test-raises", lambda **a: 1 / 0, routing.LIBRARY_TORCH),
    ]
    for b in specs:
        routing.register(b)
    yield {b.name: b for b in specs}
    for b in specs:
        routing._REGISTRY["decode_attention"].pop(b.name)


@pytest.mark.parametrize(
    "op, extra",
    [
        ("decode_attention", {"attention": ATT, "targets": [1, 30]}),
        ("prefill_attention", {"attention": ATT, "targets": [1, 9], "new_tokens": 4}),
        ("gdn_decode", {"gdn": GDN}),
        ("gdn_prefill", {"gdn": GDN, "targets": [1, 65]}),
        ("gdn_layer_prefill", {"gdn": {**GDN, "head_dim": 64}, "targets": [3, 65], "quantize_fp8": True}),
    ],
)
def test_torch_reference_is_bitwise_invariant(op, extra):
    df = bi.batch_invariance(op, backends=["torch"], batch_sizes=[2, 5], **SMALL, **extra)
    assert (df.status == "compared").all() and df.bitwise_equal.astype(bool).all()
    expected = {
        "decode_attention": {"out"},
        "prefill_attention": {"out"},
        "gdn_decode": {"out", "state"},
        "gdn_prefill": {"out", "state"},
        "gdn_layer_prefill": {"normalized", "quantized", "scales", "delta_state", "conv_state"},
    }[op]
    assert set(df.tensor) == expected
    targets = (1,) if op == "gdn_decode" else tuple(extra["targets"])
    assert len(df) == len(targets) * 2 * len(expected)
    assert (df.ref_max_abs == 0).all(), "the torch backend is the reference"


def test_known_variant_control_is_caught_and_blind_control_flags_insensitive(test_backends):
    caught = bi.batch_invariance(
        "decode_attention", backends=["torch", "test-variant"], targets=[5], batch_sizes=[1, 3], attention=ATT, **SMALL
    )
    ctrl = caught[caught.backend == "test-variant"]
    assert ctrl.is_control.all()
    # batch size 1 is the target alone again: the control must match there and differ at 3
    assert ctrl.set_index("batch_size").bitwise_equal.to_dict() == {1: True, 3: False}
    assert ctrl[ctrl.batch_size == 3].max_abs.iloc[0] == pytest.approx(2e-3, rel=1e-3)
    assert caught.control_caught.eq(True).all() and not caught.insensitive.any()
    s = bi.summarize(caught).set_index("backend")
    assert s.loc["test-variant", "verdict"] == "caught" and s.loc["torch", "verdict"] == "invariant"
    assert "controls caught on 1/1 ops" in bi.headline(caught)

    blind = bi.batch_invariance(
        "decode_attention", backends=["torch", "test-blind"], targets=[5], batch_sizes=[3], attention=ATT, **SMALL
    )
    assert blind.insensitive.all() and blind.control_caught.eq(False).all()
    assert bi.summarize(blind).set_index("backend").loc["test-blind", "verdict"] == "NOT caught"
    assert "INSENSITIVE: decode_attention" in bi.headline(blind)
    assert "NOT caught" in bi.conclusion(blind)


def test_no_control_means_insensitive():
    df = bi.batch_invariance("gdn_decode", backends=["torch"], batch_sizes=[2], gdn=GDN, **SMALL)
    assert df.insensitive.all() and df.control_caught.isna().all()
    assert "no batch-variant control ran" in bi.conclusion(df)


def test_uncovered_and_failing_backends_are_rows_not_crashes(test_backends):
    df = bi.batch_invariance(
        "decode_attention",
        backends=["test-uncovered", "test-raises", "torch"],
        targets=[4],
        batch_sizes=[2, 3],
        attention=ATT,
        **SMALL,
    )
    unc = df[df.backend == "test-uncovered"]
    assert len(unc) == 2 and not unc.covered.any() and unc.reason.str.contains("test: never").all()
    assert unc.backend_ran.isna().all() and unc.bitwise_equal.isna().all()
    err = df[df.backend == "test-raises"]
    assert (err.status == "error").all() and err.reason.str.contains("ZeroDivisionError").all()
    s = bi.summarize(df).set_index("backend")
    assert s.loc["test-uncovered", "verdict"] == "not covered" and s.loc["test-raises", "verdict"] == "error"
    assert bi.headline(df).startswith("2 ERROR rows (test-raises: 2; first: ZeroDivisionError: division by zero); ")


def test_same_seed_same_table_other_seed_other_batches():
    kw = dict(backends=["torch"], targets=[7, 20], batch_sizes=[3, 4], trials=2, attention=ATT, **SMALL)
    a = bi.batch_invariance("decode_attention", seed=3, **kw)
    b = bi.batch_invariance("decode_attention", seed=3, **kw)
    c = bi.batch_invariance("decode_attention", seed=4, **kw)
    assert a.equals(b)
    assert not a[["position", "batch_tokens"]].equals(c[["position", "batch_tokens"]])


def test_reference_tolerance_follows_the_compute_dtype():
    """A float32 state is held to the bound of the run's compute dtype: gdn_prefill's state 1e-3 off
    the reference is within the bf16 bound (1.6e-2) in a bf16 run and outside the float32 one
    (2e-5 + 1e-4 |ref|) in a float32 run; the untouched output is within both."""

    def state_off(**args):
        out = gdn_prefill_torch(**args)
        args["state"][args["slots"][args["slots"] >= 0].long()] += 1e-3
        return out

    routing.register(routing.Backend("gdn_prefill", "test-state-off", state_off, routing.LIBRARY_TORCH, auto=False))
    try:
        runs = {
            dt: bi.batch_invariance(
                "gdn_prefill",
                backends=["test-state-off"],
                targets=[5],
                batch_sizes=[2],
                gdn=GDN,
                **{**SMALL, "dtype": dt},
            )
            for dt in ("bfloat16", "float32")
        }
    finally:
        routing._REGISTRY["gdn_prefill"].pop("test-state-off")
    for dt, df in runs.items():
        within = df.groupby("tensor").ref_within_tolerance.apply(lambda s: set(s.astype(bool)))
        assert within["out"] == {True}
        assert within["state"] == {dt == "bfloat16"}


def test_contract_columns_and_environment():
    df = bi.batch_invariance(
        "decode_attention", backends=["torch"], targets=[3], batch_sizes=[2], attention=ATT, **SMALL
    )
    assert list(df.columns[: len(COLUMNS)]) == COLUMNS
    assert set(bi.EXTRA_COLUMNS) <= set(df.columns)
    row = df.iloc[0]
    assert tuple(row[k] for k in ("op", "backend", "backend_ran", "dtype", "kv_dtype", "seed")) == (
        "decode_attention",
        "torch",
        "torch",
        "float32",
        "float32",
        0,
    )
    assert row.arch == "cpu" and row.platform == "cpu" and row.covered


def test_fp8_kv_cache_rows_carry_the_emulated_arch():
    df = bi.batch_invariance(
        "decode_attention",
        backends=["torch"],
        targets=[9],
        batch_sizes=[2],
        kv_dtype="fp8",
        arch="gfx942",
        attention=ATT,
        **SMALL,
    )
    assert df.kv_dtype.tolist() == ["float8_e4m3fnuz"] and df.arch.tolist() == ["gfx942"]
    assert df.bitwise_equal.astype(bool).all()


def test_states_are_private_per_run():
    """GDN ops update states in place: alone and batched runs must each start from the same initial state."""
    df = bi.batch_invariance("gdn_prefill", backends=["torch"], targets=[10], batch_sizes=[1, 2, 3], gdn=GDN, **SMALL)
    assert df.bitwise_equal.astype(bool).all()


def test_run_ops_shares_backend_lists_and_checks_overrides():
    df = bi.run_ops(
        ["decode_attention", "gdn_decode"],
        {"gdn_decode": {"gdn": GDN}},
        backends=["torch", "torch-partitioned"],
        targets=[3],
        batch_sizes=[2],
        attention=ATT,
        **SMALL,
    )
    assert set(zip(df.op, df.backend)) == {
        ("decode_attention", "torch"),
        ("decode_attention", "torch-partitioned"),
        ("gdn_decode", "torch"),
    }
    # a preset keeps every op's overrides and -p ops=[...] picks some: the others are not used
    assert [c.op for c in bi.configs(["gdn_decode"], {"gdn_prefill": {"targets": [3]}}, **CFG)] == ["gdn_decode"]
    with pytest.raises(ValueError, match="op_overrides: gdn_prefil not an op; accepted: "):
        bi.configs(["gdn_decode"], {"gdn_prefil": {}}, **CFG)
    with pytest.raises(ValueError, match="ops: 'nope' is not accepted"):  # the op list itself is checked first
        bi.configs(["nope"], {"gdn_prefill": {}}, **CFG)
    with pytest.raises(ValueError, match="op_overrides.gdn_decode.trials: expected a positive number, got 0"):
        bi.configs(["gdn_decode"], {"gdn_decode": {"trials": 0}}, **CFG)
    with pytest.raises(ValueError, match="backends: none of fla is a backend of decode_attention"):
        bi.configs(["decode_attention"], backends=["fla"], **CFG)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"targets": []}, "targets"),
        ({"batch_sizes": [0]}, "batch_sizes"),
        ({"trials": 0}, "trials"),
        (
            {"backends": ["no-such-backend"]},
            "backends: 'no-such-backend' is not a backend of decode_attention; accepted: ",
        ),
        ({"attention": {"num_q_heads": 4, "heads": 2}}, "attention: .*accepted fields: num_q_heads"),
        ({"trials": "3"}, "trials: expected an integer"),
        ({"dtype": "int8"}, "dtype"),
        ({"kv_dtype": "fp4"}, "kv_dtype"),
    ],
)
def test_bad_parameters_fail_before_running(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bi.batch_invariance("decode_attention", **{**SMALL, "attention": ATT, **kwargs})


def test_unknown_op_is_rejected():
    with pytest.raises(ValueError, match="op: 'mm'"):
        bi.batch_invariance("mm", **SMALL)


def test_kv_dtype_on_an_op_without_a_kv_cache_is_rejected():
    with pytest.raises(ValueError, match="kv_dtype: gdn_decode has no KV cache"):
        bi.batch_invariance("gdn_decode", kv_dtype="fp8", **SMALL)


def test_docstring_example():
    result = doctest.testmod(bi)
    assert result.attempted > 0 and result.failed == 0


def test_workers_give_the_same_table():
    """Ops run side by side in worker processes (notebook 01's `workers`) give the table of one
    process, every control's rows included."""
    kwargs = dict(
        ops=["decode_attention", "gdn_decode"], backends=["torch"], targets=[3, 20], batch_sizes=[2, 5],
        attention=ATT, gdn=GDN, **BY_OP,
    )  # fmt: skip
    serial = bi.run(bi.InvarianceByOpConfig(**kwargs), progress=False)
    side_by_side = bi.run(bi.InvarianceByOpConfig(**kwargs, workers=2), progress=False)
    assert serial.is_control.any() and set(serial.op) == {"decode_attention", "gdn_decode"}
    pd.testing.assert_frame_equal(serial, side_by_side)
    with pytest.raises(ValueError, match="workers: expected a positive number, got 0"):
        bi.InvarianceByOpConfig(**kwargs, workers=0)


def test_workers_refuse_a_backend_registered_in_this_process_only(test_backends):
    cfg = bi.InvarianceByOpConfig(
        ops=["decode_attention", "gdn_decode"], backends=["test-variant", "torch"], targets=[3], batch_sizes=[2],
        attention=ATT, gdn=GDN, workers=2, **BY_OP,
    )  # fmt: skip
    with pytest.raises(ValueError, match="workers: decode_attention backend.* test-variant.* run with workers=1"):
        bi.run(cfg, progress=False)
