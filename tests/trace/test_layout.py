"""Layout: rows to requests as the caller states them; bad layouts are rejected with the values."""

import pytest
import torch

from gdn_lab.trace import Layout


def test_packed_rows_and_alignment():
    lay = Layout.packed([0, 3, 4, 9], request_ids=["a", 7, "c"])
    assert (lay.kind, lay.num_rows, lay.num_requests) == ("packed", 9, 3)
    assert [lay.index(r) for r in ("a", 7, "c")] == [0, 1, 2]
    assert "a" in lay and "z" not in lay
    assert lay.alignment(torch.zeros(9, 4)) == "tokens"
    assert lay.alignment(torch.zeros(3)) == "requests"
    for other in (torch.zeros(5, 9), torch.zeros(()), torch.zeros(0)):
        assert lay.alignment(other) == "unaligned"
    seg, pos = lay.rows("tokens", torch.device("cpu"))
    assert seg.tolist() == [0, 0, 0, 1, 2, 2, 2, 2, 2]
    assert pos.tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 4]
    seg, pos = lay.rows("requests", torch.device("cpu"))
    assert seg.tolist() == [0, 1, 2] and pos.tolist() == [0, 0, 0]


def test_per_request_and_tensor_cu_seqlens():
    lay = Layout.per_request([5, 6])
    assert (lay.kind, lay.num_rows, lay.num_requests) == ("per_request", 2, 2)
    assert lay.alignment(torch.zeros(2, 8)) == "requests"
    assert lay.alignment(torch.zeros(3, 8)) == "unaligned"
    assert Layout.packed(torch.tensor([0, 2, 5], dtype=torch.int32), [1, 2]).cu_seqlens == (0, 2, 5)


@pytest.mark.parametrize(
    "cu, ids, words",
    [
        pytest.param(
            [0, 3, 2],
            [1, 2],
            ["cu_seqlens", "strictly increasing", "cu_seqlens[2]=2", "cu_seqlens[1]=3"],
            id="non-monotone",
        ),
        pytest.param([0, 3, 3], [1, 2], ["cu_seqlens", "at least one row"], id="empty-request"),
        pytest.param([1, 3], [1], ["cu_seqlens", "start at 0", "got 1"], id="not-from-zero"),
        pytest.param([0], [], ["cu_seqlens", "N + 1 >= 2"], id="no-request"),
        pytest.param([0, 2, 5], [1, 2, 3], ["request_ids", "3 ids for 2 requests"], id="ids-too-many"),
        pytest.param([0, 2, 5], [1, 1], ["request_ids", "duplicate id 1", "positions 0 and 1"], id="ids-duplicate"),
        pytest.param([0, 2, 5], [1, 2.0], ["request_ids", "entry 1", "int or str"], id="ids-float"),
        pytest.param([0, 2, 5], [True, 2], ["request_ids", "entry 0"], id="ids-bool"),
        pytest.param([0, 2.5, 5], [1, 2], ["cu_seqlens", "entry 1"], id="cu-float"),
        pytest.param(torch.tensor([0.0, 2.0]), [1], ["cu_seqlens", "integer"], id="cu-float-tensor"),
        pytest.param([0, 2], "ab", ["request_ids", "sequence"], id="ids-string"),
    ],
)
def test_bad_packed_layout_is_rejected(cu, ids, words):
    with pytest.raises(ValueError) as err:
        Layout.packed(cu, ids)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("ids", [pytest.param([], id="empty"), pytest.param(["x", "x"], id="duplicate")])
def test_bad_per_request_layout_is_rejected(ids):
    with pytest.raises(ValueError, match="request_ids"):
        Layout.per_request(ids)
