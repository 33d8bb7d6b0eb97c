"""row_hashes: the documented definition bit for bit, and the properties a culprit search relies on."""

import importlib.util
import math

import pytest
import torch

from gdn_lab.trace import Layout, row_hashes, tensor_hash
from gdn_lab.trace.hashing import M1, M2, G, HashSink, S, _salt

MASK = (1 << 64) - 1
INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.float8_e4m3fn, id="fp8e4m3fn"),
    pytest.param(torch.float8_e4m3fnuz, id="fp8e4m3fnuz"),
    pytest.param(torch.int32, id="int32"),
    pytest.param(torch.int64, id="int64"),
    pytest.param(torch.uint8, id="uint8"),
    pytest.param(torch.bool, id="bool"),
]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def mix(z: int) -> int:
    z &= MASK
    z ^= z >> 30
    z = (z * (M1 & MASK)) & MASK
    z ^= z >> 27
    z = (z * (M2 & MASK)) & MASK
    return z ^ (z >> 31)


def reference(t: torch.Tensor, layout: Layout) -> list[int]:
    """The module docstring's definition in Python integers."""
    salt = _salt(t.dtype, tuple(t.shape[1:]))
    words = t.contiguous().view(INT_VIEW[t.element_size()]).reshape(t.shape[0], -1).tolist()
    rows = [sum(mix(w + (j + 1) * G) for j, w in enumerate(r)) & MASK for r in words]
    seg, pos = layout.rows(layout.alignment(t), torch.device("cpu"))
    out = [0] * layout.num_requests
    for r, (s, p) in enumerate(zip(seg.tolist(), pos.tolist())):
        out[s] = (out[s] + mix(rows[r] + salt + (p + 1) * S)) & MASK
    return [signed(o) for o in out]


def sample(dtype: torch.dtype, shape, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g).to(dtype)
    return (4 * torch.randn(shape, generator=g)).to(dtype)


LAYOUT = Layout.packed([0, 3, 4, 9], request_ids=[10, 11, 12])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [pytest.param((9, 5), id="9x5"), pytest.param((9, 3, 2), id="9x3x2"), pytest.param((9,), id="9")]
)
def test_torch_path_matches_the_definition(dtype, shape):
    t = sample(dtype, shape)
    assert row_hashes(t, LAYOUT, impl="torch").tolist() == reference(t, LAYOUT)


@needs_triton
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_kernel_matches_the_torch_path(dtype, device):
    # On the test device: the compiled kernel on a GPU, TRITON_INTERPRET=1 on the CPU. Rows of
    # 40000 words span three column blocks, which add into their rows atomically.
    cases = (
        ((9, 37), LAYOUT),
        ((3, 2100), Layout.per_request([1, 2, 3])),
        ((2, 40000), Layout.per_request([1, 2])),
        ((1, 40000), Layout.per_request([7])),  # batch 1: a tile of one row
        ((9,), LAYOUT),
    )
    for shape, layout in cases:
        t = sample(dtype, shape).to(device)
        assert torch.equal(row_hashes(t, layout, impl="triton"), row_hashes(t, layout, impl="torch"))
        assert torch.equal(tensor_hash(t, impl="triton"), tensor_hash(t, impl="torch"))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int32, torch.bool])
def test_triton_kernel_reads_strided_tensors_in_place_as_the_torch_path_reads_their_copies(dtype, device):
    # Each view's words in its logical order, whatever its strides: in place for 1-3 trailing
    # dims after merging (bool is read through a contiguous integer view), else through a copy.
    from gdn_lab.trace.triton_hash import _strides

    base = sample(dtype, (6, 4, 10, 3)).to(device)
    views = {
        "transpose 2-D": (base[:, 0, :, 0].t(), 1),  # [10, 6]: its rows contiguous, its words not
        "slice with gaps": (base[:, :, 2:7, :], 2),  # [6, 4, 5, 3]: (4, 5 x 3) trailing dims
        "permuted": (base.permute(2, 0, 3, 1), 3),  # [10, 6, 3, 4]: three trailing dims
        "broadcast": (base[:, :1, 0, :].expand(6, 5, 3), 2),  # stride 0
        "size-1 dims": (base[:, 1:2, :, 1:2], 1),
        "rows of one word": (base[:, 0, 0, 0], 1),
        "four trailing dims": (base.unsqueeze(1).expand(6, 2, 4, 10, 3).permute(0, 4, 3, 2, 1), None),
    }
    for name, (t, trailing) in views.items():
        assert not t.is_contiguous(), name
        found = _strides(t)
        assert (found and found[0]) == trailing, name
        layout = Layout.per_request(list(range(t.shape[0])))
        assert torch.equal(row_hashes(t, layout, impl="triton"), row_hashes(t.contiguous(), layout, impl="torch")), name
        assert torch.equal(tensor_hash(t, impl="triton"), tensor_hash(t.contiguous(), impl="torch")), name


