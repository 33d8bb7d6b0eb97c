"""gdn_lab.testing.assert_batch_invariant: passes an invariant backend, fails a variant one with the
case named, and fails as insensitive when the controls cannot see a difference."""

import pytest

from gdn_lab import routing
from gdn_lab.ops.decode_attention.reference import decode_attention_torch
from gdn_lab.testing import SGLANG_DECODE_CASES, assert_batch_invariant

# The split-KV control's split count follows the batch against the SM count: on the CPU (torch's
# threads as SMs) batches of 2-3 cross it at 300 tokens; an H200's 132 SMs need 8 KV heads and
# batchmates up to 4000 tokens (splits 32 / 16 / 11 at batch 1 / 2 / 3).
CPU_CASE = {"targets": [5, 257], "batch_sizes": [2, 3], "max_context": 300, "kv_dtypes": [None, "fp8"],
            "dtype": "float32", "attention": {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 32, "page_size": 16}}  # fmt: skip
GPU_CASE = {**CPU_CASE, "max_context": 4000, "attention": {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "page_size": 16}}  # fmt: skip


@pytest.fixture
def small(device):
    return [CPU_CASE if device.type == "cpu" else GPU_CASE]


@pytest.fixture
def variant():
    def run(**args):
        return decode_attention_torch(**args) * (1 + 1e-3 * (args["q"].shape[0] - 1))

    routing.register(routing.Backend("decode_attention", "test-variant", run, routing.LIBRARY_TORCH, auto=False))
    yield "test-variant"
    routing._REGISTRY["decode_attention"].pop("test-variant")


def test_the_default_cases_are_sglangs_kernel_test():
    (case,) = SGLANG_DECODE_CASES
    assert case["targets"] == [1, 255, 256, 257, 4000, 12000] and case["batch_sizes"] == [2, 8, 33]
    assert case["max_context"] == 16383 and case["kv_dtypes"] == [None, "fp8"] and case["attention"]["page_size"] == 1


def test_an_invariant_backend_passes(device, small):
    table = assert_batch_invariant("decode_attention", "torch", cases=small, device=device.type)
    assert len(table) == 2 * 2 * 2 and table.bitwise_equal.astype(bool).all()


def test_a_variant_backend_fails_with_the_case_named(variant, device, small):
    with pytest.raises(
        AssertionError,
        match=r"not batch invariant in 8 of 8 comparisons: target 5 tokens, kv .*batch of 2 at position \d: out differs in \d+ elements",
    ):
        assert_batch_invariant("decode_attention", variant, cases=small, device=device.type)


def test_controls_that_see_nothing_fail_as_insensitive(device, small):
    one_token = [{**small[0], "targets": [1], "max_context": 1}]  # one token: every split order is the same
    with pytest.raises(AssertionError, match="insensitive: decode_attention's batch-variant controls"):
        assert_batch_invariant("decode_attention", "torch", cases=one_token, device=device.type)


def test_bad_input_is_a_value_error(device, small):
    with pytest.raises(ValueError, match="backends: 'nope'"):
        assert_batch_invariant("decode_attention", "nope", cases=small, device=device.type)
