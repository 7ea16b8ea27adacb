"""Writes to instances and credentials: the only path the API and the console take to change them.

Each write checks, in order, the fields' shape and bounds (`instances.validation`), what the
user may set (`instances.capabilities.check_instance`), the template (`templates_loader`),
that its workspace nests with no other (`validation.check_workspace_apart`), that its name is
its owner's only one so named and that it can run (`validation.check_saved`) and the model's
price (`instances.prices.ensure_priced`), then saves in one transaction
with an audit entry; a refusal raises `InstanceRefused` (status 403 for a capability, 400
otherwise) and saves nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import trail
from budgets.pricing import UnpricedModel
from instances import capabilities, credentials, prices, templates_loader, validation
from instances.models import AgentTemplate, Credential, Instance
from tether.refusals import Refused

# What a copy takes from its source besides what the template gives (never the workspace).
COPIED = tuple(sorted(templates_loader.OVERRIDABLE - {"workspace", "credential", "credential_id"}))


class InstanceRefused(Refused):
    """A write that was refused; `status` is the HTTP status to answer, `field` the field at fault."""


@contextmanager
def _refusals() -> Iterator[None]:
    """Translate each rule's own exception into InstanceRefused (one place, every write)."""
    try:
        yield
    except capabilities.CapabilityError as exc:
        raise InstanceRefused(str(exc), 403, exc.field) from None
    except validation.InvalidInstance as exc:
        raise InstanceRefused(exc.message, exc.status, exc.field) from None
    except UnpricedModel as exc:
        raise InstanceRefused(str(exc), 400, exc.field) from None
    except templates_loader.TemplateError as exc:
        raise InstanceRefused(str(exc), 400) from None


# What a program brain uses of the tools: `delegate` alone (through its act's MCP endpoint).
PROGRAM_TOOLS = frozenset({"delegate"})


def fit_to_brain(instance: Instance) -> list[str]:
    """Clear on `instance` what its brain does not use; return the fields changed (not saved).

    A program brain keeps no system prompt, of the tools only `delegate`, and no model unless
    its decider calls Claude (the `llm` decider judges with the instance's model).
    """
    if instance.brain != Instance.Brain.COMMAND:
        return []
    changed = []
    unused = ["system_prompt"] if credentials.needs_key(instance) else ["system_prompt", "model"]
    for field in unused:
        if getattr(instance, field):
            setattr(instance, field, "")
            changed.append(field)
    for field in ("tools", "approval_tools"):
        kept = [t for t in (getattr(instance, field) or []) if t in PROGRAM_TOOLS]
        if kept != list(getattr(instance, field) or []):
            setattr(instance, field, kept)
            changed.append(field)
    return changed


def _own_credential(user: Any, credential: Any) -> Credential | None:
    if credential in (None, ""):
        return None
    credential_id = credential.pk if isinstance(credential, Credential) else credential
    found = Credential.objects.filter(pk=credential_id, owner=user).first()
    if found is None:
        raise InstanceRefused(
            f"credential {credential_id} is not one of yours; list yours with GET /v1/credentials", 404, "credential"
        )
    return found


def instance_create(
    *, user: Any, values: dict[str, Any], template: AgentTemplate | str | None = None, via: str = "api",
    request: Any = None,
) -> Instance:
    """Create and return an instance of `user`: from `template` with `values` as overrides, or by hand.

    `values` holds `name` and the fields set (an API body, a console form's cleaned data).
    """
    with _refusals():
        data = validation.validate(values, from_template=template is not None)
        if template is not None:
            template = templates_loader.find(template)
        data = capabilities.check_instance(user, data, template=template)
        name = data.pop("name")
        credential = _own_credential(user, data.pop("credential", None) or data.pop("credential_id", None))
        data.pop("credential_id", None)
        validation.check_saved(Instance(owner=user, name=name), program=False)  # before anything is made
        with transaction.atomic():  # an instance whose model has no price, or that cannot run, is not kept
            if template is not None:
                instance = templates_loader.create_instance(
                    owner=user, template=template, name=name, overrides={**data, "credential": credential}
                )
            else:
                instance = Instance.objects.create(owner=user, name=name, credential=credential, **data)
            validation.check_workspace_apart(instance)  # its default workspace is known once it has an id
            if fitted := fit_to_brain(instance):
                instance.save(update_fields=[*fitted, "updated_at"])
            validation.check_saved(instance, name=False)
            prices.ensure_priced(instance)
            trail.record(
                user=user, action="instance.create", instance=instance, request=request, via=via,
                detail={**_detail(instance), **trail.changes(None, trail.snapshot(instance))},
            )
    return instance


