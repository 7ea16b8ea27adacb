"""The task broker: django-q2's ORM broker, riding out a cut database connection.

django-q2's pusher treats any error from `dequeue` as a dead broker: it logs "Failed to
pull task from broker", sleeps ten seconds and exits, and its cluster's sentinel starts
a new one ("reincarnated pusher … after sudden death") — a pickup stall of about ten
seconds on every cluster whose connection was cut. Likewise an error from `acknowledge`
kills the monitor. This broker (Q_CLUSTER["broker_class"]) catches the transient errors
(`tether.dbfaults`) instead: the broken connection is closed and the next poll, a moment
later, reconnects. Any other error still reaches django-q2 as before.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django_q.brokers.orm import ORM

from tether import dbfaults

log = logging.getLogger(__name__)

# After a failed poll: long enough not to spin on a server that is down, short enough that
# pickup resumes within a second of the database coming back.
RECONNECT_PAUSE = 0.2


class ORMBroker(ORM):
    def dequeue(self) -> list[tuple[Any, Any]] | None:
        try:
            return super().dequeue()
        except Exception as exc:
            if not dbfaults.is_transient(exc):
                raise
            log.warning("task broker: transient database error (%s); reconnecting on the next poll", exc)
            dbfaults.reset()
            time.sleep(RECONNECT_PAUSE)
            return None

    def acknowledge(self, task_id: Any) -> Any:
        return dbfaults.retry(
            lambda: super(ORMBroker, self).acknowledge(task_id), what="task broker: acknowledge"
        )
