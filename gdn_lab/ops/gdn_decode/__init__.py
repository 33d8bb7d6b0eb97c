"""gdn_decode: one gated-delta-rule step per request, recurrent state updated in place.

The op's folder: this spec, the PyTorch reference (`reference.py`) and one file per library with
its backends (`triton.py`, `fla.py`; AMD's: `aiter.py` HIP, `flydsl.py`, `aiter_triton.py`, and
`sglang.py`, SGLang's routing among those three).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import torch

from gdn_lab import checks
from gdn_lab.ops import spec
from gdn_lab.ops.batch import Batch, BuildOptions, GDNShape, gate_params, gdn_tokens, state_pool
from gdn_lab.ops.gdn_decode import reference
from gdn_lab.ops.gdn_inputs import GDN_TOLERANCES, check_gdn_inputs, check_slot_values, check_slots
from gdn_lab.routing import LIBRARY_TORCH, PRIORITY_REFERENCE, Backend, dispatch, register

OP = "gdn_decode"

# Accepted call signatures -> resolved scale. A decode loop repeats one signature, so the shape
# checks run once per signature and the eager step stays cheap. The key is what those checks read:
# each tensor's shape, dtype and device, the scale and the flag (`_signature`).
_ACCEPTED: dict[tuple, float] = {}
_ACCEPTED_MAX = 1024
# The last accepted (key, scale): every GDN layer of a model shares one signature, so most calls
# match it, and comparing with it skips hashing the key. One tuple, rebound whole: a thread
# reads a key and its scale together.
_LAST: tuple = (None, None)
# Slot tensors whose values were checked: id -> (weak reference, version, data pointer, pool size).
# A decode loop passes the same slots tensor step after step; its values are checked again only
# when it is another tensor, its version counter moved (any in-place torch op on it or a view of
# it), its storage moved, or the pool size changed.
_CHECKED_SLOTS: dict[int, tuple] = {}
_CHECKED_SLOTS_MAX = 256


def _signature(q, k, v, a, b, A_log, dt_bias, state, slots, scale, use_qk_l2norm) -> tuple | None:
    """The shape checks' inputs as one flat key, or None for arguments that are not all tensors.

    Sound for the checks it stands for: they read nothing but these attributes (and the scale and
    flag). A value that is not a tensor has no such attributes (None: the full checks run and
    name it); a numpy array's dtype never equals a torch dtype, so it cannot hit an accepted key.
    The flat tuple is about 3x cheaper than `checks.signature`'s per-value tuples. Not hashed
    here: hashing it costs as much as building it (a tuple does not keep its hash), so the one
    lookup in `validate` is its only hash on the accepted path.
    """
    try:
        return (
            q.shape, q.dtype, q.device, k.shape, k.dtype, k.device, v.shape, v.dtype, v.device,
            a.shape, a.dtype, a.device, b.shape, b.dtype, b.device, A_log.shape, A_log.dtype, A_log.device,
            dt_bias.shape, dt_bias.dtype, dt_bias.device, state.shape, state.dtype, state.device,
            slots.shape, slots.dtype, slots.device, type(scale), scale, type(use_qk_l2norm), use_qk_l2norm,
        )  # fmt: skip
    except AttributeError:
        return None


def _check_slots_once(slots: torch.Tensor, num_slots: int) -> None:
    """`check_slot_values` (one host synchronisation) unless this very tensor, unchanged, passed it.

    Unchanged means: the same tensor object (a weak reference, so a new tensor at a recycled
    address never matches), the same version counter, data pointer and pool size. Values written
    without moving the version counter (a custom kernel storing through the tensor's pointer) are
    not seen: pass such a tensor again after `forget_checked_slots()`. A tensor made under
    `torch.inference_mode` keeps no version counter, so its values are checked at every call.
    """
    try:
        version = slots._version
    except RuntimeError:  # an inference tensor
        check_slot_values(slots, num_slots)
        return
    entry = _CHECKED_SLOTS.get(id(slots))
    if (
        entry is not None
        and entry[0]() is slots
        and entry[1] == version
        and entry[2] == slots.data_ptr()
        and entry[3] == num_slots
    ):
        return
    check_slot_values(slots, num_slots)
    if len(_CHECKED_SLOTS) >= _CHECKED_SLOTS_MAX:
        _CHECKED_SLOTS.clear()
    key = id(slots)

    def forget(ref, key=key):
        if _CHECKED_SLOTS.get(key, (None,))[0] is ref:
            del _CHECKED_SLOTS[key]

    _CHECKED_SLOTS[key] = (weakref.ref(slots, forget), version, slots.data_ptr(), num_slots)


def forget_checked_slots() -> None:
    """Check every slots tensor's values again on its next call (after writes torch cannot see)."""
    _CHECKED_SLOTS.clear()


def validate(
    q, k, v, a, b, A_log, dt_bias, state, slots, *, scale=None, use_qk_l2norm: bool = True, check_indices: bool = True
) -> dict[str, Any]:
    """Check a gdn_decode call; return the arguments every backend's `run` receives.

    Shape/dtype/device checks are skipped for a signature already accepted (`_signature`);
    `check_indices` checks the slot values (one host synchronisation) unless the same slots
    tensor passed unchanged before (`_check_slots_once`).
    """
    global _LAST
    key = _signature(q, k, v, a, b, A_log, dt_bias, state, slots, scale, use_qk_l2norm)
    last = _LAST
    if key is not None and key == last[0]:
        resolved = last[1]
    else:
        try:
            resolved = _ACCEPTED.get(key)  # None for key None (never stored)
        except TypeError:  # an unhashable scale: the full checks name it
            key = resolved = None
        if resolved is not None:
            _LAST = key, resolved
    if resolved is None:
        dims = checks.Dims()
        resolved = check_gdn_inputs(dims, "B", q, k, v, a, b, A_log, dt_bias, state, scale, use_qk_l2norm)
        check_slots(dims, slots, "B", q.device, check_indices=False)
        if key is not None:
            if len(_ACCEPTED) >= _ACCEPTED_MAX:
                _ACCEPTED.clear()
            _ACCEPTED[key] = resolved
            _LAST = key, resolved
    if check_indices is not True and check_indices is not False:
        checks.check_bool("check_indices", check_indices)
    if check_indices:
        _check_slots_once(slots, state.shape[0])
    return {
        "q": q,
        "k": k,
        "v": v,
        "a": a,
        "b": b,
        # checks.dense's contiguous vectors, inlined: this is the eager decode step's host path
        "A_log": A_log.contiguous(),
        "dt_bias": dt_bias.contiguous(),
        "state": state,
        "slots": slots.contiguous(),
        "scale": resolved,
        "use_qk_l2norm": use_qk_l2norm,
    }


def gdn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    backend: str = "auto",
    check_indices: bool = True,
) -> torch.Tensor:
    """One decode step of the gated delta rule for B requests (Qwen3-Next / Qwen3.5 linear attention).

    g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); with S = state[slots[i]] ([HV, V, K]):
    S <- exp(g) S;  S <- S + beta (v - S k) k^T;  o = S q.

    Args:
        q, k: [B, HK, K] bf16/fp16/fp32 (k in q's dtype).
        v: [B, HV, V] in q's dtype; HV must be divisible by HK (value head h reads key head
            h // (HV // HK)).
        a, b: [B, HV], the raw decay and beta projections.
        A_log, dt_bias: [HV].
        state: [num_slots, HV, V, K] float32 ("VK" layout), updated in place.
        slots: int32 [B], each request's state slot (distinct); a negative slot is padding: the row
            is skipped, its output is zeros and no state changes.
        scale: query scale, default K ** -0.5.
        use_qk_l2norm: L2-normalize q and k first (x * rsqrt(sum x^2 + 1e-6)).
        backend: "auto" or a backend name.
        check_indices: check the slot values: in the pool or negative, distinct (one host
            synchronisation the first time a slots tensor is seen, and again whenever its version
            counter moves; see `forget_checked_slots` for writes torch does not track).

    Returns:
        [B, HV, V] in q's dtype.

    Example:
        >>> import torch
        >>> B, HK, HV, K = 2, 1, 2, 16
        >>> q, k, v = torch.randn(B, HK, K), torch.randn(B, HK, K), torch.randn(B, HV, K)
        >>> a, b = torch.randn(B, HV), torch.randn(B, HV)
        >>> state = torch.zeros(4, HV, K, K)
        >>> out = gdn_decode(q, k, v, a, b, torch.zeros(HV), torch.zeros(HV), state,
        ...                  torch.tensor([3, -1], dtype=torch.int32))
        >>> out.shape, bool(out[1].eq(0).all())
        (torch.Size([2, 2, 16]), True)
    """
    args = validate(
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        state,
        slots,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm,
        check_indices=check_indices,
    )
    return dispatch(OP, args, backend)[0]


