"""benchmarks/replay_decode_plans.py: a plan rule judged from a run's forced-plan timings, without a GPU."""

from pathlib import Path

import pytest

SCRIPT = "replay_decode_plans.py"
ROOT = Path(__file__).resolve().parents[2]
EDGES = ROOT / "data/bench/h100/bench_decode_attention_dde0bec_coarse_edges.csv"


@pytest.fixture
def replay(load_script):
    return load_script(SCRIPT)


def _run(replay, *, config: str | None = None, interpreted: bool = False) -> list[dict]:
    """One swept case as the bench writes it: 32/8/128 fp8, B 16 x 2k on an sm_90 with 132 SMs, run
    at one node a program (40 us), forced at one (41) and two (30), and its control (36 us)."""
    from gdn_lab.ops.decode_attention import triton_kernels as k

    label = config or replay.config_label(k.table_config(128, "fp8", "sm_90"))
    case = {"Hq": "32", "Hkv": "8", "D": "128", "B": "16", "ctx": "2048.0", "kv_dtype": "fp8", "page_size": "16.0"}
    env = {"env_arch": "sm_90", "env_num_sms": "132", "env_device": "H100", "env_gdn_lab_commit": "abc"}
    env["env_triton_interpret"] = str(interpreted)
    sweep = dict(case, kind="sweep", impl="triton", status="ok", config=label, **env)
    return [
        dict(sweep, note="default config", plan="unit=4 span=4", us="40.0"),
        dict(sweep, note="forced plan", plan="unit=4 span=4", us="41.0"),
        dict(sweep, note="forced plan", plan="unit=4 span=8", us="30.0"),
        dict(case, kind="timing", impl="control", status="ok", config="", plan="", note="", us="36.0", **env),
        dict(
            case,
            kind="timing",
            impl="triton",
            status="ok",
            config=label,
            plan="unit=4 span=4",
            note="",
            us="39.0",
            **env,
        ),
    ]


def _plan(unit: int, span: int):
    from gdn_lab.ops.decode_attention import triton_kernels as k

    return lambda *_: k.DecodePlan(unit, span)


def test_the_runs_own_plan_keeps_the_runs_time(replay):
    (row,) = replay.replay(_run(replay), "run.csv", rule=_plan(4, 4))
    assert (row["plan_now"], row["us_now"], row["now_vs_run"]) == ("unit=4 span=4", 40.0, 1.0)
    assert row["run_vs_control"] == pytest.approx(36 / 40, abs=1e-4)
    assert row["nodes_per_slot"] == pytest.approx(16 * 8 * 4 / 264, abs=1e-3)


def test_another_plan_takes_the_forced_time_of_the_same_run(replay):
    (row,) = replay.replay(_run(replay), "run.csv", rule=_plan(4, 8))
    assert (row["plan_now"], row["us_now"]) == ("unit=4 span=8", 30.0)
    assert row["now_vs_run"] == pytest.approx(0.75) and row["now_vs_control"] == pytest.approx(1.2)
    assert "note" not in row


def test_a_plan_the_run_did_not_force_is_not_measured(replay):
    (row,) = replay.replay(_run(replay), "run.csv", rule=_plan(4, 16))
    assert row["plan_now"] == "unit=4 span=16" and "us_now" not in row
    assert row["note"].startswith("not measured")
    assert "not measured" in replay.summary([row]) and "run run.csv: abc on H100, 1 cases" in replay.summary([row])


def test_a_config_changed_since_the_run_is_left_out(replay):
    other = "block_n=64 node_blocks=16 warps=4 stages=5"
    (row,) = replay.replay(_run(replay, config=other), "run.csv", rule=_plan(4, 8))
    assert row["note"].startswith("config changed: today block_n=128") and "plan_now" not in row


def test_an_interpreter_run_or_one_without_a_sweep_is_refused(replay):
    with pytest.raises(ValueError, match="run.csv: no 'default config' sweep rows of a GPU run"):
        replay.replay(_run(replay, interpreted=True), "run.csv")
    with pytest.raises(ValueError, match="--sweep"):
        replay.replay([r for r in _run(replay) if r["kind"] == "timing"], "run.csv")


def test_replays_todays_rule_over_a_committed_run(replay, tmp_path, capsys):
    from gdn_lab.ops.decode_attention import triton_kernels as k

    assert replay.main(["--out", str(tmp_path), str(EDGES)]) == 0
    rows = replay.read_rows(tmp_path / replay.CSV_NAME)
    run = replay.read_rows(EDGES)
    forced = {(replay._case(r), r["plan"]): r["us"] for r in run if r["note"] == "forced plan"}
    assert len(rows) == sum(r["note"] == "default config" for r in run) > 0
    for r in rows:
        cfg = k.table_config(int(r["D"]), "fp8" if r["kv_dtype"] == "fp8" else "16bit", "sm_90")
        if replay.config_label(cfg) != r["config"]:  # the table moved since the run: left out
            assert r["note"] == f"config changed: today {replay.config_label(cfg)}" and not r["plan_now"]
            continue
        plan = k.decode_plan(int(r["B"]), int(r["Hkv"]), int(float(r["ctx"])), 132, cfg)
        assert r["plan_now"] == replay.plan_label(plan)
        expected = r["us_run"] if r["plan_now"] == r["plan_run"] else forced[(replay._case(r), r["plan_now"])]
        assert float(r["us_now"]) == float(expected)
    assert "today's rule picks another plan in" in capsys.readouterr().out


def test_bad_input_is_named(replay, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        replay.main(["--out", str(tmp_path), str(tmp_path / "missing.csv")])
    assert exit_.value.code == 2 and "missing.csv is not a file" in capsys.readouterr().err
    timing_only = tmp_path / "timing.csv"
    timing_only.write_text("kind,impl,status,note\ntiming,triton,ok,\n")
    assert replay.main(["--out", str(tmp_path), str(timing_only)]) == 2
    assert "timing.csv: no 'default config' sweep rows" in capsys.readouterr().err
