"""MCP tools for an instance's webhook triggers and schedules: list, create, pause (or resume), delete, and run
a schedule now. `web.mcp_server.build_server` adds them to Tether's MCP server.

The same services and owner rules as the REST API: another user's trigger, schedule or instance
reads as not found; every change is audited with the interface `mcp`. A trigger's secret is in
the answer to `create_trigger` and nowhere else (listing never shows it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from loops import schemas as loop_schemas
from reviews.notify import public_url
from triggers import scheduling, schemas, services
from triggers.api import hook_url, trigger_json
from triggers.models import Schedule, Trigger
from triggers.schedules_api import firing_json, schedule_json

Work = Callable[[Any, Any], Any]  # a tool's body: given the caller's user and device, its answer
Call = Callable[[Context, Work], Awaitable[Any]]  # runs a tool's body as the caller
FindInstance = Callable[[Any, int | str], Any]

ItemId = Annotated[
    int, Field(ge=1, le=2**53, description="its id (list_triggers / list_schedules show them)")
]
InstanceRef = Annotated[
    int | str,
    Field(description="the instance's id, or its name when no other instance of yours has that name"),
]
Dollars = Annotated[loop_schemas.Cap, Field(description="each run's own cost cap in US dollars, like 2.50")]
Iterations = Annotated[loop_schemas.Iterations | None, Field(description="each run's turns at most")]


def _own(model: type[Trigger] | type[Schedule], user: Any, item_id: int) -> Any:
    """The caller's trigger or schedule `item_id` (`services.owned`); anyone else's reads as not found."""
    found = services.owned(model, user, item_id)
    if found is None:
        noun = model._meta.model_name
        raise ToolError(f"{noun} {item_id} not found; list_{noun}s shows yours")
    return found


def _schedule(user: Any, schedule_id: int) -> Schedule:
    return _own(Schedule, user, schedule_id)


Shown = Callable[[Any], dict[str, Any]]  # a trigger or schedule as a tool answers it


def _listing(
    model: type[Trigger] | type[Schedule], instance_of: FindInstance, instance: int | str, shown: Shown
) -> Work:
    """The body of list_triggers and list_schedules: the caller's items of `instance`, each as `shown` says."""

    def work(user: Any, device: Any) -> Any:
        items = services.of_instance(model, user, instance_of(user, instance))
        return {f"{model._meta.model_name}s": [shown(item) for item in items]}

    return work


def _pausing(model: type[Trigger] | type[Schedule], change: Any, shown: Shown, item_id: int, paused: bool) -> Work:
    """The body of pause_trigger and pause_schedule: pause (or resume) the caller's item through `change`."""

    def work(user: Any, device: Any) -> Any:
        item = _own(model, user, item_id)
        return shown(services.set_active(change, user, item, not paused, via="mcp", request=device))

    return work


def _deleting(model: type[Trigger] | type[Schedule], delete: Any, item_id: int) -> Work:
    """The body of delete_trigger and delete_schedule: delete the caller's item through `delete`."""

    def work(user: Any, device: Any) -> Any:
        return services.delete_with(delete, user, _own(model, user, item_id), via="mcp", request=device)

    return work


def _trigger_answer(trigger: Trigger) -> dict[str, Any]:
    return {**trigger_json(None, trigger), "url": public_url(hook_url(None, trigger))}


def _refusals(work: Work) -> Work:
    def guarded(user: Any, device: Any) -> Any:
        try:
            return work(user, device)
        except services.TriggerRefused as exc:
            raise ToolError(exc.message) from None

    return guarded


def register(server: MCPServer, call: Call, instance_of: FindInstance) -> None:
    """Add the trigger and schedule tools to `server`; `call` runs a tool body as the caller."""

    async def run(ctx: Context, work: Work) -> Any:
        return await call(ctx, _refusals(work))

    _register_triggers(server, run, instance_of)
    _register_schedules(server, run, instance_of)
    _register_schedule_runs(server, run)