def instance_update(*, instance: Instance, user: Any, values: dict[str, Any], via: str = "api", request: Any = None) -> Instance:
    """Change the fields of `values` that differ on `instance` (its owner's); return it saved.

    The one path of every edit (the API's PATCH, the console's form). Only the fields that
    change are checked against the user's capabilities, so a person without them may edit the
    safe fields of an instance an operator configured further. An archived instance may be
    edited too (it stays archived). A run in flight reads its instance afresh at each
    iteration, so a change reaches it from its next iteration; what the run fixed at its start
    (objective, caps, protected-path fingerprints) stays.
    """
    if instance.owner_id != user.pk:
        raise InstanceRefused(f"instance {instance.pk} not found", 404)
    values = dict(values)
    if "credential_id" in values:  # the API names the credential by id
        values["credential"] = values.pop("credential_id")
    if "credential" in values:
        values["credential"] = _own_credential(user, values["credential"])
    changes = capabilities.changed(instance, list(values), values)
    if not changes:
        return instance
    with _refusals():
        merged = {**{f: getattr(instance, f) for f in (*COPIED, "name", "workspace")}, **changes}
        clean = validation.validate(merged, from_template=True)  # each field's shape and bounds
        changes = capabilities.check_instance(
            user, {f: clean.get(f, value) for f, value in changes.items()}, template=instance.template
        )
        if instance.template_id is None:  # then the agent as a whole: a command brain needs its command
            validation.validate({**merged, **changes})
        with transaction.atomic():
            locked = Instance.objects.select_for_update().get(pk=instance.pk)
            before = trail.snapshot(locked)
            for field, value in changes.items():
                setattr(locked, field, value)
            if "workspace" in changes:
                validation.check_workspace_apart(locked)
            fit_to_brain(locked)
            validation.check_saved(
                locked, name="name" in changes, program=bool({"brain", "command", "workspace"} & set(changes))
            )
            prices.ensure_priced(locked)
            locked.save()
            trail.record(
                user=user, action="instance.update", instance=locked, request=request, via=via,
                detail={"instance": locked.pk, "changed": sorted(changes), **trail.changes(before, trail.snapshot(locked))},
            )
    return locked


def free_name(user: Any, name: str) -> str:
    """Return `name`, or `name 2`, `name 3`…: the first that none of `user`'s instances has (at most 100 characters)."""
    name = name[:100]
    candidate, number = name, 1
    while validation.name_taken(user.pk, candidate):
        number += 1
        suffix = f" {number}"
        candidate = name[: 100 - len(suffix)] + suffix
    return candidate


def copy_values(source: Instance) -> dict[str, Any]:
    """Return the fields a copy of `source` starts with: its own, except its workspace."""
    values = {field: getattr(source, field) for field in COPIED}
    values["credential"] = source.credential if source.credential_id else None
    return values


def instance_duplicate(
    *, source: Instance, user: Any, values: dict[str, Any], via: str = "api", request: Any = None
) -> Instance:
    """Create a copy of `source` (its owner's) with `values` changed; a copy is created like any instance.

    From a template, the copy's overrides are what differs from that template, so the same
    capability rules apply as to a new one; a copy gets its own workspace unless `values` names one.
    """
    if source.owner_id != user.pk:
        raise InstanceRefused(f"instance {source.pk} not found", 404)
    merged = {**copy_values(source), **values}
    template = source.template
    if template is not None:  # overrides: what differs from what a new instance of the template gets
        baseline = {**{f: getattr(Instance(), f) for f in COPIED}, **template.instance_defaults()}
        merged = {k: v for k, v in merged.items() if k in ("name", "credential", "workspace") or baseline.get(k) != v}
    return instance_create(user=user, values=merged, template=template, via=via, request=request)


