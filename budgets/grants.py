"""What the meter answers a model call about to go out: a `Grant`, or `BudgetExhausted`.

`budgets.metering` gives the answer; the brains and the gateway ask (through the `Meter` protocol
of `instances.brains.base`) and act on it. No Django here: a brain imports these without the ORM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class BudgetExhausted(Exception):
    """The run's headroom cannot pay for the next model call, so it was not made.

    The meter raises this one; a brain whose act ends on it raises its own subclass,
    `instances.brains.base.BudgetExhausted`, which also carries what the act spent.
    """

    outcome = "budget_exhausted"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True)
class Grant:
    """A metered call's allowance: the (possibly clamped) `max_tokens` it may ask for."""

    max_tokens: int
    handle: Any = None
