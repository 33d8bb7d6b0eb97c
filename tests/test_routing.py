import sys

import pytest
import torch

from gdn_lab import routing
from gdn_lab.ops import spec


@pytest.fixture
def registry(monkeypatch):
    """A private registry with one op, restored afterwards."""
    import gdn_lab.ops  # noqa: F401  (registers the real backends first)

    monkeypatch.setattr(routing, "_REGISTRY", {k: dict(v) for k, v in routing._REGISTRY.items()})
    calls = []

    def make(name, priority, ok_avail=True, ok_cov=True, **kw):
        def run(x):
            calls.append(name)
            return name

        return routing.register(
            routing.Backend(
                "toy",
                name,
                run,
                library=routing.LIBRARY_TORCH,
                available=lambda: (ok_avail, f"{name} avail"),
                covered=lambda args: (ok_cov and args["x"] > 0, f"{name} covers x>0" if ok_cov else f"{name} never"),
                priority=priority,
                **kw,
            )
        )

    make("slow", 90)
    make("fast", 20, ok_cov=False)
    make("gone", 10, ok_avail=False)
    make("control", 5, auto=False, variant_control=True)
    return calls


def test_auto_takes_first_covered_in_priority_order_and_says_why_not_the_others(registry):
    d = routing.decide("toy", {"x": 1})
    assert d.name == "slow"
    assert d.rejected["gone"].startswith("not available: gone avail")
    assert d.rejected["fast"].startswith("not covered: fast never")
    assert "only when named" in d.rejected["control"]


def test_named_backend_is_never_replaced(registry):
    with pytest.raises(routing.NotCovered, match="'fast' cannot run this call: not covered: fast never"):
        routing.dispatch("toy", {"x": 1}, "fast")
    with pytest.raises(routing.NotCovered, match="not available: gone avail"):
        routing.dispatch("toy", {"x": 1}, "gone")
    assert registry == []


def test_named_control_runs_and_reports_it(registry):
    out, d = routing.dispatch("toy", {"x": 1}, "control")
    assert out == "control" and d.backend.variant_control


def test_auto_with_nothing_covering_lists_every_reason(registry):
    with pytest.raises(routing.NotCovered, match="slow: not covered: slow covers x>0"):
        routing.dispatch("toy", {"x": -1})


def test_unknown_backend_lists_the_accepted_names(registry):
    with pytest.raises(
        ValueError, match=r"backend: 'nope' is not a backend of toy; accepted: auto, gone, fast, slow, control"
    ):
        routing.route("toy", {"x": 1}, "nope")


def test_unknown_op(registry):
    with pytest.raises(ValueError, match="op: 'nope' is not known"):
        routing.backends("nope")


def test_a_probe_that_raises_is_a_reason_not_a_crash(registry):
    def boom():
        raise ImportError("no such lib")

    routing.register(routing.Backend("toy", "broken", lambda x: x, routing.LIBRARY_TORCH, available=boom, priority=1))
    d = routing.decide("toy", {"x": 1})
    assert d.name == "slow"
    assert "ImportError: no such lib" in d.rejected["broken"]


def test_a_control_cannot_be_auto():
    with pytest.raises(ValueError, match="variant control must have auto=False"):
        routing.Backend("toy", "c", lambda: None, routing.LIBRARY_TORCH, variant_control=True)


def test_controls_lists_only_controls(registry):
    assert [b.name for b in routing.controls("toy")] == ["control"]


def test_explain_marks_the_chosen_backend(registry):
    rows = {r["backend"]: r for r in routing.explain("toy", {"x": 1})}
    assert rows["slow"]["chosen"] and not rows["fast"]["chosen"]
    assert rows["gone"]["available"] is False and rows["gone"]["covered"] is None
    assert rows["fast"]["covered"] is False
    no_call = routing.explain("toy")
    assert all(r["covered"] is None and not r["chosen"] for r in no_call)


def test_lazy_imports_on_first_call_and_the_runner_is_the_function(monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    f = routing.lazy("colorsys", "rgb_to_hsv")
    b = routing.Backend("toy", "lazy", f, library=routing.LIBRARY_TORCH)
    assert "colorsys" not in sys.modules
    assert f(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
    import colorsys

    assert b.runner is colorsys.rgb_to_hsv and repr(f) == "lazy(colorsys.rgb_to_hsv)"
    plain = routing.Backend("toy", "plain", abs, library=routing.LIBRARY_TORCH)
    assert plain.runner is abs


@pytest.mark.parametrize("op", spec.names())
def test_explain_every_op_on_the_cpu(op):
    rows = routing.explain(op, spec.get(op).example(device="cpu", dtype=torch.float32))
    names = [r["backend"] for r in rows]
    assert "torch" in names
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["covered"]
    for r in rows:
        assert r["reason"], r
        if not r["auto"]:
            assert not r["chosen"]


def test_observers_see_each_call_and_may_wrap_the_run(registry):
    """An observer with before/after only sees the call; one with `running` also has the backend
    run inside its context, which exits when the run raises too."""
    import contextlib

    log = []

    class Plain:
        def before(self, op, d, args):
            log.append(("before", d.name))

        def after(self, op, d, args, result):
            log.append(("after", result))

    class Wrapping(Plain):
        @contextlib.contextmanager
        def running(self, op):
            log.append("enter")
            try:
                yield
            finally:
                log.append("exit")

    with routing.observe(Plain()), routing.observe(Wrapping()):
        assert routing.dispatch("toy", {"x": 1})[0] == "slow"
    assert log == [("before", "slow"), ("before", "slow"), "enter", "exit", ("after", "slow"), ("after", "slow")]
    log.clear()
    boom = routing.Backend("toy", "boom", lambda x: 1 / 0, library=routing.LIBRARY_TORCH, priority=9)
    routing.register(boom)
    with routing.observe(Wrapping()), pytest.raises(ZeroDivisionError):
        routing.dispatch("toy", {"x": 1}, "boom")
    assert log == [("before", "boom"), "enter", "exit"]
