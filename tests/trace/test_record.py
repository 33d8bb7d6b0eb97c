"""record: what it sees (modules, functions, lab ops), when it hashes, and that it leaves nothing behind."""

import contextlib
import copy
import gc
import importlib
import inspect
import pickle
import random
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gdn_lab.ops import gdn_decode, matmul
from gdn_lab.trace import Layout, record, row_hashes

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


class Mixer(nn.Module):
    """Functional calls of every kind the function tier must see or skip."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.softplus(x)
        y = torch.matmul(y, torch.eye(x.shape[1]))
        y = F.silu(y)
        y.add_(1.0)  # in place
        y[:, 0] = 0.5  # in place through __setitem__
        _ = y.view(-1), y.t(), y.shape, y[:, 1:]  # aliases and metadata: no new bits
        return y


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mixer = Mixer()
        self.act = nn.ReLU()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        h = self.act(self.mixer(x))
        h = self.act(h)  # the same module twice: call_index 0 and 1
        return matmul(h, self.w, backend="torch")


def hooks_left(model: nn.Module) -> int:
    """What a recorder could leave behind: instance `_call_impl`s (its wrappers) and `forward`s,
    the global module hooks and the modules' own."""
    from torch.nn.modules import module as nn_module

    own = sum(
        ("_call_impl" in m.__dict__) + ("forward" in m.__dict__)
        + len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._forward_pre_hooks_with_kwargs)
        for m in model.modules()
    )  # fmt: skip
    return own + len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks)


def modes_left() -> int:
    return len(torch.overrides._get_current_function_mode_stack())


def test_modules_level_records_module_calls_only():
    net, x = Net(), torch.randn(3, 4)
    with record(net, Layout.per_request([0, 1, 2])) as tr:
        net(x, scale=torch.ones(3))
    got = [(e.name, e.kind, e.call_index) for e in tr.entries]
    assert got == [("Net", "module", 0), ("mixer", "module", 0), ("act", "module", 0), ("act", "module", 1)]
    root = tr.entries[0]
    assert [r.path for r in root.inputs] == ["args[0]", "kwargs['scale']"]
    assert [r.alignment for r in root.inputs] == ["requests", "requests"]
    assert [r.path for r in root.outputs] == ["out"]
    assert tr.entries[1].parent == 0 and tr.entries[0].parent is None


def test_ops_level_sees_functions_in_place_calls_and_lab_ops():
    net, x = Net(), torch.randn(3, 4)
    with record(net, Layout.per_request([0, 1, 2]), level="ops") as tr:
        net(x)
    names = [e.name for e in tr.entries]
    assert names == [
        "Net",
        "mixer",
        "mixer.F.softplus",
        "mixer.torch.eye",
        "mixer.torch.matmul",
        "mixer.F.silu",
        "mixer.Tensor.add_",
        "mixer.Tensor.__setitem__",
        "act",
        "act.F.relu",
        "act",
        "act.F.relu",
        "Net.matmul",
    ]
    lab = tr.entries[-1]
    assert (lab.kind, lab.op, lab.backend, lab.module) == ("lab_op", "matmul", "torch", "")
    assert [r.path for r in lab.inputs] == ["x", "w"] and [r.alignment for r in lab.inputs] == ["requests", "unaligned"]


def test_in_place_calls_are_hashed_before_and_after():
    class AddOne(nn.Module):
        def forward(self, x):
            return x.add_(1.0)

    lay = Layout.per_request([0, 1])
    x = torch.randn(2, 5)
    before = row_hashes(x, lay)
    model, other = AddOne(), AddOne()
    with record(model, lay, level="ops") as tr:
        model(x)
        other(torch.randn(2, 5))  # not the recorded model: neither it nor its functions are recorded
    after = row_hashes(x, lay)
    module, add = tr.entries
    assert add.name == "AddOne.Tensor.add_"
    for rec, want in (
        (module.inputs[0], before),
        (module.outputs[0], after),
        (add.inputs[0], before),
        (add.outputs[0], after),
    ):
        assert [tr.hash_of(rec, r) for r in (0, 1)] == want.tolist()


def test_keyword_inputs_are_hashed_as_passed_before_the_module_writes_them():
    class Scale(nn.Module):
        def forward(self, x, *, out):
            out.mul_(2.0)
            return x + out

    lay = Layout.per_request([0, 1])
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    before = row_hashes(y, lay)
    model = Scale()
    with record(model, lay) as tr:
        model(x, out=y)
    (entry,) = tr.entries
    assert [r.path for r in entry.inputs] == ["args[0]", "kwargs['out']"]
    assert [tr.hash_of(entry.inputs[1], r) for r in (0, 1)] == before.tolist()


