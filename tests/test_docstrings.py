"""The runnable examples in the public docstrings run and print what they say."""

import doctest
import importlib

import pytest

MODULES = [
    "gdn_lab.device",
    "gdn_lab.ops.attention.decode",
    "gdn_lab.ops.attention.prefill",
    "gdn_lab.ops.gated_delta_rule.decode",
    "gdn_lab.ops.gated_delta_rule.prefill",
    "gdn_lab.ops.gdn_layer.layer_prefill",
    "gdn_lab.ops.gdn_layer.conv_update",
    "gdn_lab.ops.matmul.gemm",
    "gdn_lab.ops.rmsnorm.rmsnorm",
    "gdn_lab.trace.layout",
    "gdn_lab.trace.hashing",
    "gdn_lab.trace.record",
    "gdn_lab.trace.diff",
    "gdn_lab.model.config",
    "gdn_lab.model.model",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
