"""Tether's API as MCP tools: make instances from templates and change or archive them; list, start, read,
follow, interject, answer, stop, continue and roll back runs.

The tools call the same selectors and services as the REST API (web.api), with the same
owner rules (another user's instance or run reads as not found) and every action audited
with the interface `mcp`. Who the caller is comes from the transport: the bearer token of
the HTTP request (web.mcp_http) or the user the operator named to `manage.py mcp` (stdio).
A refusal is a tool error whose text says what to do instead; nothing else of an error (a
traceback, a query) reaches the client. Tools run in the loop's executor threads, never on the loop.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from django.contrib.auth import get_user_model
from django.db import close_old_connections
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field, ValidationError

from budgets.selectors import headroom_for_run
from instances import api as instances_api
from instances import schemas as instance_schemas
from instances import services as instance_services
from instances.models import Instance
from loops import events, schemas, selectors, services
from loops.models import Run
from reviews import changecard as changecards
from reviews import rollback as rollbacks
from tether.schema import describe
from triggers import mcp_tools

EVENTS_PAGE = 1000
RUNS_PAGE = 200
ID_MAX = 2**53  # ids past this overflow SQLite integers long before they could exist

RunId = Annotated[int, Field(ge=1, le=ID_MAX, description="the run's id")]
InstanceRef = Annotated[
    int | str, Field(description="the instance's id, or its name when no other instance of yours has that name")
]
# A run's objective, messages and numbers have the REST API's types (`loops.schemas`): the same value
# gets the same answer on every surface, and the same JSON Schema describes it.
Dollars = Annotated[
    schemas.Cap,
    Field(description="the run's own cost cap in US dollars, like 2.50; omitted: only the pools above cap it"),
]
Iterations = Annotated[schemas.Iterations | None, Field(description="at most this many turns")]
# An instance's settings are the REST API's (`instances.schemas.InstanceChange`): checked by the same service.
SETTINGS = frozenset(instance_schemas.InstanceChange.model_fields) - {"name"}
Settings = Annotated[
    dict[str, Any] | None,
    Field(description="settings that override the template, as the REST API names them (POST /v1/instances), "
                      'e.g. {"max_iterations": 5, "judge_rubric": "..."}'),
]
Minutes = Annotated[schemas.Minutes | None, Field(description="wall-clock limit in minutes")]
DELEGATE_IS_FOR_AGENTS = (
    "delegate is an agent's tool: it makes a child run of the run whose act is calling it, and it takes only "
    "the per-act token Tether gives a running agent (TETHER_TOKEN), never a person's API token. "
    "To start a run yourself, use start_run."
)
INSTRUCTIONS = (
    "Tether runs durable, governed agent loops. Each instance is an agent (list_templates, then create_instance "
    "makes one from a template; update_instance and archive_instance change it); a run pursues one objective "
    "until it is done and verified, needs a person, or hits a bound. Start a run, then follow it with "
    "run_events (pass the last seq you have as `after`); interject to steer it, answer a run that waits "
    "for a person, cancel to stop it, continue_run to pick a finished run up again, rollback to put a finished run's "
    "workspace back to an earlier snapshot (rollback_points lists them)."
)


@dataclass(frozen=True)
class Caller:
    """Who calls a tool and from where: the user's id and what the audit trail keeps of the device."""

    user_id: int
    user_agent: str = ""
    address: str | None = None


@dataclass
class _Device:
    """What audit.trail reads from a request: the user agent and the address."""

    META: dict[str, Any] = field(default_factory=dict)


def stdio_caller(user_id: int) -> Callable[[Context], Caller]:
    """Return an identify() for `manage.py mcp`: always the user the operator named."""
    device = f"manage.py mcp (stdio) on {socket.gethostname()}"
    return lambda ctx: Caller(user_id=user_id, user_agent=device)


def http_caller(ctx: Context) -> Caller:
    """Return the caller web.mcp_http authenticated for the HTTP request carrying this call."""
    request = getattr(ctx.request_context, "request", None)
    scope = getattr(request, "scope", None) or {}
    user_id = scope.get("tether.user_id")
    if user_id is None:  # every request through web.mcp_http has one; nothing else reaches here
        raise ToolError("not authenticated")
    client = scope.get("client") or (None, None)
    agent = request.headers.get("user-agent", "") if request is not None else ""
    return Caller(user_id=user_id, user_agent=agent, address=client[0])


Work = mcp_tools.Work
Call = mcp_tools.Call


def _serve(ctx: Context, identify: Callable[[Context], Caller], work: Work) -> Any:
    """Run one tool body as the caller, with a fresh database connection and readable refusals."""
    caller = identify(ctx)
    close_old_connections()
    try:
        user = get_user_model().objects.filter(pk=caller.user_id, is_active=True).first()
        if user is None:
            raise ToolError("this account is not active; ask the operator")
        device = _Device({"HTTP_USER_AGENT": caller.user_agent, "REMOTE_ADDR": caller.address})
        return work(user, device)
    except services.Refused as exc:
        raise ToolError(exc.message) from None
    finally:
        close_old_connections()