def test_inputs_are_hashed_as_the_caller_passed_them_and_outputs_as_it_gets_them():
    """The module's own hooks are part of its call: a pre-hook that rewrites the input and a hook
    that rewrites the output run inside what is recorded."""
    lay = Layout.per_request([0, 1])
    x = torch.randn(2, 3)
    net = nn.ReLU()
    net.register_forward_pre_hook(lambda m, args: (args[0] * 2.0,))
    net.register_forward_hook(lambda m, args, out: out + 1.0)
    with record(net, lay) as tr:
        got = net(x)
    (entry,) = tr.entries
    assert torch.equal(got, torch.relu(x * 2.0) + 1.0)
    assert [tr.hash_of(entry.inputs[0], r) for r in (0, 1)] == row_hashes(x, lay).tolist()
    assert [tr.hash_of(entry.outputs[0], r) for r in (0, 1)] == row_hashes(got, lay).tolist()


def test_a_forward_set_on_the_instance_before_or_inside_the_block_is_recorded():
    """However forward is set (accelerate's hooks set it on the instance; the lab's
    HFModel.linear_backend patches it inside a block), the module's calls are recorded."""
    net = nn.Sequential(nn.ReLU(), nn.ReLU())
    net[0].forward = lambda x: x * 3.0
    with record(net, Layout.per_request([0])) as tr:
        net[1].forward = lambda x: x + 1.0
        got = net(torch.ones(1, 2))
    assert torch.equal(got, torch.full((1, 2), 4.0))
    assert [e.name for e in tr.entries] == ["Sequential", "0", "1"]
    n = len(tr)
    net(torch.ones(1, 2))  # the block is over: nothing more is recorded
    assert len(tr) == n


def test_a_module_copied_or_pickled_inside_the_block_is_not_recorded():
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    x = torch.randn(1, 2)
    with record(net, Layout.per_request([0])) as tr:
        copies = [copy.deepcopy(net), pickle.loads(pickle.dumps(net))]
        for c in copies:
            assert torch.equal(c(x), net(x))
            assert inspect.signature(c[0].forward) == inspect.signature(net[0].forward)
    assert [e.name for e in tr.entries] == ["Sequential", "0", "1"] * 2  # the original's calls only


def test_a_call_wrapper_set_on_top_inside_the_block_stays_and_records_nothing_after():
    """Code that wraps a module's `_call_impl` inside the block keeps its wrapper after it, and
    with it ours beneath, which then passes calls by."""
    net = nn.Sequential(nn.ReLU())
    with record(net, Layout.per_request([0])) as tr:
        under = net[0]._call_impl
        net[0]._call_impl = lambda *args, **kwargs: under(*args, **kwargs) + 1.0
        assert torch.equal(net(torch.zeros(1, 2)), torch.ones(1, 2))
    assert [e.name for e in tr.entries] == ["Sequential", "0"]
    n = len(tr)
    assert torch.equal(net(torch.zeros(1, 2)), torch.ones(1, 2))
    assert len(tr) == n


def _hashes(tr) -> list:
    return [
        [tr.hash_of(r, i) for i in (0, 1, 2)] + [tr.whole_hash_of(r)] for e in tr.entries for r in e.inputs + e.outputs
    ]


@pytest.mark.parametrize("level", ["modules", "ops"])
def test_a_tensor_seen_by_several_calls_is_read_once_with_the_same_hashes(level):
    net, x = Net(), torch.randn(3, 4)
    traces = {}
    for reuse in (True, False):
        with record(net, Layout.per_request([0, 1, 2]), level=level, reuse=reuse) as traces[reuse]:
            net(x)
    fresh, reused = traces[False], traces[True]
    assert _hashes(reused) == _hashes(fresh)
    assert fresh.n_read == fresh.n_tensors and reused.n_read < reused.n_tensors == fresh.n_tensors


def test_reads_of_freed_tensors_are_dropped_as_a_trace_grows(monkeypatch):
    # Every forward makes new activations; a long recording keeps only the reads of live tensors
    # (about twice as many at most), with the same hashes as a recording that never drops them.
    rec = importlib.import_module("gdn_lab.trace.record")
    monkeypatch.setattr(rec, "_SEEN_MIN", 8)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    lay = Layout.per_request([0, 1])

    def forwards(trace):
        g = torch.Generator().manual_seed(0)
        for _ in range(30):
            net(torch.randn(2, 4, generator=g))  # each input and activation freed after its forward
            assert trace._reuse is False or len(trace._seen) <= 2 * 8 + 8

    with record(net, lay, level="ops") as tr:
        forwards(tr)
    with record(net, lay, level="ops", reuse=False) as every:
        forwards(every)
    assert len(tr) == len(every)
    got = [[tr.hash_of(r, q) for r in e.outputs for q in (0, 1)] for e in tr.entries]
    want = [[every.hash_of(r, q) for r in e.outputs for q in (0, 1)] for e in every.entries]
    assert got == want


