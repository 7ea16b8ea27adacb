"""What people do to triggers (create, change, rotate, delete) and what a delivery to a hook does.

The API, the console and the admin call these. A trigger belongs to its instance's owner: every
writer is handed a trigger or instance the caller owns (the selectors find them), and records
the action in the audit trail. `receive` handles one request to `POST /v1/hooks/<id>`: it checks
the size, the signature, the content and the delivery id, keeps the delivery, and starts at
most one run per delivery id through `loops.services.run_start`, the one way runs start. The
payload fills the objective and nothing else: the instance, its tools, workspace and budget, and
the run's caps are the trigger's and the instance's own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from audit import trail
from budgets import money
from loops import objective_template, selectors, services
from loops.models import Run
from tether import redaction
from tether.limits import (
    DELIVERIES_KEPT,
    DELIVERY_EXCERPT_CHARS,
    DELIVERY_ID_MAX_CHARS,
    HOOK_BODY_MAX_BYTES,
    HOOK_RATE_DEFAULT,
    OBJECTIVE_MAX_CHARS,
)
from tether.refusals import Refused
from tether.schema import UNSTORABLE
from triggers import signatures
from triggers.models import Delivery, Schedule, Trigger
from web.rest import ApiError, read_json

DELIVERY_HEADERS = ("X-GitHub-Delivery", "X-Tether-Delivery")
EVENT_HEADERS = ("X-GitHub-Event", "X-Tether-Event")
# Headers never kept with a delivery: whatever authenticates a request or could carry a secret.
_SECRET_HEADER = re.compile(r"authorization|cookie|signature|secret|token|key|password", re.IGNORECASE)
_DELIVERY_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{DELIVERY_ID_MAX_CHARS}}}")
HEADER_VALUE_CHARS = 500
HEADERS_KEPT = 50


class TriggerRefused(Refused):
    """A change the service will not make; `message` says what to do instead."""


# --- people's changes -------------------------------------------------------------------------------


def check_instance(user: Any, instance: Any) -> None:
    """Refuse a trigger or schedule on an instance that is not `user`'s (404) or is archived (409)."""
    if instance.owner_id != user.pk:
        raise TriggerRefused(f"instance {instance.pk} not found", 404)
    if instance.archived_at is not None:
        raise TriggerRefused(f"instance {instance.name!r} is archived: it starts no new runs", 409)


def owned[Item: (Trigger, Schedule)](model: type[Item], user: Any, item_id: int, **where: Any) -> Item | None:
    """The trigger or schedule `item_id` if it is `user`'s (and matches `where`), else None: every surface's lookup."""
    return model.objects.select_related("instance").filter(owner=user, pk=item_id, **where).first()


def of_instance[Item: (Trigger, Schedule)](model: type[Item], user: Any, instance: Any) -> QuerySet[Item]:
    """`user`'s triggers or schedules of `instance`: every surface's listing."""
    return model.objects.filter(instance=instance, owner=user)


def set_active(change: Callable[..., Any], user: Any, item: Trigger | Schedule, active: bool, **how: Any) -> Any:
    """Pause (or resume) `user`'s trigger or schedule through its service's `change` (`how`: via, request)."""
    return change(user=user, changes={"active": active}, **{item._meta.model_name: item}, **how)


def delete_with(delete: Callable[..., Any], user: Any, item: Trigger | Schedule, **how: Any) -> dict[str, int]:
    """Delete `user`'s trigger or schedule through its service's `delete` (`how`: via, request); say which."""
    item_id = item.pk
    delete(user=user, **{item._meta.model_name: item}, **how)
    return {"deleted": item_id}


def check_owner(user: Any, item: Trigger | Schedule) -> None:
    """Refuse a change to a trigger or schedule that is not `user`'s: it reads as not found (404)."""
    if item.owner_id != user.pk:
        raise TriggerRefused(f"{item._meta.model_name} {item.pk} not found", 404)


def detail(item: Trigger | Schedule, **more: Any) -> dict[str, Any]:
    """The audit detail of a trigger or schedule: which one, its instance and its name, then `more`."""
    return {item._meta.model_name: item.pk, "instance": item.instance_id, "name": item.name, **more}