@pytest.fixture
def small_splits(monkeypatch):
    """The Triton row stage's thresholds shrunk so small shapes take every launch shape: row blocks
    split into column blocks that each loop over several tiles, and row blocks left whole looping
    over theirs."""
    from gdn_lab.trace import triton_hash

    monkeypatch.setattr(triton_hash, "MIN_PROGRAMS", 4)
    monkeypatch.setattr(triton_hash, "SPLIT_BELOW", 4)
    triton_hash._launch_config.cache_clear()
    yield triton_hash
    triton_hash._launch_config.cache_clear()


@needs_triton
@pytest.mark.parametrize("f", [16, 3000, 40000])
def test_a_tile_takes_no_more_rows_than_the_tensor_has(f):
    # A second tile row for a one-row tensor (a [B, ...] tensor at batch 1) masks half the lanes.
    from gdn_lab.trace.triton_hash import MAX_TILE, _launch_config

    for r in (1, 2, 3, 5, 64, 1000):
        _, _, block_r, block_f, _ = _launch_config(r, f)
        assert block_r <= max(1, 1 << (r - 1).bit_length()) and block_r * block_f <= MAX_TILE, (r, f)
    assert _launch_config(1, f)[2] == 1 and _launch_config(1000, f)[2] == _launch_config(10**6, f)[2]  # no cap there


@needs_triton
def test_triton_kernel_matches_with_rows_split_over_programs_and_programs_looping(small_splits, device):
    shapes = {(5, 5000): (True, 3), (9, 2100): (False, 3)}  # -> (split, tiles per program)
    for shape, (split, n_iter) in shapes.items():
        _, iters, _, _, splits = small_splits._launch_config(*shape)
        assert (splits, iters) == (split, n_iter)
        t = sample(torch.bfloat16, shape).to(device)
        assert torch.equal(tensor_hash(t, impl="triton"), tensor_hash(t, impl="torch"))


@needs_triton
def test_many_tensors_in_one_launch_read_as_each_in_its_own(small_splits, device):
    # One table launch per tile shape and addressing must give each tensor the row values of its
    # own launch: word sizes 1-8, contiguous rows, one stride per row (a transpose, a strided
    # slice), 2-3 strides, more (read through a copy), split rows, no words, and tensors sharing
    # one output at different offsets, as an arena's chunk holds them; contiguous rows of a
    # multiple of 16 words from a 16-byte aligned address (vector loads on a GPU) and from an
    # address that is not. Each tensor's own launch gives the torch row stage's values.
    from gdn_lab.trace.hashing import _words, as_words, row_values, words_signature, words_view

    tensors = [
        sample(torch.bfloat16, (5, 7), seed=1).to(device),
        sample(torch.float32, (6, 5), seed=2).to(device).t(),
        sample(torch.int64, (9, 3), seed=3).to(device),
        sample(torch.float8_e4m3fn, (4, 33), seed=4).to(device),
        sample(torch.float32, (2, 3000), seed=5).to(device),  # one row block: its columns split over programs
        sample(torch.bool, (7, 2), seed=6).to(device),
        sample(torch.float64, (3, 4), seed=7).to(device)[:, ::2],
        sample(torch.float32, (3, 4, 6), seed=8).to(device)[:, 1:, ::2],  # two strides per row
        sample(torch.float16, (2, 3, 4, 5), seed=9).to(device).permute(0, 3, 1, 2)[:, ::2, :, 1:],
        sample(torch.float32, (2, 2, 3, 4, 5), seed=12).to(device).permute(0, 4, 3, 2, 1),  # four: a copy
        sample(torch.float32, (3, 0), seed=10).to(device),
        sample(torch.int16, (1, 1), seed=11).to(device),
        sample(torch.bfloat16, (5, 32), seed=13).to(device),
        sample(torch.float32, (2, 2048), seed=14).to(device),  # aligned, its columns split over programs
        sample(torch.uint8, (3, 48), seed=15).to(device),
        sample(torch.bfloat16, (65,), seed=16).to(device)[1:].view(4, 16),  # contiguous, 2 bytes past alignment
    ]  # made on the device, then viewed: a copy to the device would drop the strides and offsets
    assert not tensors[6].is_contiguous() and tensors[-1].data_ptr() % 16
    items, want, offset = [], [], 1
    out = torch.zeros(1 + sum(t.shape[0] for t in tensors) + len(tensors), dtype=torch.int64, device=device)
    for t in tensors:
        view, r, f, _, cplx = words_signature(t.dtype, t.shape)
        words = as_words(t, words_view(t.dtype, view, "triton"), cplx)
        alone = torch.zeros(r, dtype=torch.int64, device=device)
        small_splits.row_values_triton(words, r, f, alone)
        ref = torch.zeros(r, dtype=torch.int64, device=device)
        row_values(_words(t, "torch")[0], r, f, "torch", ref)
        assert torch.equal(alone, ref), (t.dtype, tuple(t.shape))
        items.append((words, r, f, out, offset))
        want.append((offset, alone))
        offset += r + 1  # a gap of one row stays zero
    small_splits.row_values_many(items)
    for (offset, alone), t in zip(want, tensors):
        assert torch.equal(out[offset : offset + alone.numel()], alone), (t.dtype, tuple(t.shape))
    gaps = torch.ones_like(out, dtype=torch.bool)
    for offset, alone in want:
        gaps[offset : offset + alone.numel()] = False
    assert not out[gaps].any()


