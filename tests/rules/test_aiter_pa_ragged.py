"""rules.aiter_pa_ragged: SGLang's deployment constant and a rule that predicts one variant per deployment."""

from __future__ import annotations

import pytest
import torch

from gdn_lab.rules import aiter_pa_ragged as rule
from gdn_lab.rules.base import RuleEnv


def args(batch, fp8=False, page_size=1):
    cache = torch.empty(4, page_size, 2, 16, dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16)
    return {"q": torch.empty(batch, 4, 16), "k_cache": cache, "page_size": page_size}


def test_the_default_is_sglangs_qwen3_8b_deployment():
    d = rule.current_deployment()
    assert (d.max_context, d.max_num_partitions, d.npar_loops, d.token_pages) == (40960, 160, 3, True)


@pytest.mark.parametrize(
    ("max_context", "partitions", "loops"), [(1, 1, 1), (256, 1, 1), (257, 2, 1), (16384, 64, 1), (16385, 65, 2)]
)
def test_partitions_round_up(max_context, partitions, loops):
    d = rule.Deployment(max_context)
    assert (d.max_num_partitions, d.npar_loops) == (partitions, loops)


def test_deployments_nest_and_restore_on_error():
    with rule.deployment(max_context=4096):
        with rule.deployment(max_context=300, token_pages=False):
            assert rule.current_deployment() == rule.Deployment(300, False)
        with pytest.raises(RuntimeError), rule.deployment(max_context=8):
            raise RuntimeError
        assert rule.current_deployment().max_num_partitions == 16
    assert rule.current_deployment() == rule.Deployment()
    with pytest.raises(ValueError, match="max_context"):
        rule.Deployment(0)


def test_one_variant_whatever_the_batch():
    env = RuleEnv("gfx950", 256)
    keys = {rule.RULE.predict(args(b), b - 1, env).key for b in (1, 2, 33, 512)}
    assert keys == {"P=160 npar=3 block=1 kv=auto part=256"}
    assert rule.RULE.predict(args(1, fp8=True), 0, env).key.endswith("kv=fp8_e4m3 part=256")
    with rule.deployment(token_pages=False):
        assert "block=16" in rule.RULE.predict(args(1, page_size=16), 0, env).key
    assert rule.RULE.expect("a", "a") == "equal" and rule.RULE.expect("a", "b") == "switch"
    with pytest.raises(ValueError, match="request"):
        rule.RULE.predict(args(2), 2, env)