def shown(changed: Mapping[str, Any]) -> dict[str, Any]:
    """A change as the audit trail keeps it: text cut to 500 characters, times in ISO 8601."""
    return {
        k: (v[:500] if isinstance(v, str) else v.isoformat() if isinstance(v, datetime) else v)
        for k, v in changed.items()
    }


def save_created(user: Any, item: Trigger | Schedule, via: str, request: Any, **more: Any) -> None:
    """Save a new trigger or schedule and record its creation (its `detail`, then `more`), in one transaction."""
    with transaction.atomic():
        item.save()  # first: the audit detail names it by its new id
        audited = detail(item, **more)
        trail.record(user=user, action=f"{item._meta.model_name}.create", request=request, via=via, detail=audited)


def save_changed[Item: (Trigger, Schedule)](
    user: Any,
    item: Item,
    changed: dict[str, Any],
    via: str,
    request: Any,
    then: Callable[[Item], None] | None = None,
) -> None:
    """Store `changed` on `user`'s trigger or schedule, reload it, run `then` on it, and audit the change: one
    transaction."""
    with transaction.atomic():
        type(item).objects.filter(pk=item.pk).update(**changed)
        item.refresh_from_db()
        if then is not None:
            then(item)
        trail.record(
            user=user,
            action=change_action(item, changed),
            request=request,
            via=via,
            detail=detail(item, changed=shown(changed)),
        )


def delete_owned(user: Any, item: Trigger | Schedule, via: str, request: Any) -> None:
    """Delete `user`'s trigger or schedule (its deliveries or firings go with it; its runs stay), audited."""
    check_owner(user, item)
    audited = detail(item)
    with transaction.atomic():
        item.delete()
        trail.record(user=user, action=f"{item._meta.model_name}.delete", request=request, via=via, detail=audited)


def checked_template(template: str) -> str:
    template = template.replace("\r\n", "\n").strip()
    try:
        objective_template.fields(template)
    except objective_template.TemplateError as exc:
        raise TriggerRefused(f"objective_template: {exc.message}", 400, "objective_template") from None
    return template


def cap(value: Any) -> int | None:
    return None if value in (None, "") else money.usd_to_micros(value, exact=True)


def cap_usd(source: Trigger | Schedule) -> str | None:
    """A trigger's or schedule's cap on each run's cost, in dollars as the API writes them (None: no cap)."""
    return None if source.max_cost_micros is None else money.usd_string(source.max_cost_micros)


def stored(name: str, value: Any) -> Any:
    """A trigger's or schedule's changed field as it is kept: the objective template checked, the name stripped."""
    if name == "objective_template":
        return checked_template(value)
    if name == "name":
        return value.strip()
    return value


def source_fields(
    user: Any, instance: Any, name: str, objective_template: str, max_iterations: int | None, max_cost_usd: Any
) -> dict[str, Any]:
    """What a new trigger or schedule stores of what both start runs with: the caller's instance, the name
    stripped, the objective template checked, the run's caps (the cost in micros)."""
    return {
        "instance": instance,
        "owner": user,
        "name": name.strip(),
        "objective_template": checked_template(objective_template),
        "max_iterations": max_iterations,
        "max_cost_micros": cap(max_cost_usd),
    }


def changed_cap(item: Trigger | Schedule, changes: Mapping[str, Any], changed: dict[str, Any]) -> None:
    """Add the cost cap to `changed` when `changes` gives one other than `item`'s."""
    if changes.get("max_cost_usd") is not None:
        micros = cap(changes["max_cost_usd"])
        if micros != item.max_cost_micros:
            changed["max_cost_micros"] = micros


def change_action(item: Trigger | Schedule, changed: Mapping[str, Any]) -> str:
    """The audit action of a change: a pause or a resume when only `active` changed."""
    noun = item._meta.model_name
    if set(changed) == {"active"}:
        return f"{noun}.resume" if changed["active"] else f"{noun}.pause"
    return f"{noun}.change"