@needs_triton
def test_a_deferring_sink_reads_at_its_flushes_what_it_was_given(monkeypatch, device):
    from gdn_lab.trace import hashing

    monkeypatch.setattr(hashing._Arena, "FLUSH_AT", 4)
    tensors = [sample(dtype, (9, 1 + i % 5), seed=i).to(device) for i, dtype in
               enumerate([torch.float32, torch.bfloat16, torch.int32, torch.float8_e4m3fn] * 3)]  # fmt: skip
    seg, pos = LAYOUT.rows("tokens", torch.device(device))
    now, later = HashSink("triton"), HashSink("triton", defer=True)
    for sink in (now, later):
        for t in tensors:
            sink.add(t, seg=seg, pos=pos, base=sink.slots(3), whole_slot=sink.slots(1))
    assert (now.n_flush, later.n_flush) == (0, 3)  # every 4th read, before the sink is read
    assert later.n_read == now.n_read == len(tensors)
    assert now.read().tolist() == later.read().tolist()

    x = sample(torch.float32, (9, 3), seed=50).to(device)
    stale = HashSink("triton", defer=True)
    stale.add(x, whole_slot=stale.slots(1))
    assert stale.queues_any([x[2:]]) and not stale.queues_any([x.clone()])
    x.add_(1.0)  # a write nothing flushed before: the bits queued are gone
    with pytest.raises(hashing.StaleReadError) as caught:
        stale.flush()
    assert caught.value.tags == [None]


@needs_triton
def test_a_deferring_sink_flushes_at_its_byte_cap_with_the_hashes_read_at_once(monkeypatch, device):
    # The queue keeps its tensors alive: past FLUSH_BYTES of them it flushes, whatever their count.
    from gdn_lab.trace import hashing

    tensors = [sample(torch.float32, (9, 8), seed=i).to(device) for i in range(7)]  # 288 bytes each
    monkeypatch.setattr(hashing._Arena, "FLUSH_AT", 1000)
    monkeypatch.setattr(hashing._Arena, "FLUSH_BYTES", 3 * 288)
    now, later = HashSink("triton"), HashSink("triton", defer=True)
    for sink in (now, later):
        for t in tensors:
            sink.add(t, whole_slot=sink.slots(1))
    assert later.n_flush == 2  # at the 3rd and the 6th read; the 7th waits for the sink's read
    assert now.read().tolist() == later.read().tolist() and later.n_flush == 3

    rows = HashSink("triton", defer=True)  # a one-row view keeps its whole base alive: counted so
    for i in range(3):
        rows.add(tensors[0][i : i + 1], whole_slot=rows.slots(1))
    assert rows.n_flush == 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_request_hashes_the_same_alone_and_at_another_offset(dtype):
    t = sample(dtype, (9, 6))
    batched = row_hashes(t, LAYOUT)
    alone = row_hashes(t[4:9].clone(), Layout.packed([0, 5], request_ids=[12]))
    assert alone[0] == batched[2]
    moved = torch.cat([t[4:9], t[:4]])  # request 12 first this time
    assert row_hashes(moved, Layout.packed([0, 5, 8, 9], request_ids=[12, 10, 11])).tolist() == [
        batched[2].item(),
        batched[0].item(),
        batched[1].item(),
    ]