def example(device="cpu", dtype: torch.dtype = torch.float32, batch: int = 3) -> dict[str, Any]:
    """Validated arguments of a tiny call (HK 2, HV 4, K = V = 32, one padded row)."""
    g = torch.Generator().manual_seed(0)
    hk, hv, d = 2, 4, 32

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    slots = torch.tensor([2 * i for i in range(batch - 1)] + [-1], dtype=torch.int32, device=device)
    state = (0.1 * torch.randn(2 * batch, hv, d, d, generator=g)).to(device)
    return validate(
        rnd(batch, hk, d),
        rnd(batch, hk, d),
        rnd(batch, hv, d),
        rnd(batch, hv),
        rnd(batch, hv),
        torch.randn(hv, generator=g).to(device),
        torch.randn(hv, generator=g).to(device),
        state,
        slots,
    )


def build(batch: Batch, shape: GDNShape, opts: BuildOptions) -> dict[str, Any]:
    """Validated arguments for a batch: one token per request from its own initial state in a shuffled slot."""
    q, k, v, a, b = gdn_tokens(batch, shape, opts, decode=True)
    state, slots = state_pool(batch, shape, opts)
    return validate(q, k, v, a, b, *gate_params(shape, opts), state, slots)


def view(batch: Batch, args: Mapping[str, Any], request: int) -> spec.View:
    """Request `request` owns output row `request` and state slot slots[request]."""
    return spec.View(slice(request, request + 1), int(args["slots"][request]))


SPEC = spec.register(
    spec.OpSpec(
        name=OP,
        function=gdn_decode,
        validate=validate,
        example=example,
        shape=GDNShape,
        build=build,
        outputs=("out",),
        states=("state",),
        view=view,
        tolerances=GDN_TOLERANCES,
        fixed_length=1,
        description="one gated-delta-rule decode step per request, VK state pool updated in place",
    )
)

register(
    Backend(
        OP,
        "torch",
        reference.gdn_decode_torch,
        library=LIBRARY_TORCH,
        priority=PRIORITY_REFERENCE,
        description="the step form per request, fp32 (ground truth)",
    )
)

from gdn_lab.ops.gdn_decode import aiter, aiter_triton, fla, flydsl, sglang, triton  # noqa: E402, F401  (their backends)
