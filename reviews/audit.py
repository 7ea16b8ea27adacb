"""The audit trail: every human action, with who, when, and from which device and interface.

`record` writes one `AuditEntry` in the caller's transaction (an action rolled back leaves no
entry). Call it from the service that carries the action out, with the interface it came in by
(`via`: api, console, cli, admin, mcp) and, when there is one, the request (its user agent and
address are kept). Reads: `audit_for_run`, `audit_for_pool`, `visible_to`; `write_csv` exports.

Actions used by Tether (a dotted noun.verb): run.start, run.interject, run.stop, run.answer,
run.resume, run.close, workspace.rollback, review.accept, review.reject, pool.limit, pool.cap,
pool.create, credential.add, credential.remove, notification.add, notification.remove, trigger.create,
trigger.change, trigger.pause, trigger.resume, trigger.rotate, trigger.delete.
"""

from __future__ import annotations

import csv
import json
import os
import socket
from collections.abc import Iterable
from typing import IO, Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from reviews.models import AuditEntry

CSV_COLUMNS = ("time", "user", "action", "run", "pool", "via", "device", "address", "detail")
USER_AGENT_CHARS = 400


def _cli_device() -> str:
    try:
        login = os.getlogin()
    except OSError:
        login = os.environ.get("USER", "?")
    return f"manage.py on {socket.gethostname()} (user {login}, pid {os.getpid()})"


def record(
    *,
    user: Any,
    action: str,
    run: Any = None,
    pool: Any = None,
    detail: dict[str, Any] | None = None,
    request: Any = None,
    via: str,
) -> AuditEntry:
    """Record one human action; return the entry."""
    if via not in AuditEntry.Via.values:
        raise ValueError(f"unknown interface {via!r}; one of {', '.join(AuditEntry.Via.values)}")
    agent, address = "", None
    if request is not None:
        meta = getattr(request, "META", {})
        agent = str(meta.get("HTTP_USER_AGENT", ""))[:USER_AGENT_CHARS]
        address = meta.get("REMOTE_ADDR") or None
    elif via == AuditEntry.Via.CLI:
        agent = _cli_device()[:USER_AGENT_CHARS]
    authenticated = user is not None and getattr(user, "is_authenticated", False)
    return AuditEntry.objects.create(
        user=user if authenticated else None,
        username=user.get_username() if authenticated else "",
        action=action[:60],
        run=run,
        pool=pool,
        run_ref=getattr(run, "pk", None),
        pool_ref=getattr(pool, "pk", None),
        detail=json.loads(json.dumps(detail or {}, default=str)),
        via=via,
        user_agent=agent,
        ip_address=address,
        created_at=timezone.now(),
    )


def audit_for_run(run: Any) -> QuerySet[AuditEntry]:
    """Return the actions taken on a run, oldest first."""
    return AuditEntry.objects.filter(run_ref=run.pk).select_related("user").order_by("created_at", "id")


def audit_for_pool(pool: Any) -> QuerySet[AuditEntry]:
    """Return the actions taken on a budget pool, oldest first."""
    return AuditEntry.objects.filter(pool_ref=pool.pk).select_related("user").order_by("created_at", "id")


def visible_to(user: Any) -> QuerySet[AuditEntry]:
    """Return the entries `user` may read: all for staff; else their own and those on their runs."""
    entries = AuditEntry.objects.select_related("user").order_by("created_at", "id")
    if getattr(user, "is_staff", False):
        return entries
    return entries.filter(Q(user=user) | Q(run__owner=user) | Q(pool__owner=user))


def write_csv(entries: Iterable[AuditEntry], stream: IO[str]) -> None:
    """Write entries as CSV (a header row, then one row per entry)."""
    writer = csv.writer(stream)
    writer.writerow(CSV_COLUMNS)
    for entry in entries:
        writer.writerow(
            [
                entry.created_at.isoformat(),
                _safe(entry.username),
                _safe(entry.action),
                entry.run_ref or "",
                entry.pool_ref or "",
                entry.via,
                _safe(entry.user_agent),
                entry.ip_address or "",
                _safe(json.dumps(entry.detail, sort_keys=True, ensure_ascii=False)),
            ]
        )


def _safe(text: str) -> str:
    # A cell starting with = + - @ is a formula to a spreadsheet; quote it so it stays text.
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