def test_a_write_no_version_counter_sees_is_still_seen_at_the_call_that_made_it():
    class Raw(nn.Module):  # writes its input in place behind torch's version counter (like a raw kernel)
        def forward(self, x):
            x.data.mul_(2.0)
            return x

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.raw = nn.Identity(), Raw()

        def forward(self, x):
            return self.raw(self.first(x))

    lay, x = Layout.per_request([0, 1]), torch.randn(2, 3)
    before, version = row_hashes(x, lay).tolist(), x._version
    model = Outer()
    with record(model, lay) as tr:
        model(x)
    assert x._version == version  # torch did not see the write
    outer, first, raw = tr.entries
    after = row_hashes(x, lay).tolist()
    assert after != before
    for rec, want in (
        (first.outputs[0], before),
        (raw.inputs[0], before),
        (raw.outputs[0], after),
        (outer.outputs[0], after),
    ):
        assert [tr.hash_of(rec, r) for r in (0, 1)] == want, rec.path
    assert tr.n_read < tr.n_tensors


@pytest.mark.parametrize("level", ["modules", "ops"])
def test_a_model_run_under_inference_mode_is_recorded_and_its_writes_seen(level):
    class Outer(nn.Module):  # writes the first module's output in place before the second sees it
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second, self.net = nn.Identity(), nn.Identity(), Net()

        def forward(self, x):
            y = self.first(x)
            y.mul_(2.0)
            return self.net(self.second(y))

    lay, x = Layout.per_request([0, 1, 2]), torch.randn(3, 4)
    model = Outer()
    with torch.no_grad(), record(model, lay, level=level, reuse=False) as want:
        model(x.clone())
    with torch.inference_mode():  # inference tensors keep no version counter: each call reads its own
        inputs = x.clone()
        with record(model, lay, level=level) as got:
            model(inputs)
    assert [(e.name, e.kind) for e in got.entries] == [(e.name, e.kind) for e in want.entries]
    assert _hashes(got) == _hashes(want)
    second = next(e for e in got.entries if e.name == "second")
    assert [got.hash_of(second.inputs[0], r) for r in (0, 1, 2)] == row_hashes(2.0 * x, lay).tolist()


def test_the_lab_model_under_inference_mode_records_what_it_records_under_no_grad():
    from gdn_lab.model import Model, ModelConfig

    model, prompts, lay = Model(ModelConfig.from_name("tiny")), [[5, 17, 3, 99], [64, 2]], Layout.per_request([0, 1])

    def calls(tr) -> list:
        return [(e.step, e.name, e.kind, e.backend) for e in tr.entries]

    with record(model, lay, level="ops") as want:
        model.generate(prompts, 3, trace=want)
    with torch.inference_mode(), record(model, lay, level="ops") as got:  # its caches are inference tensors too
        model.generate(prompts, 3, trace=got)
    assert calls(got) == calls(want) and {"lab_op", "function", "module"} <= {e.kind for e in got.entries}
    assert _hashes(got) == _hashes(want)


def test_lab_op_caches_are_hashed_per_request_through_their_slots():
    class Step(nn.Module):
        def forward(self, q, k, v, a, b, state, slots):
            return gdn_decode(q, k, v, a, b, torch.zeros(2), torch.zeros(2), state, slots, backend="torch")

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 1, 8, generator=g) for _ in range(3))
    v = torch.randn(2, 2, 8, generator=g)
    a, b = torch.randn(2, 2, generator=g), torch.randn(2, 2, generator=g)
    state = torch.randn(5, 2, 8, 8, generator=g)
    slots = torch.tensor([3, 1], dtype=torch.int32)
    lay = Layout.per_request(["x", "y"])
    before = row_hashes(state[slots.long()], lay)
    step = Step()
    with record(step, lay, level="ops") as tr:
        step(q, k, v, a, b, state, slots)
    op = next(e for e in tr.entries if e.kind == "lab_op")
    assert op.name == "Step.gdn_decode"
    by_path = {r.path: r for r in op.inputs}
    assert "slots" not in by_path and by_path["state"].alignment == "view"
    assert [tr.hash_of(by_path["state"], r) for r in ("x", "y")] == before.tolist()
    out_state = next(r for r in op.outputs if r.path == "state")
    assert [tr.hash_of(out_state, r) for r in ("x", "y")] == row_hashes(state[slots.long()], lay).tolist()
    assert not any(e.kind == "function" and e.parent == op.index for e in tr.entries)  # the backend's internals


