"""Capabilities: what an operator grants a user beyond the agent templates.

One capability, `instances.run_programs` (a Django permission managed in admin; superusers
have it), lets a user define what runs and where: an instance's `command`, `checks` and
`env`, its guardrails (`tools`, allow/deny lists, `approval_tools`, `protected_paths`), a
workspace outside their own area, a `base_url` and network egress. Without it a user creates
instances only from templates (the operator's vetted configurations) and overrides only
`SAFE_OVERRIDES`, the objective cap no higher than the template's. How a done is graded (a
judge's rubric, model and pass threshold, a response schema) is among them: it runs no program;
required checks are commands, so they need the capability.

Workspaces live under `TETHER_WORKSPACES/<user id>/<instance id>/`. A user may name a path
inside their own area; with the capability, also one under an operator-allowed root
(`TETHER_WORKSPACE_ROOTS`). `/`, system directories, `TETHER_HOME` and another user's area
are refused with a message.

MCP servers are granted per server: an operator registers one (`McpServer`) and lets
everyone, or named users and groups, enable it (`mcp_servers`, which is a safe override: a
user may enable on a template's agent the servers granted to them). `check_mcp_servers`
checks an instance's list; `mcp_servers_for` re-checks at each act.

`base_url` hosts on loopback, link-local or private addresses are refused unless the operator
allows them (`TETHER_ALLOW_PRIVATE_BASE_URLS=1`): a user must not point an agent's model
traffic at this machine's own services or a cloud metadata endpoint.

Every surface that writes an instance (API, console, admin) calls `check_instance`. Reads
settings, the MCP server registry, and resolves host names; no database writes.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection

from instances.models import McpServer
from instances.tools.mcp import SERVER_NAME
from instances.validation import InvalidInstance

PERMISSION = "instances.run_programs"
# What a user without the capability may set on an instance made from a template.
SAFE_OVERRIDES = frozenset(
    {"name", "model", "max_iterations", "objective_max_chars", "max_tool_turns", "max_output_tokens",
     "credential", "credential_id", "workspace", "mcp_servers",
     # How a done is graded: a rubric and a response schema run no program (a judge's model is priced).
     "judge_rubric", "judge_model", "judge_pass_threshold", "response_schema",
     # Going back to the run's own best snapshot when it stalls: it runs nothing and reaches no further.
     "rewind_on_stall"}
)
SYSTEM_DIRS = tuple(
    Path(p) for p in ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/root",
                      "/run", "/sbin", "/srv", "/sys", "/usr", "/var")
)


class CapabilityError(ValueError):
    """A change the user may not make; the message says what to do instead, `field` names it when one does."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def may_run_programs(user: Any) -> bool:
    """Return whether `user` holds the run_programs capability."""
    return bool(user is not None and user.is_active and user.has_perm(PERMISSION))


def user_area(user_id: int) -> Path:
    """Return the directory that holds a user's workspaces."""
    return (Path(settings.TETHER_WORKSPACES) / str(user_id)).resolve()


def default_workspace(owner_id: int, instance_id: int) -> Path:
    return user_area(owner_id) / str(instance_id)


def check_workspace(user: Any, raw: str) -> Path:
    """Return the resolved workspace path `user` may use, or raise CapabilityError saying why not."""
    if not raw.startswith("/"):
        raise CapabilityError(f"workspace must be an absolute path; got {raw!r}")
    path = Path(raw).resolve()
    own = user_area(user.pk)
    if path.is_relative_to(own) and path != own:
        return path
    workspaces = Path(settings.TETHER_WORKSPACES).resolve()
    if path.is_relative_to(workspaces):
        raise CapabilityError(
            f"workspace {raw!r} is not in your area; use a directory under {own}/ or leave it blank for the default"
        )
    home = Path(settings.TETHER_HOME).resolve()
    if path == Path("/") or path.is_relative_to(home) or home.is_relative_to(path):
        raise CapabilityError(f"workspace {raw!r} would expose Tether's own files; choose a directory under {own}/")
    roots = [Path(r).resolve() for r in settings.TETHER_WORKSPACE_ROOTS]
    allowed = any(path.is_relative_to(r) and path != r for r in roots)
    if any(path == d or path.is_relative_to(d) for d in SYSTEM_DIRS) and not allowed:
        raise CapabilityError(f"workspace {raw!r} is a system directory; choose a directory under {own}/")
    if not may_run_programs(user):
        raise CapabilityError(
            f"a workspace outside your area ({own}/) needs the run_programs capability; ask an operator to grant it"
        )
    if not allowed:
        where = ", ".join(str(r) for r in roots) or "none are configured (TETHER_WORKSPACE_ROOTS)"
        raise CapabilityError(f"workspace {raw!r} is outside the roots the operator allows: {where}")
    return path


def _private(address: str) -> bool:
    return not ipaddress.ip_address(address.split("%", 1)[0]).is_global


def check_base_url(raw: str) -> str:
    """Return `raw` if it is a usable Messages API base URL, else raise CapabilityError saying why not."""
    return check_url(raw, field="base_url")