def _register_triggers(server: MCPServer, run: Call, instance_of: FindInstance) -> None:
    """list_triggers, create_trigger, pause_trigger, delete_trigger."""

    @server.tool()
    async def list_triggers(ctx: Context, instance: InstanceRef) -> dict[str, Any]:
        """List the webhook triggers of one of your instances (never their secrets)."""
        return await run(ctx, _listing(Trigger, instance_of, instance, _trigger_answer))

    @server.tool()
    async def create_trigger(
        ctx: Context,
        instance: InstanceRef,
        name: schemas.Name,  # type: ignore[valid-type]
        objective_template: schemas.Template,  # type: ignore[valid-type]
        events: schemas.Events | None = None,
        actions: schemas.Actions | None = None,
        max_iterations: Iterations = None,
        max_cost_usd: Dollars = None,
        max_per_minute: schemas.Rate | None = None,  # type: ignore[valid-type]
    ) -> dict[str, Any]:
        """Make a webhook trigger on one of your instances: a signed POST to its url starts a run. The answer holds
        its secret, shown this once: put it in the sender's webhook settings now."""

        def work(user, device):
            found = instance_of(user, instance)
            trigger, secret = services.trigger_create(
                user=user,
                instance=found,
                name=name,
                objective_template=objective_template,
                events=events,
                actions=actions,
                max_iterations=max_iterations,
                max_cost_usd=max_cost_usd,
                max_per_minute=max_per_minute,
                via="mcp",
                request=device,
            )
            return {**_trigger_answer(trigger), "secret": secret}

        return await run(ctx, work)

    @server.tool()
    async def pause_trigger(ctx: Context, trigger_id: ItemId, paused: bool = True) -> dict[str, Any]:
        """Pause one of your triggers (its deliveries are refused), or resume it with paused=false."""
        return await run(ctx, _pausing(Trigger, services.trigger_change, _trigger_answer, trigger_id, paused))

    @server.tool()
    async def delete_trigger(ctx: Context, trigger_id: ItemId) -> dict[str, Any]:
        """Delete one of your triggers: its url answers 404 from then on; the runs it started stay."""
        return await run(ctx, _deleting(Trigger, services.trigger_delete, trigger_id))


def _register_schedules(server: MCPServer, run: Call, instance_of: FindInstance) -> None:
    """list_schedules, create_schedule, pause_schedule, delete_schedule."""

    @server.tool()
    async def list_schedules(ctx: Context, instance: InstanceRef) -> dict[str, Any]:
        """List the schedules of one of your instances, each with its next five firings."""
        return await run(ctx, _listing(Schedule, instance_of, instance, schedule_json))

    @server.tool()
    async def create_schedule(
        ctx: Context,
        instance: InstanceRef,
        name: schemas.Name,  # type: ignore[valid-type]
        objective_template: schemas.ScheduleTemplate,  # type: ignore[valid-type]
        cron: schemas.Cron | None = None,  # type: ignore[valid-type]
        interval_minutes: schemas.Interval | None = None,  # type: ignore[valid-type]
        timezone: schemas.TimeZone | None = None,  # type: ignore[valid-type]
        max_iterations: Iterations = None,
        max_cost_usd: Dollars = None,
        overlap: schemas.OverlapPolicy = "skip",  # type: ignore[valid-type]
        catch_up_minutes: schemas.CatchUp | None = None,  # type: ignore[valid-type]
    ) -> dict[str, Any]:
        """Make a schedule on one of your instances: a cron expression (five fields, in `timezone`) or an
        interval starts a run each firing, within the instance's budget. The answer shows the next five firings."""

        def work(user, device):
            found = instance_of(user, instance)
            schedule = scheduling.schedule_create(
                user=user,
                instance=found,
                name=name,
                objective_template=objective_template,
                cron=cron,
                interval_minutes=interval_minutes,
                timezone=timezone or "UTC",
                max_iterations=max_iterations,
                max_cost_usd=max_cost_usd,
                overlap=overlap,
                catch_up_minutes=catch_up_minutes or 0,
                via="mcp",
                request=device,
            )
            return schedule_json(schedule)

        return await run(ctx, work)

    @server.tool()
    async def pause_schedule(ctx: Context, schedule_id: ItemId, paused: bool = True) -> dict[str, Any]:
        """Pause one of your schedules, or resume it with paused=false (it fires again from now; nothing is caught up)."""
        return await run(ctx, _pausing(Schedule, scheduling.schedule_change, schedule_json, schedule_id, paused))

    @server.tool()
    async def delete_schedule(ctx: Context, schedule_id: ItemId) -> dict[str, Any]:
        """Delete one of your schedules and its firing history; the runs it started stay."""
        return await run(ctx, _deleting(Schedule, scheduling.schedule_delete, schedule_id))


def _register_schedule_runs(server: MCPServer, run: Call) -> None:
    """run_schedule, schedule_firings."""

    @server.tool()
    async def run_schedule(ctx: Context, schedule_id: ItemId) -> dict[str, Any]:
        """Fire one of your schedules now (within its budget, whatever its overlap policy); the firing says what it
        did: the run it started, or why it started none."""

        def work(user, device):
            firing = scheduling.run_now(
                user=user, schedule=_schedule(user, schedule_id), via="mcp", request=device
            )
            return firing_json(firing)

        return await run(ctx, work)

    @server.tool()
    async def schedule_firings(ctx: Context, schedule_id: ItemId) -> dict[str, Any]:
        """The latest firings of one of your schedules, newest first: started (which run), skipped and why, missed."""

        def work(user, device):
            return {"firings": [firing_json(f) for f in _schedule(user, schedule_id).firings.all()[:100]]}

        return await run(ctx, work)