def trigger_create(
    *,
    user: Any,
    instance: Any,
    name: str,
    objective_template: str,
    events: list[str] | None = None,
    actions: list[str] | None = None,
    max_iterations: int | None = None,
    max_cost_usd: Any = None,
    max_per_minute: int | None = None,
    via: str = "api",
    request: Any = None,
) -> tuple[Trigger, str]:
    """Create a trigger on `user`'s `instance`; return it and its secret (shown this once)."""
    check_instance(user, instance)
    trigger = Trigger(
        **source_fields(user, instance, name, objective_template, max_iterations, max_cost_usd),
        events=list(dict.fromkeys(events or [])),
        actions=list(dict.fromkeys(actions or [])),
        max_per_minute=max_per_minute or HOOK_RATE_DEFAULT,
    )
    secret = trigger.new_secret()
    save_created(user, trigger, via, request, objective_template=trigger.objective_template[:500])
    return trigger, secret


CHANGEABLE = ("name", "objective_template", "events", "actions", "max_iterations", "max_per_minute", "active")


def trigger_change(
    *, user: Any, trigger: Trigger, changes: Mapping[str, Any], via: str = "api", request: Any = None
) -> Trigger:
    """Change `user`'s trigger: the fields in `changes` (None leaves a field as it is); `active` False pauses it."""
    check_owner(user, trigger)
    changed: dict[str, Any] = {}
    for name in CHANGEABLE:
        value = changes.get(name)
        if value is None:
            continue
        value = list(dict.fromkeys(value)) if name in ("events", "actions") else stored(name, value)
        if getattr(trigger, name) != value:
            changed[name] = value
    changed_cap(trigger, changes, changed)
    if changed:
        save_changed(user, trigger, changed, via, request)
    return trigger


def trigger_rotate(*, user: Any, trigger: Trigger, via: str = "api", request: Any = None) -> str:
    """Give `user`'s trigger a new secret (the old one stops working at once); return it, to show once."""
    check_owner(user, trigger)
    secret = trigger.new_secret()
    with transaction.atomic():
        trigger.save(update_fields=["secret_encrypted", "secret_set_at"])
        trail.record(user=user, action="trigger.rotate", request=request, via=via, detail=detail(trigger))
    return secret


def trigger_delete(*, user: Any, trigger: Trigger, via: str = "api", request: Any = None) -> None:
    """Delete `user`'s trigger and its deliveries (the runs it started stay)."""
    delete_owned(user, trigger, via, request)


def start_run(source: Trigger | Schedule, objective: str, origin: services.Origin) -> Run:
    """Start the run a trigger's delivery or a schedule's firing asks for: its owner's, within its own bounds
    (a refusal is `loops.services.Refused`)."""
    with transaction.atomic():
        return services.run_start(
            instance=source.instance,
            user=source.owner,
            objective=objective,
            max_iterations=source.max_iterations,
            max_cost_usd=cap_usd(source),
            via="system",
            origin=origin,
        )


def render_objective(source: Trigger | Schedule, data: Any) -> str:
    """Fill the trigger's or schedule's objective template from `data`, within its instance's objective bound
    (`objective_template.TemplateError` when it cannot be filled)."""
    limit = min(source.instance.objective_max_chars, OBJECTIVE_MAX_CHARS)
    return objective_template.render(source.objective_template, data, max_chars=limit)


def keep_newest(rows: QuerySet[Any], kept: int) -> None:
    """Forget all but the first `kept` of `rows` (a trigger's deliveries or a schedule's firings, newest first)."""
    stale = rows.values_list("pk", flat=True)[kept:]
    rows.model.objects.filter(pk__in=list(stale)).delete()


# --- a delivery ---------------------------------------------------------------------------------------


