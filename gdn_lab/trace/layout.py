"""Layout: how the rows of a batch's tensors map to requests, stated by the caller.

A prefill batch packs the tokens of N requests into T rows (`cu_seqlens`, as SGLang/vLLM varlen); a
decode step has one row per request; a Hugging Face batch pads N requests to T tokens ([N, T, ...],
left padding). A tensor is read through the layout by its leading dim alone:

- leading dim == the layout's token rows: row i belongs to the request whose span holds i
  (`"tokens"`; in a one-row-per-request layout the rows are the requests);
- leading dim == the number of requests (in a packed layout): one row per request (`"requests"`);
- anything else (weights, pools, 0-dim tensors): `"unaligned"`, hashed whole.

A padded layout (`Layout.padded`) reads its leading two dims: a tensor [N, T, ...] is request i's
real tokens, its padding left out (`"padded"`: the token rows of t.flatten(0, 1)), so a request
padded inside a batch hashes like the same request alone; [N * T, ...] is the same rows flattened
(`"tokens"`), and other [N, ...] tensors are whole rows (`"requests"`, padding included).

Nothing else is inferred from shapes. Requests are named by id, not by position, so the same request
can be compared between two batches where it sits at different rows.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

TOKENS = "tokens"
REQUESTS = "requests"
PADDED = "padded"  # [N, T, ...] read as the token rows of t.flatten(0, 1), padding left out
UNALIGNED = "unaligned"
SIDES = ("left", "right")


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
    """How rows map to requests: packed tokens (`packed`), one row per request (`per_request`), or
    requests padded to one length (`padded`).

    Build one with `Layout.packed`, `Layout.per_request` or `Layout.padded`; the constructor is not the API.

    Attributes:
        request_ids: the requests, in row order (distinct ints or strs).
        cu_seqlens: packed layouts: the token spans, `(0, end_0, end_1, ..., T)`; None otherwise.
        lengths, side: padded layouts: each request's real tokens and where the padding sits; None otherwise.

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
    lengths: tuple[int, ...] | None = None
    side: str | None = None
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

    @classmethod
    def padded(cls, lengths: Sequence[int], request_ids: Sequence[int | str], side: str = "left") -> Layout:
        """N requests padded to T = max(lengths) tokens ([N, T, ...], a Hugging Face batch).

        Request i's tokens are the last lengths[i] of its T positions (side="left", as batched
        generation pads) or the first (side="right"); the padding is left out of its hashes.

        Args:
            lengths: real tokens per request (positive ints).
            request_ids: N distinct ids (ints or strs), in row order.
            side: "left" or "right".

        Raises:
            ValueError: a length that is not a positive int, ids of the wrong length, or a bad side.

        Example:
            >>> lay = Layout.padded([3, 1], request_ids=["a", "b"])
            >>> lay.num_rows, lay.alignment(torch.zeros(2, 3, 8)), lay.alignment(torch.zeros(2, 4, 3, 8))
            (6, 'padded', 'requests')
        """
        if side not in SIDES:
            raise ValueError(f"side: {side!r} is not accepted; expected one of {', '.join(map(repr, SIDES))}")
        lens = _host_ints("lengths", lengths)
        if not lens or any(n <= 0 for n in lens):
            raise ValueError(f"lengths: expected positive ints, one per request, got {lens}")
        ids = _ids(request_ids, len(lens), f"len(lengths) = {len(lens)}")
        return cls(ids, None, tuple(lens), side)

    @property
    def kind(self) -> str:
        """ "packed", "per_request" or "padded"."""
        if self.lengths is not None:
            return "padded"
        return "per_request" if self.cu_seqlens is None else "packed"

    @property
    def num_requests(self) -> int:
        return len(self.request_ids)

    @property
    def padded_len(self) -> int | None:
        """T of a padded layout (the longest request), else None."""
        return max(self.lengths) if self.lengths is not None else None

    @property
    def num_rows(self) -> int:
        """Token rows: T for a packed layout, N for one row per request, N * T padded."""
        if self.lengths is not None:
            return self.num_requests * max(self.lengths)
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
        """How `t`'s rows map to requests: "tokens", "requests", "padded" or "unaligned" (by its
        leading dim only; a padded layout also reads the second)."""
        return self.alignment_of(t.shape)

    def alignment_of(self, shape: Sequence[int]) -> str:
        """`alignment` of a tensor of this shape."""
        if not shape:
            return UNALIGNED
        n = shape[0]
        if self.lengths is not None:
            if len(shape) >= 2 and n == self.num_requests and shape[1] == self.padded_len:
                return PADDED
            if n == self.num_rows and self.num_rows != self.num_requests:
                return TOKENS
            return REQUESTS if n == self.num_requests else UNALIGNED
        if n == self.num_rows:
            return TOKENS if self.cu_seqlens is not None else REQUESTS
        if n == self.num_requests:
            return REQUESTS
        return UNALIGNED

    def rows(self, alignment: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(request index, position within the request) of every row, int64 on `device`, cached.

        For "tokens" there are `num_rows` rows; for "requests" `num_requests`, each at position 0.
        A padded layout's "tokens" and "padded" rows are the N * T positions of [N, T]: padding rows
        get request index -1 (left out of every hash).
        """
        key = (alignment, device)
        found = self._tables.get(key)
        if found is not None:
            return found
        if alignment in (TOKENS, PADDED) and self.lengths is not None:
            t_pad = max(self.lengths)
            seg, pos = [], []
            for i, n in enumerate(self.lengths):
                first = t_pad - n if self.side == "left" else 0
                for p in range(t_pad):
                    real = first <= p < first + n
                    seg.append(i if real else -1)
                    pos.append(p - first if real else 0)
        elif alignment == TOKENS and self.cu_seqlens is not None:
            cu = self.cu_seqlens
            seg = [i for i in range(len(cu) - 1) for _ in range(cu[i + 1] - cu[i])]
            pos = [t - cu[i] for i in range(len(cu) - 1) for t in range(cu[i], cu[i + 1])]
        elif alignment in (TOKENS, REQUESTS):
            seg, pos = list(range(self.num_requests)), [0] * self.num_requests
        else:
            raise ValueError(
                f"alignment: {alignment!r} has no rows here; accepted: {TOKENS!r}, {REQUESTS!r} ({PADDED!r} in a padded layout)"
            )
        tables = (
            torch.tensor(seg, dtype=torch.int64, device=device),
            torch.tensor(pos, dtype=torch.int64, device=device),
        )
        self._tables[key] = tables
        return tables