def test_layouts_change_per_step():
    net = nn.Sequential(nn.ReLU())
    with record(net, Layout.packed([0, 2, 5], ["a", "b"])) as tr:
        net(torch.randn(5, 3))
        tr.set_layout(Layout.per_request(["a", "b"]))
        net(torch.randn(2, 3))
        with tr.step(Layout.per_request(["b"]), step=7):
            net(torch.randn(1, 3))
        assert tr.current_step == 1
    roots = [e for e in tr.entries if e.name == "Sequential"]
    assert [(e.step, e.call_index) for e in roots] == [(0, 0), (1, 0), (7, 0)]
    assert tr.steps == [0, 1, 7]
    assert [e.inputs[0].alignment for e in roots] == ["tokens", "requests", "requests"]
    assert roots[2].layout.request_ids == ("b",)


def test_nothing_is_left_behind_after_an_exception():
    class Boom(nn.Module):
        def forward(self, x):
            F.silu(x)
            raise RuntimeError("boom")

    net = nn.Sequential(nn.ReLU(), Boom())
    for level in ("modules", "ops"):
        with pytest.raises(RuntimeError, match="boom"), record(net, Layout.per_request([0]), level=level) as tr:
            net(torch.randn(1, 3))
        assert hooks_left(net) == 0 and modes_left() == 0
        failed = [e.name for e in tr.entries if e.error]
        assert failed == ["Sequential", "1"]
    n = len(tr)
    net[0](torch.randn(1, 3))  # hooks gone: nothing more is recorded
    matmul(torch.randn(2, 2), torch.randn(2, 2), backend="torch")  # observer gone
    assert len(tr) == n


@pytest.mark.parametrize("level", ["modules", "ops"])
@pytest.mark.parametrize("raises", [False, True], ids=["returns", "raises"])
def test_a_trace_goes_with_its_last_reference_without_the_cyclic_collector(level, raises):
    """Nothing the block leaves behind holds the trace in a reference cycle: its tables and device
    arenas go when the caller drops it, not at the collector's next pass (level="ops" kept a
    recorder <-> function mode cycle once)."""
    net = Net()
    enabled = gc.isenabled()
    gc.disable()
    try:
        with contextlib.suppress(RuntimeError), record(net, Layout.per_request([0, 1, 2]), level=level) as tr:
            net(torch.randn(3, 4))
            if raises:
                raise RuntimeError("the forward fails")
        assert len(tr.entries) > 1
        trace, sink = weakref.ref(tr), weakref.ref(tr._sink)
        del tr
        assert trace() is None and sink() is None
    finally:
        if enabled:
            gc.enable()


def test_a_model_called_while_an_exception_is_handled_records_normally():
    net = nn.Sequential(nn.ReLU())
    with record(net, Layout.per_request([0])) as tr:
        try:
            raise KeyError("handled by the caller")
        except KeyError:
            net(torch.randn(1, 3))
    assert [(e.name, e.error, len(e.outputs)) for e in tr.entries] == [("Sequential", False, 1), ("0", False, 1)]


def test_blocks_nest_and_do_not_record_each_other():
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    x = torch.randn(2, 3)
    with record(net, Layout.per_request([0, 1]), level="ops") as alone:
        net(x)
    with record(net, Layout.per_request([0, 1]), level="ops") as outer:
        with record(net, Layout.per_request([0, 1]), level="modules") as inner:
            net(x)
        # the outer block's wrapper on each of the three modules
        assert hooks_left(net) == 3 and modes_left() == 1
    assert hooks_left(net) == 0 and modes_left() == 0
    assert [e.name for e in outer.entries] == [e.name for e in alone.entries]
    assert [e.name for e in inner.entries] == ["Sequential", "0", "1"]


def test_a_trace_read_inside_a_block_records_nothing_and_reads_the_same_hashes():
    # The read's combine runs torch ops; inside an ops-level block (its own, or an outer one)
    # they must not be recorded, nor write the arena being read.
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))
    x = torch.randn(2, 3)
    lay = Layout.per_request([0, 1])
    with record(net, lay, level="ops") as plain:
        net(x)

    class Reading(nn.Module):
        def __init__(self, trace_of):
            super().__init__()
            self.net, self.trace_of = net, trace_of

        def forward(self, x):
            h = self.net[1](self.net[0](x))
            _ = [self.trace_of().hash_of(r, 1) for e in self.trace_of().entries for r in e.outputs]
            return self.net[2](h)

    holder = {}
    reading = Reading(lambda: holder["trace"])
    with record(reading, lay, level="ops") as tr:
        holder["trace"] = tr
        reading(x)
    names = [e.name.removeprefix("net.") for e in tr.entries if e.kind != "module" or e.name != "Reading"]
    assert names == [e.name for e in plain.entries if e.name != "Sequential"]
    read = [[tr.hash_of(r, q) for r in e.outputs for q in (0, 1)] for e in tr.entries if e.module.startswith("net")]
    want = [[plain.hash_of(r, q) for r in e.outputs for q in (0, 1)] for e in plain.entries if e.module]
    assert read == want