@dataclass
class Answer:
    """What the hook answers: a status and a JSON body (an error has `error`)."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Request:
    trigger: Trigger
    headers: Mapping[str, str]
    body: bytes
    body_bytes: int
    delivery_id: str = ""
    event: str = ""


def _first(headers: Mapping[str, str], names: tuple[str, ...]) -> str:
    return next((str(headers[name]) for name in names if headers.get(name)), "")


def _kept_headers(headers: Mapping[str, str], secret: str) -> dict[str, str]:
    kept: dict[str, str] = {}
    for name, value in headers.items():
        if _SECRET_HEADER.search(name) or len(kept) >= HEADERS_KEPT:
            continue
        kept[name] = _clean(str(value), secret)[:HEADER_VALUE_CHARS]
    return kept


def _clean(text: str, secret: str) -> str:
    if secret:
        text = text.replace(secret, "[secret]")
    return UNSTORABLE.sub("\ufffd", text)


def _keep(asked: _Request, outcome: str, status: int, reason: str = "", run: Run | None = None) -> Delivery:
    """Record the delivery (within the caller's transaction, if any) and forget the oldest beyond DELIVERIES_KEPT."""
    try:
        secret = asked.trigger.reveal()
    except ValueError:
        secret = ""
    excerpt = asked.body[: DELIVERY_EXCERPT_CHARS * 4].decode("utf-8", errors="replace")[
        :DELIVERY_EXCERPT_CHARS
    ]
    delivery = Delivery.objects.create(
        trigger=asked.trigger,
        delivery_id=asked.delivery_id if _DELIVERY_ID.fullmatch(asked.delivery_id) else "",
        event=_clean(asked.event, secret)[:100],
        received_at=timezone.now(),
        outcome=outcome,
        status=status,
        reason=_clean(reason, secret),
        headers=_kept_headers(asked.headers, secret),
        body_excerpt=_clean(excerpt, secret),
        body_bytes=asked.body_bytes,
        run=run,
    )
    keep_newest(Delivery.objects.filter(trigger=asked.trigger), DELIVERIES_KEPT)
    return delivery


def _refuse(asked: _Request, status: int, reason: str) -> Answer:
    delivery = _keep(asked, Delivery.Outcome.REFUSED, status, reason)
    return Answer(status, {"error": reason, "delivery": delivery.pk})


def _refuse_start(asked: _Request, exc: services.Refused) -> Answer:
    """Refuse a delivery whose run `loops.services` will not start (its server-side refusals read as 409)."""
    return _refuse(asked, exc.status if exc.status < 500 else 409, exc.message)


def _run_answer(run: Run) -> dict[str, Any]:
    return selectors.run_json(run, ("id", "instance", "status", "outcome"))


def receive(
    *, trigger_id: int, headers: Mapping[str, str], body: bytes | None, body_bytes: int, content_type: str
) -> Answer:
    """Handle one request to a trigger's hook; `body` is None when it is over HOOK_BODY_MAX_BYTES.

    Refusals are kept and answered as 4xx JSON; no refusal starts a run. A delivery whose id
    already started a run starts nothing and answers with that run.
    """
    trigger = Trigger.objects.select_related("instance", "owner").filter(pk=trigger_id).first()
    if trigger is None:
        return Answer(404, {"error": f"no trigger {trigger_id}"})
    asked = _Request(
        trigger,
        headers,
        body or b"",
        body_bytes,
        _first(headers, DELIVERY_HEADERS).strip(),
        _first(headers, EVENT_HEADERS).strip(),
    )
    if body is None:
        return _refuse(
            asked, 413, f"the body is {body_bytes:,} bytes; a trigger takes at most {HOOK_BODY_MAX_BYTES:,}"
        )
    try:
        secret = trigger.reveal()
    except ValueError:
        return _refuse(asked, 409, "the trigger's secret cannot be read with this server's key: rotate it")
    if why := signatures.problem(secret, body, headers):
        return _refuse(asked, 401, why)
    # Signed by someone holding the secret: from here on the delivery is the sender's word.
    if not trigger.active:
        return _refuse(asked, 409, f"trigger {trigger.pk} is paused; resume it to start runs again")
    if not asked.delivery_id:
        return _refuse(
            asked, 400, f"the delivery has no id: send {DELIVERY_HEADERS[0]} or {DELIVERY_HEADERS[1]}"
        )
    if not _DELIVERY_ID.fullmatch(asked.delivery_id):
        return _refuse(
            asked,
            400,
            f"the delivery id must be 1 to {DELIVERY_ID_MAX_CHARS} letters, digits, '.', '_', ':' or '-'",
        )
    try:
        payload = read_json(content_type, body, required=True)
    except ApiError as exc:
        return _refuse(asked, exc.status, exc.message)
    if first := _started(trigger, asked.delivery_id):
        return _repeated(asked, first)
    if asked.event == "ping":
        delivery = _keep(
            asked, Delivery.Outcome.IGNORED, 200, "ping: the hook is reachable and the signature is good"
        )
        return Answer(200, {"delivery": delivery.pk, "outcome": "ignored", "pong": True})
    if ignored := _not_answered(trigger, asked.event, payload):
        delivery = _keep(asked, Delivery.Outcome.IGNORED, 202, ignored)
        return Answer(202, {"delivery": delivery.pk, "outcome": "ignored", "reason": ignored})
    try:
        objective = render_objective(trigger, payload)
    except objective_template.TemplateError as exc:
        return _refuse(
            asked, 400, f"the objective template cannot be filled from this payload: {exc.message}"
        )
    # A sender that echoes a key or the trigger's own secret in its payload does not get it into a run.
    objective = redaction.redact(objective, extra=(secret,))
    if UNSTORABLE.search(objective):
        return _refuse(asked, 400, "the payload fills the objective with a NUL character or a lone surrogate")
    return _start(asked, objective)


def _started(trigger: Trigger, delivery_id: str) -> Delivery | None:
    return (
        Delivery.objects.filter(trigger=trigger, delivery_id=delivery_id, outcome=Delivery.Outcome.STARTED)
        .select_related("run")
        .first()
    )


def _repeated(asked: _Request, first: Delivery) -> Answer:
    reason = (
        f"delivery {asked.delivery_id} already started run {first.run_id}; this redelivery starts nothing"
    )
    delivery = _keep(asked, Delivery.Outcome.REPEATED, 200, reason, run=first.run)
    body: dict[str, Any] = {"delivery": delivery.pk, "outcome": "repeated", "first_delivery": first.pk}
    body["run"] = _run_answer(first.run) if first.run is not None else None
    return Answer(200, body)


def _not_answered(trigger: Trigger, event: str, payload: Any) -> str:
    if trigger.events and event not in trigger.events:
        return f"event {event or '(none)'!r} is not one of {', '.join(trigger.events)}"
    action = payload.get("action") if isinstance(payload, dict) else None
    if trigger.actions and action not in trigger.actions:
        return f"action {action!r} is not one of {', '.join(trigger.actions)}"
    return ""


def _start(asked: _Request, objective: str) -> Answer:
    """Start the run and keep the delivery in one transaction: one run per delivery id, under the rate limit."""
    trigger = asked.trigger
    try:
        services.ensure_startable(trigger.instance)  # outside the transaction: it may probe the sandbox
    except services.Refused as exc:
        return _refuse_start(asked, exc)
    origin = services.Origin(Run.Origin.TRIGGER, {"trigger": trigger.pk, "delivery": asked.delivery_id})
    try:
        with transaction.atomic():
            Trigger.objects.select_for_update().filter(
                pk=trigger.pk
            ).first()  # one delivery of a trigger at a time
            if first := _started(trigger, asked.delivery_id):
                return _repeated(asked, first)
            recent = Delivery.objects.filter(
                trigger=trigger,
                outcome=Delivery.Outcome.STARTED,
                received_at__gte=timezone.now() - timedelta(minutes=1),
            ).count()
            if recent >= trigger.max_per_minute:
                return _refuse(
                    asked,
                    429,
                    f"trigger {trigger.pk} started {recent} runs in the last minute, its limit; try again later",
                )
            try:
                run = start_run(trigger, objective, origin)
            except services.Refused as exc:
                return _refuse_start(asked, exc)
            delivery = _keep(asked, Delivery.Outcome.STARTED, 201, f"started run {run.pk}", run=run)
    except IntegrityError:  # the same delivery raced this one to the unique key: that one started the run
        first = _started(trigger, asked.delivery_id)
        if first is None:
            raise
        return _repeated(asked, first)
    return Answer(201, {"delivery": delivery.pk, "outcome": "started", "run": _run_answer(run)})
