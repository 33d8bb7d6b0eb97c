"""The constants of `gdn_lab.trace.hashing`'s definition, as signed int64 values.

A leaf module, so the torch definition (`hashing`) and the fused Triton row stage (`triton_hash`)
share them without importing each other.
"""

from __future__ import annotations


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


G = _signed(0x9E3779B97F4A7C15)  # column step (the golden ratio, as splitmix64's increment)
S = _signed(0xD6E8FEB86659FD93)  # row-position step (an odd constant from the same family)
M1 = _signed(0xBF58476D1CE4E5B9)  # splitmix64 finalizer multipliers
M2 = _signed(0x94D049BB133111EB)