async def _call(ctx: Context, identify: Callable[[Context], Caller], work: Work) -> Any:
    # The loop's own executor, not anyio's worker threads: those live until the task that first
    # used them ends, and the session manager's task never does, so they would keep daphne from
    # exiting on SIGTERM.
    return await asyncio.to_thread(_serve, ctx, identify, work)


def _run(user: Any, run_id: int) -> Run:
    run = selectors.run_for(user, run_id)
    if run is None:
        raise ToolError(f"run {run_id} not found; list_runs shows your runs")
    return run


def _instance(user: Any, ref: int | str):
    mine = Instance.objects.filter(owner=user)  # archived ones too: run_start says why they cannot run
    if isinstance(ref, int) or (ref.strip().isdigit() and len(ref.strip()) <= 20):
        found = mine.filter(pk=int(ref)).first() if int(ref) <= ID_MAX else None
    else:
        named = list(mine.filter(name=ref.strip())[:2])
        if len(named) > 1:
            raise ToolError(f"more than one of your instances is named {ref!r}; give its id (see list_instances)")
        found = named[0] if named else None
    if found is None:
        raise ToolError(f"instance {ref!r} not found; list_instances shows yours")
    return found


def _settings(given: dict[str, Any] | None) -> dict[str, Any]:
    """Return an instance's settings as given to create_instance or update_instance; refuse a name none has."""
    values = dict(given or {})
    unknown = sorted(set(values) - SETTINGS)
    if unknown:
        raise ToolError(f"unknown setting {', '.join(map(repr, unknown))}; the settings are {', '.join(sorted(SETTINGS))}")
    return values


def _instance_write(write: Callable[[], Any]) -> dict[str, Any]:
    """Make an instance write through `instances.services`; its refusal is the tool's error, said as it is."""
    try:
        return instances_api.instance_json(write())
    except instance_services.InstanceRefused as exc:
        where = f"{exc.field}: " if exc.field and not exc.message.startswith(exc.field) else ""
        raise ToolError(where + exc.message) from None


def _instance_json(instance: Any) -> dict[str, Any]:
    return {
        "id": instance.pk,
        "name": instance.name,
        "brain": instance.brain,
        "model": instance.model or None,
        "template": instance.template.name if instance.template_id else None,
        "decider": instance.decider,
        "max_iterations": instance.max_iterations,
        "active_runs": instance.active_runs,
        "waiting_runs": instance.waiting_runs,
        "total_runs": instance.total_runs,
    }


class TetherMCPServer(MCPServer):
    """MCPServer whose argument errors read as one line per field, without pydantic's links."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ToolError):  # our own refusal, which the SDK prefixes: said as it is
                raise ToolError(str(exc.__cause__)) from None
            if not isinstance(exc.__cause__, ValidationError):
                raise
            errors = exc.__cause__.errors(include_url=False)
            if errors and errors[0]["type"] in ("tether", "blank"):  # a rule of `tether.schema`: REST's sentence
                raise ToolError(describe(errors)[0]) from None
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
                for err in exc.__cause__.errors(include_url=False)
            )
            raise ToolError(f"bad arguments for {name}: {problems}") from None


def build_server(identify: Callable[[Context], Caller]) -> MCPServer:
    """Return Tether's MCP server; `identify` names the caller of each tool call."""
    server = TetherMCPServer("tether", instructions=INSTRUCTIONS)

    def call(ctx: Context, work: Work) -> Any:
        return _call(ctx, identify, work)

    _register_runs(server, call)
    _register_steering(server, call)
    _register_results(server, call)
    _register_instances(server, call)
    # An instance's webhook triggers and schedules: list, create, pause, delete (and run a schedule now).
    mcp_tools.register(server, call, _instance)
    return server