@torch.library.custom_op("gdn_lab_test::fill_first", mutates_args=("x",))
def _fill_first(x: torch.Tensor, value: float) -> None:
    x[:, 0] = value


class Writes(nn.Module):
    """Writes its activation in place in every way the function mode sees (device-agnostic)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.act = nn.Linear(4, 4), nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.lin(x))
        y.add_(1.0)  # by name
        y[:, 0] = 0.5  # __setitem__
        torch.ops.aten.mul_.Scalar(y, 2.0)  # an operator whose schema declares the write
        _fill_first(y, 0.25)  # ... a custom one, returning nothing
        F.relu(y, inplace=True)  # inplace=True
        torch.mul(y, 3.0, out=y)  # out=
        return y * 3.0


def _writes_run(device, **kwargs) -> tuple:
    torch.manual_seed(0)
    model, x = Writes().to(device), torch.randn(3, 4, device=device)
    with torch.no_grad(), record(model, Layout.per_request([0, 1, 2]), level="ops", **kwargs) as tr:
        out = model(x)
        out.sub_(1.0)  # outside the model's modules: not recorded, but the reads queued before it run first
    return tr, out


@needs_triton
def test_ops_level_reads_queued_until_a_write_give_the_hashes_read_at_each_call(monkeypatch, device):
    queued, _ = _writes_run(device, hash_impl="triton")
    each, _ = _writes_run(device, hash_impl="triton", reuse=False)
    ref, _ = _writes_run(device, hash_impl="torch")
    assert each.n_flush == 0 and 0 < queued.n_flush < queued.n_read
    assert [(e.name, e.kind) for e in queued.entries] == [(e.name, e.kind) for e in ref.entries]
    names = [e.name for e in queued.entries]
    for written in ("Tensor.add_", "Tensor.__setitem__", "aten.mul_.Scalar", "F.relu", "torch.mul"):
        assert f"Writes.{written}" in names, written
    custom = queued.entries[names.index("Writes.gdn_lab_test.fill_first.default")]
    assert [r.path for r in custom.outputs] == ["out[0]"]  # the argument its schema writes
    assert _hashes(queued) == _hashes(each) == _hashes(ref)
    # the control: reads left queued past the writes find their tensors' version counters moved
    from gdn_lab.trace.hashing import HashSink, StaleReadError

    with monkeypatch.context() as m:
        m.setattr(HashSink, "flush", lambda self: None)
        late, _ = _writes_run(device, hash_impl="triton")
    with pytest.raises(StaleReadError, match="reuse=False") as caught:
        _ = late.entries  # reading the entries runs the queued reads
    written = {late._calls[index][1] for index, _ in caught.value.tags}
    assert {"act.F.silu", "Writes.Tensor.add_", "Writes.Tensor.mul"} <= written, written


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_an_ops_recording_on_the_gpu_makes_the_host_wait_for_nothing():
    """The recorder's own work at level="ops" (reads queued, flushed at each write, their table's
    copy and launches, the block's end) never waits for the GPU: a wait would serialise the row
    stage with the forward. The model, its input and the layout's device tables exist before."""
    torch.manual_seed(0)
    model, x, lay = Writes().cuda(), torch.randn(3, 4, device="cuda"), Layout.per_request([0, 1, 2])

    def run():
        with torch.no_grad(), record(model, lay, level="ops", hash_impl="triton") as tr:
            model(x).sub_(1.0)
        return tr

    run()  # warm: the kernels, the layout's device tables, the pinned blocks
    torch.cuda.set_sync_debug_mode("error")
    try:
        tr = run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tr.n_flush > 0 and len(tr.entries) > 5  # reading the trace copies to the host: after


class RandomWrites(nn.Module):
    """A forward drawn from a seed: functional calls and writes of every kind the recorder sees,
    on fresh tensors, earlier ones and views of them, inside child modules or not."""

    STEPS = ("sin", "matmul", "cat", "add_", "setitem", "view_add_", "schema", "inplace", "out", "child")

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed
        self.child = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the same forward at every call; drawn in Python, so the draws are no torch calls to record
        g = random.Random(self.seed)
        live = [x.clone()]
        for _ in range(12):
            step = g.choice(self.STEPS)
            t = g.choice(live)  # any tensor made so far
            if step == "sin":
                live.append(torch.sin(t))
            elif step == "matmul":
                live.append(t @ torch.full((4, 4), 0.25, device=t.device))
            elif step == "cat":
                live.append(torch.cat([t[:2], t[1:]])[: t.shape[0]])
            elif step == "add_":
                t.add_(0.5)
            elif step == "setitem":
                t[g.randrange(t.shape[0])] = 2.0
            elif step == "view_add_":  # a write through a view reaches every queued read of its base
                t.t()[1:].mul_(1.5)
            elif step == "schema":
                torch.ops.aten.mul_.Scalar(t, -1.0)
            elif step == "inplace":
                F.relu(t, inplace=True)
            elif step == "out":
                torch.add(t, 1.0, out=t)
            else:
                live.append(self.child(t))
        return torch.stack(live).sum(0)