def test_equal_rows_hash_equal_and_different_rows_differ():
    t = sample(torch.float32, (4, 8))
    t[2:] = t[:2]
    h = row_hashes(t, Layout.packed([0, 2, 4], request_ids=["a", "b"]))
    assert h[0] == h[1]
    t[3, 7] = torch.nextafter(t[3, 7], torch.tensor(float("inf")))  # one ulp
    assert row_hashes(t, Layout.packed([0, 2, 4], request_ids=["a", "b"]))[1] != h[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_a_permutation_changes_the_hash(dtype):
    lay = Layout.per_request([0, 1])
    t = sample(dtype, (2, 16))
    swapped = t.clone()
    swapped[0, [3, 11]] = t[0, [11, 3]]
    assert not torch.equal(t, swapped)
    h, hs = row_hashes(t, lay), row_hashes(swapped, lay)
    assert h[0] != hs[0] and h[1] == hs[1]
    rows = Layout.packed([0, 2], request_ids=[0])  # swapping two token rows of one request
    assert row_hashes(t, rows) != row_hashes(t.flip(0), rows)


def test_signed_zeros_and_nan_payloads_differ():
    lay = Layout.per_request([0])
    zero, neg = torch.zeros(1, 4), torch.zeros(1, 4)
    neg[0, 2] = -0.0
    assert torch.equal(zero, neg)  # equal as numbers ...
    assert row_hashes(zero, lay) != row_hashes(neg, lay)  # ... not as bits
    quiet = torch.full((1, 4), float("nan"))
    payload = quiet.clone()
    payload.view(torch.int32)[0, 1] = 0x7FC00001  # another NaN
    assert torch.isnan(payload).all()
    assert row_hashes(quiet, lay) != row_hashes(payload, lay)


def test_dtype_and_row_shape_are_part_of_the_hash():
    lay = Layout.per_request([0, 1])
    assert row_hashes(torch.zeros(2, 4), lay)[0] != row_hashes(torch.zeros(2, 4, dtype=torch.int32), lay)[0]
    x = torch.arange(12.0).reshape(2, 6)
    assert row_hashes(x.reshape(2, 2, 3), lay)[0] != row_hashes(x.reshape(2, 3, 2), lay)[0]


def test_strides_do_not_matter_and_the_input_is_not_touched():
    t = torch.arange(40, dtype=torch.int64).reshape(5, 8)  # int64: the words are the tensor itself
    before = t.clone()
    lay = Layout.per_request(list(range(8)))
    strided = t.t()  # [8, 5], not contiguous
    assert torch.equal(row_hashes(strided, lay), row_hashes(strided.contiguous(), lay))
    tensor_hash(t)
    assert torch.equal(t, before)


def test_whole_tensor_hash_is_order_sensitive():
    x = sample(torch.float32, (4, 3))
    assert tensor_hash(x) == tensor_hash(x.clone())
    assert tensor_hash(x) != tensor_hash(x.flip(0))
    assert tensor_hash(torch.tensor(1.5)).dim() == 0


def test_sink_sums_many_tensors_into_their_slots():
    sink = HashSink("torch")
    x, y = sample(torch.float32, (9, 4)), sample(torch.bfloat16, (3, 2))
    seg, pos = LAYOUT.rows("tokens", x.device)
    bx = sink.slots(3)
    sink.add(x, seg=seg, pos=pos, base=bx, whole_slot=sink.slots(1))
    wy = sink.slots(1)
    sink.add(y, whole_slot=wy)
    values = sink.read()
    assert values[bx : bx + 3].tolist() == row_hashes(x, LAYOUT).tolist()
    assert values[bx + 3] == tensor_hash(x) and values[wy] == tensor_hash(y)


def test_sink_across_chunks_and_masked_rows(monkeypatch):
    from gdn_lab.trace import hashing

    # every tensor (9 rows) starts a new chunk: the first at least 9 rows, then doubling to 16
    monkeypatch.setattr(hashing._Arena, "FIRST", 4)
    monkeypatch.setattr(hashing._Arena, "LAST", 16)
    sink = HashSink("torch")
    tensors = [sample(torch.float32, (9, 3), seed=i) for i in range(5)]
    seg, pos = LAYOUT.rows("tokens", torch.device("cpu"))
    bases = []
    for t in tensors:
        bases.append(sink.slots(3))
        sink.add(t, seg=seg, pos=pos, base=bases[-1])
    masked = seg.clone()
    masked[4:] = -1  # rows of request 12 dropped: it hashes as if it had no rows
    mb = sink.slots(3)
    sink.add(tensors[0], seg=masked, pos=pos, base=mb)
    values = sink.read()
    assert [c.numel() for c in sink._arenas[torch.device("cpu")].chunks] == [9, 16, 16, 16, 16, 16]
    for t, b in zip(tensors, bases):
        assert values[b : b + 3].tolist() == row_hashes(t, LAYOUT).tolist()
    assert values[mb : mb + 3].tolist() == [*row_hashes(tensors[0], LAYOUT)[:2].tolist(), 0]


def test_sink_with_interleaved_layouts_row_counts_and_empty_tensors():
    # The combine groups uses by their (seg, pos) tables and whole uses by row count: every use
    # must still land in its own slots, whatever the order they were added in.
    sink = HashSink("torch")
    other = Layout.per_request([5, 6, 7, 8])
    cases = []
    for i in range(12):
        layout = LAYOUT if i % 3 else other
        n = layout.num_rows if layout is LAYOUT else 4
        t = sample(torch.float32 if i % 2 else torch.bfloat16, (n, 1 + i % 4), seed=i)
        seg, pos = layout.rows("tokens", t.device)
        base, whole = sink.slots(layout.num_requests), sink.slots(1)
        sink.add(t, seg=seg, pos=pos, base=base, whole_slot=whole)
        loose = sample(torch.float32, (1 + i, 2), seed=100 + i)  # whole only, another row count each time
        loose_slot = sink.slots(1)
        sink.add(loose, whole_slot=loose_slot)
        cases.append((t, layout, base, whole, loose, loose_slot))
    empty_slot = sink.slots(1)
    sink.add(torch.zeros(0, 3), whole_slot=empty_slot)
    values = sink.read()
    for t, layout, base, whole, loose, loose_slot in cases:
        assert values[base : base + layout.num_requests].tolist() == row_hashes(t, layout).tolist()
        assert values[whole] == tensor_hash(t) and values[loose_slot] == tensor_hash(loose)
    assert values[empty_slot] == tensor_hash(torch.zeros(0, 3)) == 0


@pytest.mark.parametrize(
    "t, match",
    [
        pytest.param(torch.zeros(7, 2), "leading dim 7 matches neither", id="unaligned"),
        pytest.param(torch.zeros(9, 2).to_sparse(), "raw bits", id="sparse"),
        pytest.param("x", "torch.Tensor", id="not-a-tensor"),
    ],
)
def test_bad_input_is_rejected(t, match):
    with pytest.raises(ValueError, match=match):
        row_hashes(t, LAYOUT)


def test_bad_impl_is_rejected():
    with pytest.raises(ValueError, match="impl: 'cuda'"):
        row_hashes(torch.zeros(9), LAYOUT, impl="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_no_host_synchronisation_on_the_gpu():
    t = torch.randn(9, 4096, device="cuda", dtype=torch.bfloat16)

    def queued():  # a deferring sink's flush: the table's copy from pinned memory, then the launches
        sink = HashSink("triton", defer=True)
        for x in (t, t[:, :100].t(), t.float(), t.view(9, 64, 64).transpose(1, 2)):
            sink.add(x, whole_slot=sink.slots(1))
        sink.flush()

    for run in (lambda: row_hashes(t, LAYOUT, impl="torch"), lambda: row_hashes(t, LAYOUT, impl="triton"), queued):
        run()  # warm: layout tables, kernel compile, the pinned block
        torch.cuda.set_sync_debug_mode("error")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_collisions_are_absent_on_many_random_rows():
    t = sample(torch.bfloat16, (4096, 8), seed=3)
    h = row_hashes(t, Layout.per_request(list(range(4096))))
    distinct_rows = len({tuple(r) for r in t.view(torch.int16).tolist()})
    assert len(set(h.tolist())) == distinct_rows
    assert math.isclose(distinct_rows, 4096, rel_tol=0.01)