def check_url(raw: str, *, field: str, allow_private: bool = False) -> str:
    """Return `raw` if it is an http(s) URL whose host is a public address, else raise CapabilityError.

    `allow_private` (or `TETHER_ALLOW_PRIVATE_BASE_URLS`) lets it be loopback, link-local or private.
    """
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CapabilityError(f"{field} must be an http:// or https:// URL with a host; got {raw!r}")
    if allow_private or settings.TETHER_ALLOW_PRIVATE_BASE_URLS:
        return raw
    host = parts.hostname
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, parts.port or 443, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        raise CapabilityError(f"{field} host {host!r} does not resolve") from None
    if any(_private(str(a)) for a in addresses):
        raise CapabilityError(
            f"{field} host {host!r} is a loopback, link-local or private address; "
            "an operator can allow those with TETHER_ALLOW_PRIVATE_BASE_URLS=1"
        )
    return raw


def may_use_mcp_server(user: Any, server: Any) -> bool:
    """Return whether `user` may give their agents the MCP server `server` (the operator's grant)."""
    if user is None or not user.is_active or not server.enabled:
        return False
    if user.is_superuser or server.everyone:
        return True
    if server.users.filter(pk=user.pk).exists():
        return True
    return bool(server.groups.filter(pk__in=user.groups.values("pk")).exists())


def check_mcp_servers(user: Any, names: Any, *, template: Any = None) -> list[str]:
    """Return `names` if `user` may enable each of those MCP servers, else raise CapabilityError.

    A server the instance's template names is allowed (the operator chose it); any other must be
    registered, enabled and granted to `user`. An unknown server is refused like one not granted.
    """
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) and SERVER_NAME.match(n) for n in names):
        raise InvalidInstance("mcp_servers must be a list of MCP server names", "mcp_servers")
    wanted: list[str] = [str(n) for n in names]
    if len(set(wanted)) != len(wanted):
        raise InvalidInstance("mcp_servers names a server twice", "mcp_servers")
    vetted = set(getattr(template, "mcp_servers", None) or [])
    found = {s.name: s for s in McpServer.objects.filter(name__in=[n for n in wanted if n not in vetted])}
    for name in wanted:
        if name in vetted:
            continue
        server = found.get(name)
        if server is None or not may_use_mcp_server(user, server):
            yours = [s.name for s in McpServer.objects.filter(enabled=True) if may_use_mcp_server(user, s)]
            raise CapabilityError(
                f"MCP server {name!r} is not one you may use; "
                + (f"yours: {', '.join(yours)}" if yours else "an operator grants MCP servers in the admin")
            )
    return wanted


def mcp_servers_for(instance: Any) -> tuple[list[Any], dict[str, str]]:
    """Return (the McpServer rows an instance may connect to now, {name: why not} for the others).

    Read at each act: a server disabled or no longer granted to the owner is not connected.
    """
    names = [str(n) for n in (instance.mcp_servers or [])]
    was_closed = connection.connection is None
    try:
        rows = {s.name: s for s in McpServer.objects.filter(name__in=names)}
        vetted = set(instance.template.mcp_servers or []) if instance.template_id else set()
        usable, refused = [], {}
        for name in names:
            server = rows.get(name)
            if server is None:
                refused[name] = "no such server is registered"
            elif not server.enabled:
                refused[name] = "an operator turned it off"
            elif name not in vetted and not may_use_mcp_server(instance.owner, server):
                refused[name] = "its owner is no longer granted it"
            else:
                usable.append(server)
    finally:
        if was_closed:
            connection.close()  # the act holds no database connection (see loops.runner)
    return usable, refused


def check_instance(user: Any, values: dict[str, Any], *, template: Any = None) -> dict[str, Any]:
    """Check the fields `user` sets on an instance (new, or changed ones); return them cleaned.

    `template` is the template an instance is made from (None: defined by hand; a row, not a
    name). Raises CapabilityError naming what is refused and how to get it.
    """
    clean = dict(values)
    if not may_run_programs(user):
        if template is None:
            raise CapabilityError(
                "defining an instance by hand (command, checks, env, tools) needs the run_programs capability; "
                "create it from a template instead (\"template\": \"coder\", \"pilot\" or \"triage\") "
                "or ask an operator to grant the capability"
            )
        refused = sorted(set(clean) - SAFE_OVERRIDES)
        if refused:
            raise CapabilityError(
                f"changing {', '.join(refused)} needs the run_programs capability; without it you may set "
                f"{', '.join(sorted(SAFE_OVERRIDES - {'credential'}))}"
            )
        _check_objective_cap(clean.get("objective_max_chars"), template)
    if clean.get("workspace"):
        clean["workspace"] = str(check_workspace(user, str(clean["workspace"])))
    if clean.get("base_url"):
        clean["base_url"] = check_base_url(str(clean["base_url"]))
    if "mcp_servers" in clean:
        clean["mcp_servers"] = check_mcp_servers(user, clean["mcp_servers"], template=template)
    return clean


def _check_objective_cap(value: Any, template: Any) -> None:
    """Refuse an objective cap above the template's: without the capability, the operator's value bounds it."""
    cap = getattr(template, "objective_max_chars", None)
    if value is not None and cap is not None and value > cap:
        raise CapabilityError(
            f"objective_max_chars may be at most {cap:,} (the {template.name} template's cap); you may lower it, "
            "but raising it needs the run_programs capability",
            "objective_max_chars",
        )


def changed(instance: Any, fields: Iterable[str], values: dict[str, Any]) -> dict[str, Any]:
    """Return the entries of `values` (for `fields`) that differ from `instance`'s current ones."""
    return {f: values[f] for f in fields if f in values and getattr(instance, f, None) != values[f]}