@needs_triton
@pytest.mark.parametrize("flush_at", [3, 32])
@pytest.mark.parametrize("seed", range(4))
def test_queued_reads_hash_what_each_call_saw_on_random_forwards(seed, flush_at, monkeypatch, device):
    # Writes drawn at random positions against reads queued at random depths (a cap of 3 flushes
    # between them too): every hash must be the one read at its call.
    from gdn_lab.trace import hashing

    monkeypatch.setattr(hashing._Arena, "FLUSH_AT", flush_at)
    lay, x = Layout.per_request([0, 1, 2]), torch.randn(3, 4, device=device)
    model, traces = RandomWrites(seed).to(device), {}
    for reuse in (True, False):
        with torch.no_grad(), record(model, lay, level="ops", hash_impl="triton", reuse=reuse) as traces[reuse]:
            model(x)
    queued, each = traces[True], traces[False]
    assert queued.n_flush > 0 and each.n_flush == 0
    assert [(e.name, e.kind) for e in queued.entries] == [(e.name, e.kind) for e in each.entries]
    assert _hashes(queued) == _hashes(each)


@needs_triton
@pytest.mark.parametrize("flush_at", [32, 3], ids=["at-the-end", "inside-the-forward"])
def test_a_write_the_recorder_cannot_see_fails_the_recording_unless_every_read_is_at_its_call(
    flush_at, monkeypatch, device
):
    from gdn_lab.trace import hashing

    monkeypatch.setattr(hashing._Arena, "FLUSH_AT", flush_at)  # 3: the cap runs it at y * 2.0, in the forward

    class Hidden(nn.Module):
        def forward(self, x):
            y = torch.sin(x)
            with torch._C.DisableTorchFunction():  # no mode sees this write; the version counter does
                y.add_(1.0)
            return y * 2.0

    model, x, lay = Hidden(), torch.randn(2, 3, device=device), Layout.per_request([0, 1])
    with (
        pytest.raises(RuntimeError, match=r"out of call 1 \(Hidden.torch.sin\).*reuse=False"),
        record(model, lay, level="ops", hash_impl="triton"),
    ):
        model(x)
    with record(model, lay, level="ops", hash_impl="triton", reuse=False) as tr:
        model(x)
    sin = tr.entries[1]
    assert [tr.hash_of(sin.outputs[0], r) for r in (0, 1)] == row_hashes(torch.sin(x), lay).tolist()


@needs_triton
def test_a_routed_op_without_a_spec_runs_the_queued_reads_before_it_writes(monkeypatch, device):
    # Its writes are unknown, and a raw write (here through .data) moves no version counter: only
    # the flush before it keeps the queued read of what it overwrites.
    from gdn_lab import routing

    monkeypatch.setattr(routing, "_REGISTRY", {k: dict(v) for k, v in routing._REGISTRY.items()})

    def scale(x):
        x.data.mul_(2.0)
        return x.sum()

    routing.register(routing.Backend("toy_scale", "raw", scale, routing.LIBRARY_TORCH))

    class Toy(nn.Module):
        def forward(self, x):
            y = torch.sin(x)
            return routing.dispatch("toy_scale", {"x": y})[0]

    model, x, lay = Toy(), torch.randn(2, 3, device=device), Layout.per_request([0, 1])
    with record(model, lay, level="ops", hash_impl="triton") as tr:
        model(x)
    sin = next(e for e in tr.entries if e.name == "Toy.torch.sin")
    assert [tr.hash_of(sin.outputs[0], r) for r in (0, 1)] == row_hashes(torch.sin(x), lay).tolist()


