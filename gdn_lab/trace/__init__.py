"""Per-layer hashing: which call changed a request's bits when it was batched.

`record` hashes every module call (and at level="ops" every torch function and gdn_lab op) per
request, stated by a `Layout`; `diff` lines two traces up for one request and `first_culprit`
names the first call whose output changed while all of its inputs were bitwise equal.
"""

from gdn_lab.trace.diff import diff, first_culprit, summarize
from gdn_lab.trace.hashing import row_hashes, tensor_hash
from gdn_lab.trace.layout import Layout
from gdn_lab.trace.record import Entry, TensorRecord, Trace, record

__all__ = [
    "Entry",
    "Layout",
    "TensorRecord",
    "Trace",
    "diff",
    "first_culprit",
    "record",
    "row_hashes",
    "summarize",
    "tensor_hash",
]
