"""What gdn_decode and gdn_prefill share: input validation and the closeness to their torch references."""

from __future__ import annotations

import torch

from gdn_lab import checks
from gdn_lab.ops.spec import Tolerance

# |x - torch| <= atol + rtol * |torch| against the float32 torch reference, by compute dtype: the
# output is rounded once to the input dtype (a bf16/fp16 ulp of the largest values); the float32
# state of the recurrent step only differs by the order of float32 operations.
OUT_BOUNDS = {"float32": (2e-5, 1e-4), "float16": (2e-3, 2e-3), "bfloat16": (1.6e-2, 1.6e-2)}
GDN_TOLERANCES = {
    **{("torch", "out", dt): Tolerance("allclose", atol=a, rtol=r) for dt, (a, r) in OUT_BOUNDS.items()},
    **{("torch", "state", dt): Tolerance("allclose", atol=2e-5, rtol=1e-4) for dt in OUT_BOUNDS},
}


def check_gdn_inputs(dims: checks.Dims, lead: str, q, k, v, a, b, A_log, dt_bias, state, scale, use_qk_l2norm) -> float:
    """Check q/k/v/a/b (leading dim `lead`), the gate parameters and the state pool.

    Returns the resolved scale (K ** -0.5 by default).
    """
    checks.check_tensor("q", q, f"{lead} HK K", dims, checks.FLOAT_DTYPES)
    dev = q.device
    checks.check_tensor("k", k, f"{lead} HK K", dims, (q.dtype,), dev)
    checks.check_tensor("v", v, f"{lead} HV V", dims, (q.dtype,), dev)
    checks.check_divides("HK", dims["HK"], "HV", dims["HV"])
    checks.check_tensor("a", a, f"{lead} HV", dims, checks.FLOAT_DTYPES, dev)
    checks.check_tensor("b", b, f"{lead} HV", dims, checks.FLOAT_DTYPES, dev)
    checks.check_tensor("A_log", A_log, "HV", dims, checks.FLOAT_DTYPES, dev)
    checks.check_tensor("dt_bias", dt_bias, "HV", dims, checks.FLOAT_DTYPES, dev)
    checks.check_tensor("state", state, "S HV V K", dims, (torch.float32,), dev)
    checks.check_bool("use_qk_l2norm", use_qk_l2norm)
    checks.check_positive_float("scale", scale, none="head_dim ** -0.5")
    return float(dims["K"] ** -0.5 if scale is None else scale)


def check_slots(dims: checks.Dims, slots, lead: str, device: torch.device, check_indices: bool) -> None:
    """slots: int32 [lead], distinct, inside the pool or negative (padding)."""
    checks.check_tensor("slots", slots, lead, dims, (torch.int32,), device)
    if check_indices:
        check_slot_values(slots, dims["S"])


def check_slot_values(slots: torch.Tensor, num_slots: int) -> None:
    """Slot values: inside the pool of `num_slots` or negative (padding), and distinct (host sync)."""
    checks.check_index_range("slots", slots, num_slots, "state.shape[0] (slots in the pool)", allow_negative=True)
    checks.check_distinct("slots", slots)


def check_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> list[int]:
    """cu_seqlens values: 0, strictly increasing, ending at `total` tokens. Returns them on the host."""
    cu = checks.host_ints(cu_seqlens)
    checks.check_prefix_sums("cu_seqlens", cu, total, "the number of tokens T")
    checks.check_lengths_positive("cu_seqlens (sequence lengths)", [e - s for s, e in zip(cu, cu[1:])])
    return cu
