"""Layout: how the rows of a batch's tensors map to requests, stated by the caller.

A prefill batch packs the tokens of N requests into T rows (`cu_seqlens`, as SGLang/vLLM varlen); a
decode step has one row per request. A tensor is read through the layout by its leading dim alone:

- leading dim == the layout's token rows: row i belongs to the request whose span holds i
  (`"tokens"`; in a one-row-per-request layout the rows are the requests);
- leading dim == the number of requests (in a packed layout): one row per request (`"requests"`);
- anything else (weights, pools, 0-dim tensors): `"unaligned"`, hashed whole.

Nothing else is inferred from shapes. Requests are named by id, not by position, so the same request
can be compared between two batches where it sits at different rows.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

TOKENS = "tokens"
REQUESTS = "requests"
UNALIGNED = "unaligned"


def _ids(request_ids: Sequence[Hashable], expected: int | None, expected_what: str) -> tuple[int | str, ...]:
    if isinstance(request_ids, (str, bytes)) or not isinstance(request_ids, Sequence):
        raise ValueError(
            f"request_ids: expected a sequence of ints or strs (one per request), got {type(request_ids).__name__}"
        )
    ids = tuple(request_ids)
    if not ids:
        raise ValueError("request_ids: empty; accepted: one id (int or str) per request, at least one request")
    seen: dict[int | str, int] = {}
    for i, r in enumerate(ids):
        if isinstance(r, bool) or not isinstance(r, (int, str)):
            raise ValueError(f"request_ids: entry {i} is {r!r} ({type(r).__name__}); accepted: int or str ids")
        if r in seen:
            raise ValueError(f"request_ids: duplicate id {r!r} at positions {seen[r]} and {i}; accepted: distinct ids")
        seen[r] = i
    if expected is not None and len(ids) != expected:
        raise ValueError(
            f"request_ids: {len(ids)} ids for {expected} requests ({expected_what}); accepted: one id per request"
        )
    return ids


def _host_ints(name: str, values: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            raise ValueError(
                f"{name}: expected a 1-D integer tensor or a sequence of ints, got {values.dtype} of shape {tuple(values.shape)}"
            )
        return [int(v) for v in values.tolist()]  # one host sync, once per layout
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name}: entry {i} is {v!r}; accepted: ints")
        out.append(v)
    return out


@dataclass(frozen=True, eq=False)
class Layout:
    """How rows map to requests: packed tokens (`packed`) or one row per request (`per_request`).

    Build one with `Layout.packed` or `Layout.per_request`; the constructor is not the API.

    Attributes:
        request_ids: the requests, in row order (distinct ints or strs).
        cu_seqlens: packed layouts: the token spans, `(0, end_0, end_1, ..., T)`; None for one row
            per request.

    Example:
        >>> lay = Layout.packed([0, 3, 5], request_ids=["a", "b"])
        >>> lay.num_rows, lay.num_requests, lay.index("b")
        (5, 2, 1)
        >>> import torch
        >>> lay.alignment(torch.zeros(5, 8)), lay.alignment(torch.zeros(2)), lay.alignment(torch.zeros(7))
        ('tokens', 'requests', 'unaligned')
    """

    request_ids: tuple[int | str, ...]
    cu_seqlens: tuple[int, ...] | None = None
    _position: dict = field(default_factory=dict, repr=False)
    _tables: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._position.update({r: i for i, r in enumerate(self.request_ids)})

    @classmethod
    def packed(cls, cu_seqlens: Sequence[int] | torch.Tensor, request_ids: Sequence[int | str]) -> Layout:
        """Token-packed rows (prefill): request i owns rows cu_seqlens[i]:cu_seqlens[i+1].

        Args:
            cu_seqlens: N + 1 ints (or a 1-D integer tensor, read once on the host): 0, then strictly
                increasing span ends; the last is the number of token rows T.
            request_ids: N distinct ids (ints or strs), in row order.

        Raises:
            ValueError: cu_seqlens does not start at 0 or is not strictly increasing, or request_ids
                has the wrong length, duplicates or non-int/str entries.
        """
        cu = _host_ints("cu_seqlens", cu_seqlens)
        if len(cu) < 2:
            raise ValueError(f"cu_seqlens: {cu} has {len(cu)} entries; accepted: N + 1 >= 2 (0, then each span's end)")
        if cu[0] != 0:
            raise ValueError(f"cu_seqlens: must start at 0, got {cu[0]} (in {cu})")
        for i in range(len(cu) - 1):
            if cu[i + 1] <= cu[i]:
                raise ValueError(
                    f"cu_seqlens: must be strictly increasing (every request owns at least one row), but "
                    f"cu_seqlens[{i + 1}]={cu[i + 1]} <= cu_seqlens[{i}]={cu[i]} (in {cu})"
                )
        ids = _ids(request_ids, len(cu) - 1, f"len(cu_seqlens) - 1 = {len(cu) - 1}")
        return cls(ids, tuple(cu))

    @classmethod
    def per_request(cls, request_ids: Sequence[int | str]) -> Layout:
        """One row per request (a decode step): row i is request_ids[i].

        Raises:
            ValueError: request_ids is empty, has duplicates or non-int/str entries.
        """
        return cls(_ids(request_ids, None, ""))

    @property
    def kind(self) -> str:
        """ "packed" or "per_request"."""
        return "per_request" if self.cu_seqlens is None else "packed"

    @property
    def num_requests(self) -> int:
        return len(self.request_ids)

    @property
    def num_rows(self) -> int:
        """Token rows: T for a packed layout, N for one row per request."""
        return self.num_requests if self.cu_seqlens is None else self.cu_seqlens[-1]

    def index(self, request_id: int | str) -> int:
        """The request's position among the layout's requests.

        Raises:
            KeyError: the request is not in this layout.
        """
        return self._position[request_id]

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._position

    def alignment(self, t: torch.Tensor) -> str:
        """How `t`'s rows map to requests: "tokens", "requests" or "unaligned" (by its leading dim only)."""
        if t.dim() == 0:
            return UNALIGNED
        n = t.shape[0]
        if n == self.num_rows:
            return TOKENS if self.cu_seqlens is not None else REQUESTS
        if n == self.num_requests:
            return REQUESTS
        return UNALIGNED

    def rows(self, alignment: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(request index, position within the request) of every row, int64 on `device`, cached.

        For "tokens" there are `num_rows` rows; for "requests" `num_requests`, each at position 0.
        """
        key = (alignment, str(device))
        found = self._tables.get(key)
        if found is not None:
            return found
        if alignment == TOKENS and self.cu_seqlens is not None:
            cu = self.cu_seqlens
            seg = [i for i in range(len(cu) - 1) for _ in range(cu[i + 1] - cu[i])]
            pos = [t - cu[i] for i in range(len(cu) - 1) for t in range(cu[i], cu[i + 1])]
        elif alignment in (TOKENS, REQUESTS):
            seg, pos = list(range(self.num_requests)), [0] * self.num_requests
        else:
            raise ValueError(f"alignment: {alignment!r} has no rows; accepted: {TOKENS!r}, {REQUESTS!r}")
        tables = (
            torch.tensor(seg, dtype=torch.int64, device=device),
            torch.tensor(pos, dtype=torch.int64, device=device),
        )
        self._tables[key] = tables
        return tables
