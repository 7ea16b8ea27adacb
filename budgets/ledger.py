"""Reserve / settle / release money up a run's pool chain.

Moves money. Placeholder contract until the budgets app lands: every call is a no-op
that grants. Callers run these inside their own short transaction.
"""


class BudgetRefused(Exception):
    """A pool in the run's chain has no room for the reservation."""

    def __init__(self, pool_name: str, detail: str) -> None:
        super().__init__(detail)
        self.pool_name = pool_name
        self.detail = detail


def reserve(*, run, iteration: int, amount: int) -> int | None:
    """Hold `amount` micro-dollars for (run, iteration); return the reservation id."""
    return None


def settle(reservation_id: int | None, *, actual: int) -> None:
    """Close the reservation at the measured cost, refunding the rest."""


def close_abandoned(run) -> None:
    """Settle, conservatively, every reservation a dead driver left held on `run`."""