@needs_triton
def test_the_lab_model_records_the_same_hashes_with_its_reads_queued(device):
    from gdn_lab.model import OPS, Model, ModelConfig

    model = Model(ModelConfig.from_name("tiny"), backends=dict.fromkeys(OPS, "torch"), device=device)
    prompts, lay = [[5, 17, 3, 99], [64, 2]], Layout.packed([0, 4, 6], [0, 1])
    traces = {}
    for key, kwargs in (("queued", dict(hash_impl="triton")), ("ref", dict(hash_impl="torch", reuse=False))):
        cache = model.new_cache([4, 2], 1, request_ids=[0, 1])
        with torch.no_grad(), record(model, lay, level="ops", **kwargs) as traces[key]:
            model.prefill(prompts, cache, trace=traces[key])
    queued, ref = traces["queued"], traces["ref"]
    lab_ops = sum(e.kind == "lab_op" for e in queued.entries)
    assert 0 < queued.n_flush < lab_ops  # a lab op flushes only when a queued read lies in its state pools
    assert [(e.name, e.kind) for e in queued.entries] == [(e.name, e.kind) for e in ref.entries]
    assert _hashes(queued) == _hashes(ref)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        pytest.param(dict(model="net"), "model: expected a torch.nn.Module", id="model"),
        pytest.param(dict(layout=[0, 1]), "layout: expected a gdn_lab.trace.Layout", id="layout"),
        pytest.param(dict(level="aten"), "level: 'aten'", id="level"),
        pytest.param(dict(hash_impl="xxhash"), "hash_impl: 'xxhash'", id="hash_impl"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, match):
    args = dict(model=nn.ReLU(), layout=Layout.per_request([0]), **{"level": "modules"})
    args.update(kwargs)
    with pytest.raises(ValueError, match=match), record(**args):
        pass


def _no_triton_on_the_cpu(monkeypatch) -> None:
    """Triton runs nowhere but on a GPU, as on a GPU machine without TRITON_INTERPRET."""
    from gdn_lab import device as lab_device

    real = lab_device.triton_mode
    monkeypatch.setattr(
        lab_device, "triton_mode", lambda d=None: real(d) if torch.device(d).type == "cuda" else (None, "patched")
    )


def test_triton_hashing_that_cannot_run_on_the_models_device_is_refused_before_the_forward(monkeypatch):
    _no_triton_on_the_cpu(monkeypatch)
    net = nn.Linear(4, 4)  # on the CPU
    refused = pytest.raises(ValueError, match="hash_impl: 'triton' cannot run on cpu: patched")
    with refused, record(net, Layout.per_request([0]), hash_impl="triton"):
        raise AssertionError("the block ran")


@needs_triton
def test_a_side_tensor_where_triton_cannot_run_is_hashed_with_torch(monkeypatch, device):
    # A forward on the test device makes a CPU tensor: hashed with torch there, to the hash torch
    # gives everywhere, instead of failing the recorded forward. (No parameters: on the CPU suite
    # the model's own device is then one Triton cannot run on either, and nothing refuses it.)
    _no_triton_on_the_cpu(monkeypatch)

    class Side(nn.Module):
        def forward(self, x):
            rows = torch.arange(x.shape[0], dtype=x.dtype) * 0.5  # made on the CPU
            return torch.sin(x) + rows.to(x.device)[:, None]

    model, x = Side(), torch.randn(3, 4, device=device)
    traces = {}
    for impl in ("triton", "torch"):
        with torch.no_grad(), record(model, Layout.per_request([0, 1, 2]), level="ops", hash_impl=impl) as traces[impl]:
            model(x)
    impls = {d.type: arena.impl for d, arena in traces["triton"]._sink._arenas.items()}
    assert impls == {"cpu": "torch", **({"cuda": "triton"} if device.type == "cuda" else {})}
    assert _hashes(traces["triton"]) == _hashes(traces["torch"])


def test_a_hugging_face_model_built_from_a_config():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad(), record(model, Layout.per_request([0, 1]), level="ops") as tr:
        model(torch.randint(0, 64, (2, 5)))
    names = {e.name for e in tr.entries}
    assert {"Qwen3ForCausalLM", "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.q_proj.F.linear"} <= names
    assert "model.layers.0.self_attn.F.scaled_dot_product_attention" in names
    logits = next(e for e in tr.entries if e.name == "Qwen3ForCausalLM").outputs
    assert any(r.path == "out['logits']" and r.alignment == "requests" for r in logits)
    assert hooks_left(model) == 0 and modes_left() == 0