def _register_runs(server: MCPServer, call: Call) -> None:
    """Start and find runs: list_instances, start_run, get_run, list_runs."""

    @server.tool()
    async def list_instances(ctx: Context) -> dict[str, Any]:
        """List your instances (agents) with their live, waiting and total run counts."""

        def work(user, device):
            return {"instances": [_instance_json(i) for i in selectors.instances_for(user).order_by("id")]}

        return await call(ctx, work)

    @server.tool()
    async def start_run(
        ctx: Context,
        instance: InstanceRef,
        objective: Annotated[
            schemas.Objective, Field(description="what the agent should achieve, and how to tell it is done")
        ],
        max_iterations: Iterations = None,
        max_cost_usd: Dollars = None,
        max_minutes: Minutes = None,
    ) -> dict[str, Any]:
        """Start a run of one of your instances toward an objective; return the run (queued)."""

        def work(user, device):
            found = _instance(user, instance)
            run = services.run_start(
                instance=found, user=user, objective=objective, max_iterations=max_iterations,
                max_cost_usd=max_cost_usd, max_minutes=max_minutes, via="mcp", request=device,
            )
            return selectors.run_json(run)

        return await call(ctx, work)

    @server.tool()
    async def get_run(ctx: Context, run_id: RunId) -> dict[str, Any]:
        """Return one of your runs: status, outcome, iterations, spend and its budget's headroom."""

        def work(user, device):
            run = _run(user, run_id)
            return {**selectors.run_json(run), "budget": headroom_for_run(run).as_json()}

        return await call(ctx, work)

    @server.tool()
    async def list_runs(
        ctx: Context,
        instance: InstanceRef | None = None,
        status: Literal["queued", "running", "waiting", "finished"] | None = None,
        limit: Annotated[int, Field(ge=1, le=RUNS_PAGE)] = 20,
    ) -> dict[str, Any]:
        """List your runs, newest first (optionally of one instance, or in one status)."""

        def work(user, device):
            runs = selectors.runs_for(user)
            if instance is not None:
                runs = runs.filter(instance=_instance(user, instance))
            if status is not None:
                runs = runs.filter(status=status)
            return {"runs": [selectors.run_json(r) for r in runs.order_by("-id")[:limit]]}

        return await call(ctx, work)


def _register_steering(server: MCPServer, call: Call) -> None:
    """Follow and steer a run: run_events, interject, answer a waiting one, cancel."""

    @server.tool()
    async def run_events(
        ctx: Context,
        run_id: RunId,
        after: Annotated[int, Field(ge=0, le=ID_MAX, description="the last seq you have; 0 for all")] = 0,
        limit: Annotated[int, Field(ge=1, le=EVENTS_PAGE)] = 200,
    ) -> dict[str, Any]:
        """Return the run's events after seq `after`, oldest first; `more` says whether later ones remain."""

        def work(user, device):
            run = _run(user, run_id)
            found = events.after(run, after, limit=limit)
            last = found[-1].seq if found else after
            return {"events": [e.as_json() for e in found], "last_seq": last, "more": last < run.last_seq}

        return await call(ctx, work)

    @server.tool()
    async def interject(
        ctx: Context,
        run_id: RunId,
        message: Annotated[schemas.SaidMessage, Field(description="what the agent should hear at its next turn")],
    ) -> dict[str, Any]:
        """Queue a message into a live run; the agent reads it at its next iteration."""

        def work(user, device):
            run = _run(user, run_id)
            queued = services.run_interject(run=run, user=user, text=message, via="mcp", request=device)
            run.refresh_from_db()
            return {"interjection": queued.pk, "run": selectors.run_json(run)}

        return await call(ctx, work)

    @server.tool()
    async def answer(
        ctx: Context,
        run_id: RunId,
        message: Annotated[schemas.Message, Field(description="your answer to the agent's question")] = "",
        approve: Annotated[
            bool | None, Field(description="for a run waiting on tool calls that need a person: run them or not")
        ] = None,
    ) -> dict[str, Any]:
        """Answer a run that waits for a person (escalated, or asking to approve tool calls); it resumes."""

        def work(user, device):
            run = _run(user, run_id)
            if run.status != Run.Status.WAITING:
                raise ToolError(
                    f"run {run.pk} is not waiting for an answer (it is {run.outcome or run.status}); "
                    "interject adds a message to a live run"
                )
            if not message.strip() and approve is None:
                raise ToolError("give a message, or approve true/false for the tool calls it asks about")
            queued = services.run_interject(
                run=run, user=user, text=message, approve=approve, via="mcp", request=device
            )
            run.refresh_from_db()
            return {"interjection": queued.pk, "run": selectors.run_json(run)}

        return await call(ctx, work)

    @server.tool()
    async def cancel(ctx: Context, run_id: RunId) -> dict[str, Any]:
        """Stop a run: at once when no worker holds it, else within about a second."""

        def work(user, device):
            run = services.run_cancel(run=_run(user, run_id), user=user, via="mcp", request=device)
            return selectors.run_json(run)

        return await call(ctx, work)


