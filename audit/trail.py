"""The audit trail: every person's action that changes what agents may do or spend, with who, when and how.

`record` writes one `AuditEntry` in the caller's transaction (an action rolled back leaves no
entry). Call it from the service that carries the action out, with the interface it came in by
(`via`: api, console, cli, admin, mcp) and, when there is one, the request (its user agent and
address are kept). An entry names what it is on (`run`, `pool`, `instance`) and whose it is
(`owner`: the person whose agent, key, token, pool or account it touched). A change says what
it changed: `detail["before"]` and `detail["after"]` hold the changed fields (`changes`), with
secrets never written (`snapshot`: passwords, stored keys and webhook secrets as `[redacted]`,
an environment's values too, and every known key in any text through `tether.redaction`).
Django admin edits are recorded by one hook, `AuditedAdmin`, mixed into every admin that
edits such a thing. Reads: `audit_for_run`, `audit_for_pool`, `audit_for_instance`,
`audit_for_person`, `visible_to`, `for_page` (what a page shows); `write_csv` exports.

Actions recorded by Tether (a dotted noun.verb; `ACTIONS`, which docs/guide.md lists too):
run.start, run.continue, run.interject, run.answer, run.stop, run.resume, run.close,
review.accept, review.reject, review.reopen,
pool.create, pool.limit, pool.top_up, pool.period_reset, pool.update, pool.cap,
instance.create, instance.update, instance.archive, instance.restore, instance.delete,
template.create, template.update, template.delete,
credential.add, credential.update, credential.remove,
price.create, price.update, price.delete,
mcp_server.create, mcp_server.update, mcp_server.delete,
user.create, user.update, user.delete, group.create, group.update, group.delete (capabilities),
grading.create, grading.update, grading.delete,
token.issue, token.revoke,
signin.locked_out,
notification.add, notification.update, notification.remove,
workspace.rollback,
trigger.create, trigger.change, trigger.pause, trigger.resume, trigger.rotate, trigger.delete,
schedule.create, schedule.change, schedule.pause, schedule.resume, schedule.run_now, schedule.delete.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import socket
from collections.abc import Iterable
from typing import IO, Any

from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet
from django.utils import timezone

from audit.models import AuditEntry
from tether.redaction import redact_data

CSV_COLUMNS = ("time", "user", "action", "run", "pool", "via", "device", "address", "detail")
USER_AGENT_CHARS = 400
PAGE_ENTRIES = 50  # a page shows this many entries, newest first; the CSV has them all
REDACTED = "[redacted]"
# Fields whose value is never written into an entry: a change to one shows as "[redacted] #1a2b3c" -> "[redacted] #4d5e6f".
SECRET_FIELDS = frozenset({"password", "secret_encrypted", "secrets_encrypted", "digest"})
# Fields whose keys are shown but whose values are not (an instance's environment).
SECRET_VALUES = frozenset({"env"})
# Fields that change on every save and say nothing of what a person changed.
NOT_CHANGES = frozenset({"updated_at", "last_login", "last_used_at"})

# Every action recorded (`record` refuses any other); the docstring above and docs/guide.md list the same.
ACTIONS = frozenset(
    {
        *("run.start", "run.continue", "run.interject", "run.answer", "run.stop", "run.resume", "run.close"),
        *("review.accept", "review.reject", "review.reopen"),
        *("pool.create", "pool.limit", "pool.top_up", "pool.period_reset", "pool.update", "pool.cap"),
        *("instance.create", "instance.update", "instance.archive", "instance.restore", "instance.delete"),
        *("template.create", "template.update", "template.delete"),
        *("credential.add", "credential.update", "credential.remove"),
        *("price.create", "price.update", "price.delete"),
        *("mcp_server.create", "mcp_server.update", "mcp_server.delete"),
        *("user.create", "user.update", "user.delete", "group.create", "group.update", "group.delete"),
        *("grading.create", "grading.update", "grading.delete"),
        *("token.issue", "token.revoke", "signin.locked_out"),
        *("notification.add", "notification.update", "notification.remove"),
        "workspace.rollback",
        *("trigger.create", "trigger.change", "trigger.pause", "trigger.resume", "trigger.rotate", "trigger.delete"),
        *("schedule.create", "schedule.change", "schedule.pause", "schedule.resume", "schedule.run_now"),
        "schedule.delete",
    }
)


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
    instance: Any = None,
    owner: Any = None,
    detail: dict[str, Any] | None = None,
    request: Any = None,
    via: str,
) -> AuditEntry:
    """Record one human action; return the entry.

    `owner` defaults to the owner of `instance`, `pool` or `run` (the first given).
    """
    if via not in AuditEntry.Via.values:
        raise ValueError(f"unknown interface {via!r}; one of {', '.join(AuditEntry.Via.values)}")
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: add it to audit.trail.ACTIONS and the docs first")
    agent, address = "", None
    if request is not None:
        meta = getattr(request, "META", {})
        agent = str(meta.get("HTTP_USER_AGENT", ""))[:USER_AGENT_CHARS]
        address = meta.get("REMOTE_ADDR") or None
    elif via == AuditEntry.Via.CLI:
        agent = _cli_device()[:USER_AGENT_CHARS]
    authenticated = user is not None and getattr(user, "is_authenticated", False)
    if owner is None:
        owner_id = next((o.owner_id for o in (instance, pool, run) if getattr(o, "owner_id", None)), None)
    else:
        owner_id = owner.pk
    return AuditEntry.objects.create(
        user=user if authenticated else None,
        username=user.get_username() if authenticated else "",
        action=action[:60],
        run=run,
        pool=pool,
        instance=instance,
        owner_id=owner_id,
        run_ref=getattr(run, "pk", None),
        pool_ref=getattr(pool, "pk", None),
        instance_ref=getattr(instance, "pk", None),
        detail=json.loads(json.dumps(detail or {}, default=str)),
        via=via,
        user_agent=agent,
        ip_address=address,
        created_at=timezone.now(),
    )


def snapshot(obj: Any) -> dict[str, Any]:
    """Return `obj`'s fields as an entry shows them: no secret, foreign keys as ids, many-to-many as names.

    Values pass through `tether.redaction` (a known key pasted into a prompt is not copied here).
    """
    values: dict[str, Any] = {}
    for field in obj._meta.concrete_fields:
        if field.primary_key or field.name in NOT_CHANGES or getattr(field, "auto_now", False):
            continue
        value = getattr(obj, field.attname)
        if field.name in SECRET_FIELDS:
            value = _digest(value) if value else ""
        elif field.name in SECRET_VALUES and isinstance(value, dict):
            value = {name: _digest(item) for name, item in value.items()}
        values[field.name] = value
    if obj.pk is not None:
        for field in obj._meta.many_to_many:
            values[field.name] = sorted(str(related) for related in getattr(obj, field.name).all())
    plain: dict[str, Any] = json.loads(json.dumps(values, default=str))
    return dict(redact_data(plain))


def _digest(value: Any) -> str:
    # Equal values give equal marks, so a changed secret shows as changed without being shown.
    return REDACTED + " #" + hashlib.sha256(f"tether-audit:{value}".encode()).hexdigest()[:6]


def changes(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """Return `{"before": {...}, "after": {...}}` holding only the fields that differ (snapshots)."""
    before, after = before or {}, after or {}
    changed = sorted(name for name in {*before, *after} if before.get(name) != after.get(name))
    return {
        "before": {name: before[name] for name in changed if name in before},
        "after": {name: after[name] for name in changed if name in after},
    }


class AuditedAdmin:
    """A ModelAdmin mixin: each add, change and delete made in the Django admin is recorded (via admin).

    The action is `<audit_noun>.<verb>` with `audit_verbs` (add, change, delete), and the entry's
    detail the fields changed, before and after (`snapshot`), read from the database before the
    save and after the many-to-many fields are saved. Mix it in first: `class X(AuditedAdmin, admin.ModelAdmin)`.
    """

    audit_noun = ""
    audit_verbs = ("create", "update", "delete")

    def save_model(self, request: Any, obj: Any, form: Any, change: bool) -> None:
        before = snapshot(type(obj)._default_manager.get(pk=obj.pk)) if change and obj.pk else None
        super().save_model(request, obj, form, change)  # type: ignore[misc]
        form._audit_before = before

    def save_related(self, request: Any, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)  # type: ignore[misc]
        obj = form.instance
        before = getattr(form, "_audit_before", None)
        found = changes(before, snapshot(obj))
        if change and not found["after"] and not found["before"]:
            return  # saved as it was: nothing changed
        self._audit(request, obj, self.audit_verbs[1] if change else self.audit_verbs[0], found)

    def delete_model(self, request: Any, obj: Any) -> None:
        self._audit(request, obj, self.audit_verbs[2], changes(snapshot(obj), None))
        super().delete_model(request, obj)  # type: ignore[misc]

    def delete_queryset(self, request: Any, queryset: Any) -> None:
        for obj in queryset:
            self._audit(request, obj, self.audit_verbs[2], changes(snapshot(obj), None))
        super().delete_queryset(request, queryset)  # type: ignore[misc]

    def _audit(self, request: Any, obj: Any, verb: str, found: dict[str, Any]) -> None:
        model = type(obj)
        is_user = isinstance(obj, get_user_model())
        record(
            user=request.user,
            action=f"{self.audit_noun or model._meta.model_name}.{verb}",
            instance=obj if model._meta.label == "instances.Instance" else None,
            pool=obj if model._meta.label == "budgets.Pool" else None,
            owner=obj if is_user else getattr(obj, "owner", None),
            detail={model._meta.model_name: obj.pk, "name": str(obj)[:200], **found},
            request=request,
            via=AuditEntry.Via.ADMIN,
        )


def audit_for_run(run: Any) -> QuerySet[AuditEntry]:
    """Return the actions taken on a run, oldest first."""
    return AuditEntry.objects.filter(run_ref=run.pk).select_related("user").order_by("created_at", "id")


def audit_for_pool(pool: Any) -> QuerySet[AuditEntry]:
    """Return the actions taken on a budget pool, oldest first."""
    return AuditEntry.objects.filter(pool_ref=pool.pk).select_related("user").order_by("created_at", "id")


def audit_for_instance(instance: Any) -> QuerySet[AuditEntry]:
    """Return the actions taken on an instance and on its budget pool, newest first."""
    return (
        AuditEntry.objects.filter(
            Q(instance_ref=instance.pk) | Q(pool__kind="instance", pool__instance=instance)
        )
        .select_related("user")
        .order_by("-created_at", "-id")
    )


def _persons(user: Any) -> Q:
    return Q(user=user) | Q(owner=user) | Q(run__owner=user) | Q(pool__owner=user) | Q(instance__owner=user)


def audit_for_person(user: Any) -> QuerySet[AuditEntry]:
    """Return the actions `user` took and those taken on what is theirs, newest first (staff too)."""
    return AuditEntry.objects.filter(_persons(user)).select_related("user").order_by("-created_at", "-id")


def visible_to(user: Any) -> QuerySet[AuditEntry]:
    """Return the entries `user` may read: all for staff; else their own and those on what is theirs."""
    entries = AuditEntry.objects.select_related("user").order_by("created_at", "id")
    if getattr(user, "is_staff", False):
        return entries
    return entries.filter(_persons(user))


def for_page(entries: QuerySet[AuditEntry], user: Any) -> list[AuditEntry]:
    """Return the `entries` `user` may read, newest first, at most PAGE_ENTRIES of them."""
    mine = entries & visible_to(user)
    return list(mine.order_by("-created_at", "-id")[:PAGE_ENTRIES])


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
