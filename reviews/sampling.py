"""Choose which verified dones a person reviews anyway, so that trust is measured, not assumed.

Pure: no Django, no clock, no I/O. A run is sampled when the SHA-256 of (seed, run id), read as
a number in [0, 1), falls below the sample rate. The same seed and run id always give the same
answer (a run is never sampled by one worker and not by another), and over many runs the share
sampled converges on the rate. The seed is kept secret from agents (it is derived from the
server's secret key), so an agent cannot predict whether its run will be looked at.
"""

from __future__ import annotations

import hashlib
from decimal import Decimal

_SCALE = 2**64
_PERCENT_SCALE = 10_000  # percent with two decimals, as an integer: 12.34 % -> 1234


def score(run_id: int, seed: bytes) -> int:
    """Return the run's sampling score, an integer in [0, 2**64)."""
    digest = hashlib.sha256(seed + b"\x00" + str(int(run_id)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def is_sampled(run_id: int, percent: Decimal | int | str, seed: bytes) -> bool:
    """Return True when run `run_id` falls in the `percent` (0 to 100) sample under `seed`."""
    rate = Decimal(str(percent))
    if rate <= 0:
        return False
    if rate >= 100:
        return True
    threshold = int(rate * 100) * _SCALE // _PERCENT_SCALE
    return score(run_id, seed) < threshold
