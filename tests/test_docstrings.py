"""The runnable examples in the public docstrings run and print what they say.

Every op's public module is found through the op registry, so a new op's docstring is checked
without editing this file.
"""

import doctest
import importlib

import pytest

import gdn_lab.ops
from gdn_lab.ops import spec

MODULES = [
    "gdn_lab.device",
    "gdn_lab.environment",
    "gdn_lab.aiter",
    "gdn_lab.aiter.probe",
    "gdn_lab.aiter.emulation",
    "gdn_lab.ops.spec",
    "gdn_lab.rules.base",
    "gdn_lab.experiments.config",
    "gdn_lab.experiments.model_invariance",
    *[spec.get(op).function.__module__ for op in spec.names()],
    "gdn_lab.trace.layout",
    "gdn_lab.trace.hashing",
    "gdn_lab.trace.record",
    "gdn_lab.trace.diff",
    "gdn_lab.trace.op_views",
    "gdn_lab.model.config",
    "gdn_lab.model.model",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


def test_every_op_module_is_found_through_the_registry():
    assert (
        {spec.get(op).function.__module__ for op in spec.names()} == {f"gdn_lab.ops.{op}" for op in spec.names()}
        and len(spec.names()) >= 8
        and gdn_lab.ops.decode_attention is spec.get("decode_attention").function
    )
