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

What the whole makes is checked here too, on every surface (`check_saved`: services, admin):
a name its owner uses for no other instance (`name_taken`), and a configuration that can run
(`unrunnable`: a program brain needs its command, and a script named relative to the workspace
must be there when the workspace is new or empty). Names (instances, tokens, credentials) hold
no invisible or control characters (`invisible`); a stored key has the shape of one (`key_problem`).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
from django.conf import settings
from django.db import connection
from pydantic import ValidationError

from instances.brains.process import SAFE_PATH
from instances.models import Instance
from instances.schemas import BOUNDS, KEY_CHARS, InstanceIn
from tether.schema import INVISIBLE, describe

__all__ = [
    "BOUNDS", "InvalidInstance", "json_schema_problem", "check_saved", "check_workspace_apart", "invisible", "key_problem", "name_taken",
    "unrunnable", "validate", "workspace_conflict",
]


class InvalidInstance(ValueError):
    """A field value that does not make a valid agent; `field` names it (None: the whole), `status` the HTTP status."""

    def __init__(self, message: str, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.status = status






def json_schema_problem(schema: Any) -> str:
    """Return why `schema` is not a JSON Schema a final answer can be checked against ("" when it is)."""
    if not isinstance(schema, dict | bool):
        return f"must be a JSON Schema (an object), not {type(schema).__name__}"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"is not a JSON Schema ({exc.message[:300]})"
    if remote := _remote_ref(schema):
        return (
            f"may refer only to its own parts ('$ref' starting with '#'), not {remote[:200]!r}; "
            "Tether never fetches a schema from elsewhere"
        )
    return ""


REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def _remote_ref(schema: Any) -> str:
    """Return the first reference in `schema`, at any depth, that points outside it ("" when none does)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in REF_KEYWORDS and isinstance(value, str) and not value.startswith("#"):
                    return value
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return ""


def invisible(text: str) -> str | None:
    """Return why `text` may not be a name (its first invisible or control character), or None when it may."""
    for position, char in enumerate(text, 1):
        if unicodedata.category(char) in INVISIBLE:
            named = unicodedata.name(char, "")
            shown = f"U+{ord(char):04X}" + (f" {named}" if named else "")
            return (
                f"holds an invisible or control character ({shown}, character {position}); "
                "names may hold only visible characters and spaces"
            )
    return None


def _name_key(name: str) -> str:
    """Return how two names compare: the same once normalised (NFKC), case folded and stripped."""
    return unicodedata.normalize("NFKC", name).casefold().strip()


def name_taken(owner_id: int | None, name: str, *, instance_id: int | None = None) -> str | None:
    """Return why `name` may not be the name of instance `instance_id` of `owner_id`, or None when it may.

    An owner's instances have names that tell them apart (a delegate call names its target):
    two names are the same when they differ only in case or in Unicode form.
    """
    if owner_id is None or not name:
        return None
    key = _name_key(name)
    theirs = Instance.objects.filter(owner_id=owner_id).exclude(pk=instance_id).values_list("name", "archived_at")
    for other, archived_at in theirs:
        if _name_key(other) == key:
            where = " (archived: restore or rename it under New instance)" if archived_at else ""
            return f"you already have an instance named {other!r}{where}; choose another name"
    return None


# Programs that run a script named in their arguments (`sh agent.sh`, `python3 main.py`).
_INTERPRETER = re.compile(r"(?:sh|bash|dash|zsh|ksh|python[0-9.]*|node|nodejs|perl|ruby|php|lua|Rscript|tclsh)")
# Their flags after which comes code or a module, not a script file.
_CODE_FLAGS = frozenset({"-c", "-m", "-e", "-E", "--eval", "-p", "--print", "-r", "-", "-s"})
_SCRIPT = re.compile(r".*\.(?:sh|bash|py|js|mjs|cjs|ts|rb|pl|php|lua|R)")


def _workspace_file(argv: list[str]) -> str | None:
    """Return the file `argv` runs from its working directory (the workspace), or None when it names none."""
    first = argv[0]
    if "/" in first:
        return None if os.path.isabs(first) else first
    if _INTERPRETER.fullmatch(first):
        for arg in argv[1:]:
            if arg in _CODE_FLAGS:
                return None
            if arg.startswith("-"):
                continue
            if "/" in arg or _SCRIPT.fullmatch(arg):
                return None if os.path.isabs(arg) else arg
        return None
    return None


def _search_path() -> str:
    return SAFE_PATH


def unrunnable(instance: Any) -> tuple[str, str] | None:
    """Return (why, field) when `instance` as configured cannot run at all, or None.

    A program brain needs its command. A command whose program (or whose interpreter's script)
    is named relative to the workspace must find it there when the workspace is new or empty
    (a copy gets its own, empty one); a bare script name that is no program on the search path
    cannot start even when the workspace holds it.
    """
    if instance.brain != Instance.Brain.COMMAND:
        return None
    argv = [a for a in (instance.command or []) if isinstance(a, str)]
    if not argv or not argv[0].strip():
        return (
            "a program brain needs its command: write the program it runs, like ./agent.sh or "
            "my-agent --fast, or choose Claude as its brain",
            "command",
        )
    first = argv[0]
    if "/" not in first and _SCRIPT.fullmatch(first) and shutil.which(first, path=_search_path()) is None:
        return (
            f"{first} is not a program on the search path, so it cannot start; a script in the workspace "
            f"is written ./{first} (or sh {first}, python3 {first})",
            "command",
        )
    script = _workspace_file(argv)
    if script is None:
        return None
    workspace = instance.workspace_path()
    try:
        with os.scandir(workspace) as entries:
            empty = next(entries, None) is None
    except FileNotFoundError:
        empty = True
    except OSError:
        return None  # not readable here: the run will say
    if not empty:
        return None
    return (
        f"the command runs {script} from the workspace, and the workspace ({workspace}) is new and empty, so every "
        f"run would fail with \"cannot open {script}\". Choose a workspace that holds {script} (or put "
        "it in this one first), or give the program's absolute path",
        "command",
    )


def check_saved(instance: Any, *, name: bool = True, program: bool = True) -> None:
    """Raise InvalidInstance when `instance`, about to be saved, could not be told apart or could not run.

    `name`: check its name (its characters, and that its owner has no other instance so named);
    `program`: check that its configuration can run. The one check every surface makes (API and
    console through `services`, admin through its form).
    """
    if name:
        why = invisible(instance.name or "")
        if why:
            raise InvalidInstance(f"name {why}", "name")
        taken = name_taken(instance.owner_id, instance.name or "", instance_id=instance.pk)
        if taken:
            raise InvalidInstance(taken, "name", 409)
    if program:
        found = unrunnable(instance)
        if found:
            raise InvalidInstance(*found)


# The shape of a stored model key: an Anthropic key, `sk-ant-` and then letters, digits, - and _.
_KEY = re.compile(r"sk-ant-[A-Za-z0-9_-]+")


def key_problem(secret: str) -> str | None:
    """Return why `secret` is not a plausible Anthropic API key (shape and length), or None when it is."""
    low, high = KEY_CHARS
    if not secret:
        return "an API key cannot be empty: paste the key (it starts with sk-ant-)"
    if any(c.isspace() for c in secret):
        return "an API key holds no spaces or line breaks: paste the key alone, as one word"
    if len(secret) < low or len(secret) > high:
        return (
            f"an API key is {low} to {high} characters; this one is {len(secret):,}: "
            "paste the whole key (it starts with sk-ant-), nothing else"
        )
    if not _KEY.fullmatch(secret):
        return (
            "this does not look like an Anthropic API key: one starts with sk-ant- and holds only letters, "
            "digits, - and _ (create one at console.anthropic.com)"
        )
    return None


def validate(data: dict[str, Any], *, from_template: bool = False) -> dict[str, Any]:
    """Check an instance's fields; return the cleaned values (None values dropped).

    `from_template`: `data` holds overrides of a template, so nothing is required but a name;
    otherwise `data` defines the whole agent (a command brain needs its command). Keys the
    schema does not know (a form's `credential` object, `mcp_servers`) pass through unchanged.
    """
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
