"""Retrying a whole ledger transaction on a deadlock, serialization failure or busy database."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from django.db import OperationalError, connection, transaction

log = logging.getLogger(__name__)


def atomic_with_retry[T](
    work: Callable[[], T],
    *,
    attempts: int = 10,
    backoff: float = 0.005,
    on_retry: Callable[[OperationalError], None] | None = None,
) -> T:
    """Run `work()` in its own transaction, retrying it on a deadlock, serialization failure or busy database.

    For callers that own the whole transaction (workers, scripts, benchmarks); it cannot be
    used inside an `atomic()` block, because a failed statement spoils the outer transaction.
    """
    if connection.in_atomic_block:
        raise RuntimeError("atomic_with_retry must own the transaction; call it outside atomic()")
    for attempt in range(1, attempts + 1):
        try:
            with transaction.atomic():
                return work()
        except OperationalError as error:
            if attempt == attempts:
                raise
            log.info("ledger transaction retried after %s (attempt %d)", error, attempt)
            if on_retry is not None:
                on_retry(error)
            time.sleep(backoff * (2 ** (attempt - 1)) * (0.5 + random.random()))
    raise AssertionError("unreachable")