def _register_results(server: MCPServer, call: Call) -> None:
    """After a run: continue_run, its change card, its rollback points, a rollback."""

    @server.tool()
    async def continue_run(
        ctx: Context,
        run_id: RunId,
        message: Annotated[
            schemas.Message,
            Field(description="what to do differently or next; folded into its first turn (after a verified done: "
                  "required, the follow-up's objective)"),
        ] = "",
        max_iterations: Annotated[schemas.Iterations | None, Field(description="default: the old run's")] = None,
        max_cost_usd: Dollars = None,
        max_minutes: Minutes = None,
    ) -> dict[str, Any]:
        """Start a new run that picks up where a finished run stopped (its memory, its workspace, your message)."""

        def work(user, device):
            new = services.run_continue(
                run=_run(user, run_id), user=user, message=message, max_iterations=max_iterations,
                max_cost_usd=max_cost_usd, max_minutes=max_minutes, via="mcp", request=device,
            )
            return selectors.run_json(new)

        return await call(ctx, work)

    @server.tool()
    async def change_card(ctx: Context, run_id: RunId) -> dict[str, Any]:
        """What one of your finished (or waiting) runs changed, at a glance: files with line counts, tests,
        protected paths touched, the checks over the iterations, cost, and the agent's own claim."""

        def work(user, device):
            run = _run(user, run_id)
            found = changecards.for_run(run)
            if found is None:
                raise ToolError(f"run {run_id} is {run.status}; its change card is made when it finishes or waits")
            return found

        return await call(ctx, work)

    @server.tool()
    async def rollback_points(ctx: Context, run_id: RunId) -> dict[str, Any]:
        """The states one of your runs' workspace can be rolled back to, and any live run that stops a rollback now."""

        def work(user, device):
            return rollbacks.listing(_run(user, run_id))

        return await call(ctx, work)

    @server.tool()
    async def rollback(
        ctx: Context,
        run_id: RunId,
        to: Annotated[schemas.RollbackPoint, Field(description=schemas.ROLLBACK_POINT_HELP)],
        dry_run: schemas.DryRun = False,  # type: ignore[valid-type]
    ) -> dict[str, Any]:
        """Roll a finished run's workspace back (refused while a run on it is live). The workspace is snapshot
        first: `undo` names the point that returns to it. What snapshots do not keep is left and named in `kept`."""

        def work(user, device):
            run = _run(user, run_id)
            if dry_run:
                return rollbacks.plan(run=run, to=to).as_json()
            return rollbacks.rollback(run=run, user=user, to=to, via="mcp", request=device).as_json()

        return await call(ctx, work)


def _register_instances(server: MCPServer, call: Call) -> None:
    """Make and change instances (list_templates, create_, update_ and archive_instance); delegate's refusal."""

    @server.tool()
    async def list_templates(ctx: Context) -> dict[str, Any]:
        """List the agent templates an instance can be made from (then the roles compositions start by delegate),
        each with the configuration an instance made from it gets and whether it can be used (its models are priced)."""

        def work(user, device):
            return instances_api.templates_json()

        return await call(ctx, work)

    @server.tool()
    async def create_instance(
        ctx: Context,
        template: Annotated[str, Field(min_length=1, max_length=50, description="a template's name (list_templates)")],
        name: Annotated[str, Field(min_length=1, max_length=100, description="the new instance's name")],
        settings: Settings = None,
    ) -> dict[str, Any]:
        """Create an instance (an agent) of yours from a template, with settings that override it. Without the
        run_programs capability only the safe settings may be given (model, bounds, workspace, judge rubric,
        response schema...); a command, checks or tools are refused."""

        def work(user, device):
            values = {**_settings(settings), "name": name}
            return _instance_write(lambda: instance_services.instance_create(
                user=user, values=values, template=template, via="mcp", request=device,
            ))

        return await call(ctx, work)

    @server.tool()
    async def update_instance(ctx: Context, instance: InstanceRef, settings: Settings = None) -> dict[str, Any]:
        """Change settings of one of your instances (only those given); the same capability rules as create_instance."""

        def work(user, device):
            found, values = _instance(user, instance), _settings(settings)
            return _instance_write(lambda: instance_services.instance_update(
                instance=found, user=user, values=values, via="mcp", request=device,
            ))

        return await call(ctx, work)

    @server.tool()
    async def archive_instance(ctx: Context, instance: InstanceRef) -> dict[str, Any]:
        """Archive one of your instances: it starts no new run; its runs and receipts stay (refused while one is live)."""

        def work(user, device):
            found = _instance(user, instance)
            return _instance_write(lambda: instance_services.instance_archive(
                instance=found, user=user, via="mcp", request=device,
            ))

        return await call(ctx, work)

    @server.tool()
    async def delegate(
        ctx: Context,
        to: Annotated[str, Field(description="an instance, a template or a role the child runs on")] = "",
        objective: Annotated[str, Field(description="what the child must achieve")] = "",
        max_cost_usd: Dollars = None,
    ) -> dict[str, Any]:
        """An agent's tool: hand part of its act to a child run. It takes the per-act token a running agent gets
        (TETHER_TOKEN); with your own API token it is refused, and start_run is how you start a run."""
        raise ToolError(DELEGATE_IS_FOR_AGENTS)