def instance_archive(*, instance: Instance, user: Any, via: str = "api", request: Any = None) -> Instance:
    """Archive `instance`: it leaves the fleet and starts no new run; its runs and receipts stay.

    Refused while one of its runs is still going (queued, running or waiting): stop it first.
    """
    if instance.owner_id != user.pk:
        raise InstanceRefused(f"instance {instance.pk} not found", 404)
    with transaction.atomic():
        locked = Instance.objects.select_for_update().get(pk=instance.pk)
        if locked.archived_at is not None:
            return locked
        runs = locked.runs  # the reverse relation: instances import nothing of loops
        live = runs.exclude(status=runs.model.Status.FINISHED).count()
        if live:
            runs, them = ("1 run", "it") if live == 1 else (f"{live} runs", "them")
            raise InstanceRefused(
                f"instance {locked.name!r} has {runs} not finished; stop or close {them} first, then archive it", 409
            )
        locked.archived_at = timezone.now()
        locked.save(update_fields=["archived_at"])
        trail.record(
            user=user, action="instance.archive", instance=locked, request=request, via=via,
            detail={"instance": locked.pk, "before": {"archived_at": None}, "after": {"archived_at": str(locked.archived_at)}},
        )
    return locked


def instance_restore(*, instance: Instance, user: Any, via: str = "api", request: Any = None) -> Instance:
    """Bring an archived `instance` back to the fleet."""
    if instance.owner_id != user.pk:
        raise InstanceRefused(f"instance {instance.pk} not found", 404)
    with transaction.atomic():
        locked = Instance.objects.select_for_update().get(pk=instance.pk)
        if locked.archived_at is None:
            return locked
        Instance.objects.filter(pk=instance.pk).update(archived_at=None)
        trail.record(
            user=user, action="instance.restore", instance=locked, request=request, via=via,
            detail={"instance": instance.pk, "before": {"archived_at": str(locked.archived_at)}, "after": {"archived_at": None}},
        )
    instance.refresh_from_db()
    return instance


def credential_add(*, user: Any, label: str, secret: str, via: str = "api", request: Any = None) -> Credential:
    """Store an Anthropic key of `user`, encrypted; only its last four characters are ever shown again."""
    label = (label or "").strip()
    if not label or len(label) > 100:
        raise InstanceRefused(f"label must be 1 to 100 characters; this one is {len(label):,}", 400, "label")
    if why := validation.invisible(label):
        raise InstanceRefused(f"label {why}", 400, "label")
    secret = (secret or "").strip()
    if why := validation.key_problem(secret):
        raise InstanceRefused(why, 400, "secret")
    if Credential.objects.filter(owner=user, label=label).exists():
        raise InstanceRefused(f"you already have a credential labelled {label!r}; choose another label", 409, "label")
    try:
        with transaction.atomic():
            credential = Credential.create_for(user, label=label, secret=secret)
            trail.record(
                user=user, action="credential.add", request=request, via=via,
                owner=user, detail={"credential": credential.pk, "label": credential.label, "last4": credential.last4,
                                    **trail.changes(None, trail.snapshot(credential))},
            )
    except IntegrityError:
        raise InstanceRefused(f"you already have a credential labelled {label!r}; choose another label", 409, "label") from None
    except ValueError as exc:
        raise InstanceRefused(str(exc), 400, "secret") from None
    return credential


def credential_remove(*, user: Any, credential_id: int, via: str = "api", request: Any = None) -> Credential | None:
    """Delete `user`'s credential `credential_id`; return it (None when they have no such one)."""
    with transaction.atomic():
        credential = Credential.objects.filter(owner=user, pk=credential_id).first()
        if credential is None:
            return None
        credential.delete()
        trail.record(user=user, action="credential.remove", owner=user, request=request, via=via,
                     detail={"credential": credential_id, **trail.changes(trail.snapshot(credential), None)})
    return credential


def _detail(instance: Instance) -> dict[str, Any]:
    return {"instance": instance.pk, "name": instance.name, "template": instance.template.name if instance.template_id else None}
