"""Check an instance's fields against their one schema, for every surface that writes one (API, console).

The fields, their types and bounds are `instances.schemas.InstanceIn` (the same schema the
API parses and documents); this module applies it to values a form or a service holds and
raises `InvalidInstance` naming the field. What a user may set at all is
`instances.capabilities`; whether its model has a price is `instances.prices`.

Workspaces never nest (`workspace_conflict`, the one database read here): no instance's
workspace lies inside another's or holds one, whoever owns them, so one agent can never rename
or swap a directory another instance works in. Only instances of one owner share the very same
workspace (delegation's `shared` mode). Checked when an instance is saved (`services`, admin)
and again before every run and program start (`sandbox.checked_workspace`).
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from pydantic import ValidationError

from instances.schemas import BOUNDS, InstanceIn
from tether.schema import describe

__all__ = ["BOUNDS", "InvalidInstance", "check_workspace_apart", "validate", "workspace_conflict"]


class InvalidInstance(ValueError):
    """A field value that does not make a valid agent; `field` names it (None: the whole)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def validate(data: dict[str, Any], *, from_template: bool = False) -> dict[str, Any]:
    """Check an instance's fields; return the cleaned values (None values dropped).

    `from_template`: `data` holds overrides of a template, so nothing is required but a name;
    otherwise `data` defines the whole agent (a command brain needs its command). Keys the
    schema does not know (a form's `credential` object, `mcp_servers`) pass through unchanged.
    """
    from instances.models import Instance

    clean = {k: v for k, v in data.items() if v is not None}
    known = {k: v for k, v in clean.items() if k in InstanceInFields}
    known.setdefault("name", "")
    try:
        parsed = InstanceIn.model_validate(known, context={"from_template": from_template})
    except ValidationError as exc:
        message, field = describe(exc.errors(include_url=False))
        if message.startswith("missing required field(s): name"):
            message = "name must be 1 to 100 characters"
        raise InvalidInstance(message, field) from None
    clean.update(parsed.model_dump(exclude_unset=True, exclude_none=True))
    if not from_template:
        clean.setdefault("brain", Instance.Brain.COMMAND)
        clean.setdefault("decider", Instance.Decider.CHECKS)
    return clean


InstanceInFields = frozenset(InstanceIn.model_fields)


def _forms(path: Path | str) -> tuple[str, str]:
    """Return a path as written (absolute, normalised) and as its real path."""
    return os.path.abspath(path), os.path.realpath(path)


def _workspaces() -> list[tuple[int, int, str, str]]:
    """Return (id, owner id, name, workspace) of every instance; a thread that held no connection holds none after."""
    from instances.models import Instance

    was_closed = connection.connection is None
    try:
        return list(Instance.objects.values_list("pk", "owner_id", "name", "workspace"))
    finally:
        if was_closed:
            connection.close()  # e.g. a program about to start in an act that holds no connection


def workspace_conflict(workspace: Path | str, *, instance_id: int | None = None, owner_id: int | None = None) -> str | None:
    """Return why `workspace` may not be the workspace of instance `instance_id`, or None when it may.

    It may not lie inside another instance's workspace nor hold one, compared as written and as
    real paths; the very same workspace only when both instances have one owner (`owner_id`,
    else the instance's own). Another owner's instance is never named. One query of every
    instance's workspace; a default one is resolved through its owner's area only (as
    `Instance.workspace_path` places it, and no program can write in an area itself).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        rows = _workspaces()
    else:  # an event loop runs in this thread (an MCP server being started), where no query may run
        with ThreadPoolExecutor(1) as reader:
            rows = reader.submit(_workspaces).result()
    if owner_id is None:
        owner_id = next((owner for pk, owner, _, _ in rows if pk == instance_id), None)
    mine = [(ours, ours.rstrip("/") + "/") for ours in _forms(workspace)]
    areas: dict[int, tuple[str, str]] = {}
    for pk, owner, name, written in rows:
        if pk == instance_id:
            continue
        if written:
            theirs = _forms(written)
        else:
            area = areas.get(owner) or areas.setdefault(owner, _forms(Path(settings.TETHER_WORKSPACES) / str(owner)))
            theirs = (f"{area[0]}/{pk}", f"{area[1]}/{pk}")
        for (ours, below), other in zip(mine, theirs, strict=True):
            if ours == other and owner != owner_id:
                return f"workspace {workspace} is another instance's workspace; only instances of one owner share one"
            if ours.startswith(other.rstrip("/") + "/"):
                return f"workspace {workspace} lies inside {other}, {_whose(owner, owner_id, name)}; workspaces never nest"
            if other.startswith(below):
                return f"workspace {workspace} holds {other}, {_whose(owner, owner_id, name)}; workspaces never nest"
    return None


def _whose(owner: int, owner_id: int | None, name: str) -> str:
    return f"the workspace of your instance {name!r}" if owner == owner_id else "another instance's workspace"


def check_workspace_apart(instance: Any) -> None:
    """Raise InvalidInstance (field "workspace") when `instance`'s workspace nests with another's."""
    why = workspace_conflict(instance.workspace_path(), instance_id=instance.pk, owner_id=instance.owner_id)
    if why:
        raise InvalidInstance(f"{why}: choose a directory apart from it", "workspace")