def test_lab_op_backends_run_without_the_recorders_mode(monkeypatch):
    """A lab op's backend runs with the recorder's function mode off the stack, where it is on top
    (its calls are not the model's: each would pay a Python call into the mode), and the mode is
    back after the op, also when the op raises; a mode entered inside the block stays on top, and
    the backend's calls are still not recorded then."""
    from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

    from gdn_lab import routing

    stacks = []

    def spy(x, w):
        stacks.append(list(_get_current_function_mode_stack()))
        if x.shape[0] == 3:
            raise RuntimeError("backend failed")
        return F.silu(x @ w)  # internals: never recorded

    backend = routing.Backend("matmul", "spy", spy, library=routing.LIBRARY_TORCH, priority=0)
    monkeypatch.setitem(routing._REGISTRY["matmul"], "spy", backend)

    class Step(nn.Module):
        def forward(self, x):
            return torch.tanh(matmul(x, torch.eye(4), backend="spy"))

    class Outer(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    step, lay = Step(), Layout.per_request([0, 1])
    with record(step, lay, level="ops") as tr:
        ours = _get_current_function_mode_stack()[-1]
        step(torch.randn(2, 4))
        assert stacks[-1] == [] and _get_current_function_mode_stack() == [ours]
        with pytest.raises(RuntimeError, match="backend failed"):
            step(torch.randn(3, 4))
        assert stacks[-1] == [] and _get_current_function_mode_stack() == [ours]
        with Outer() as outer:
            step(torch.randn(2, 4))
            assert stacks[-1] == [ours, outer]
    assert modes_left() == 0
    names = [e.name for e in tr.entries if e.kind != "module"]
    call = ["Step.torch.eye", "Step.matmul"]  # the backend's silu and @ are not among them
    assert names == [*call, "Step.torch.tanh", *call, *call, "Step.torch.tanh"], names


def test_the_alias_shortcut_records_what_the_general_check_records(monkeypatch):
    """`_views_of_first` (outputs that are args[0] or views of its root) must skip exactly the calls
    `_aliases` would skip: traces with it and without it are equal; the shortcut was taken, and a
    control that skips no alias records more."""
    recorder = importlib.import_module("gdn_lab.trace.record")

    class Views(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            t = x.t()
            outs = [x.view(-1), t, x[:, 1:], t[1:], x.to(x.dtype), *x.unbind(0), *x.split(2, dim=1), x.view_as(x)]
            outs += [x.detach(), t.contiguous(), x.contiguous(), self.w.t(), torch.cat([x, x]), x.expand(2, 3, 4)]
            return torch.add(outs[-1][0], 1.0)

    net, lay, x = Views(), Layout.per_request([0, 1, 2]), torch.randn(3, 4)

    def trace():
        with record(net, lay, level="ops") as tr:
            net(x)
        return [(e.name, e.call_index, [r.path for r in e.inputs + e.outputs]) for e in tr.entries], _hashes(tr)

    shortcut, taken = recorder._views_of_first, []
    monkeypatch.setattr(
        recorder, "_views_of_first", lambda outputs, args: taken.append(shortcut(outputs, args)) or taken[-1]
    )
    fast = trace()
    monkeypatch.setattr(recorder, "_views_of_first", lambda outputs, args: False)
    general = trace()
    monkeypatch.setattr(recorder, "_aliases", lambda outputs, inputs: False)
    control = trace()
    assert fast == general and sum(taken) >= 8  # view, t, the getitems, to, unbind, split, view_as
    assert len(control[0]) > len(general[0])


def test_a_view_made_anew_at_every_call_is_read_once_per_trace():
    # The lab's Linear passes weight.t() to the matmul op at every call: a new view object each
    # time, of the same weight, which two decode steps of one trace need not read twice.
    lin = nn.Linear(4, 4, bias=False)

    class Step(nn.Module):
        def forward(self, x):
            return matmul(x, lin.weight.t(), backend="torch")

    class Held(nn.Module):  # the same call with one view, made before the steps
        def __init__(self) -> None:
            super().__init__()
            self.w = lin.weight.t()

        def forward(self, x):
            return matmul(x, self.w, backend="torch")

    lay = Layout.per_request([0, 1])
    traces = {}
    for name, step, reuse in (("anew", Step(), True), ("held", Held(), True), ("fresh", Step(), False)):
        with record(step, lay, level="ops", reuse=reuse) as traces[name]:
            for i in range(2):
                step(torch.full((2, 4), float(i)))
    reused, fresh = traces["anew"], traces["fresh"]
    assert _hashes(reused) == _hashes(fresh) == _hashes(traces["held"])
    ops = [e for e in reused.entries if e.kind == "lab_op"]
    assert [r.path for r in ops[0].inputs] == ["x", "w"]
    assert reused.whole_hash_of(ops[0].inputs[1]) == reused.whole_hash_of(ops[1].inputs[1])
    assert reused.n_read == traces["held"].n_read < fresh.n_read  # the second step's view was not read again
    step = Step()
    with record(step, lay, level="ops") as tr:
        step(torch.zeros(2, 4))
        with torch.no_grad():
            lin.weight.mul_(2.0)  # a write to the base bumps its views' version counter: read again
        step(torch.zeros(2, 4))
    w = [tr.whole_hash_of(e.inputs[1]) for e in tr.entries if e.kind == "lab_op"]
    assert w[0] == reused.whole_hash_of(ops[0].inputs[1]) != w[1]
