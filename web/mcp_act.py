"""An act's own MCP endpoint: how a `command` agent delegates, with its per-act token.

Served at `/mcp` on each worker's gateway socket (`instances.gateway.route`), which the act
reaches from its sandbox through its loopback relay (`TETHER_MCP_URL`); the web's `/mcp`
relays a request carrying an act token to the socket the token names (`web.mcp_http`).
The token is the one the act got as `TETHER_TOKEN`, honoured only while its act runs in this
worker (`instances.gateway.act_for`) and only for an instance that enables the `delegate`
tool. It can do two things and nothing else:

- `delegate`: ask for a child run of its own run. The call is vetted at once against the
  bounds, the arguments and the headroom (`loops.delegation.check_call`) — a refusal is a
  tool error the program reads, and no run is made — and kept on the act; when the act ends
  the loop parks the run and starts the children (`loops.delegation.start_pending`), and their
  outcomes come back in the run's next instruction.
- `get_run`: read a run that its run delegated to.

No other run, instance or tool is within its reach, and it dies with its act.

Stateless streamable HTTP with JSON answers (each POST is one whole exchange), served by the
MCP SDK on an event loop of this process's own, in a thread; tool bodies run in that loop's
executor threads and close their database connections.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Annotated, Any, Literal

from django.db import close_old_connections
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import Field

from budgets import money
from instances import gateway
from loops import delegation, delegation_results, schemas
from loops.models import Run
from tether.perprocess import PerProcess
from web.mcp_server import ID_MAX, TetherMCPServer

PATH = "/mcp"
MAX_BODY_BYTES = 1 << 20
EXCHANGE_SECONDS = 60.0
INSTRUCTIONS = (
    "This endpoint belongs to one act of one Tether run. delegate hands a sub-objective to another agent "
    "as a child run of yours, with a budget carved from yours; the children start when your act ends "
    "(exit after your delegate calls), your run waits for them without a worker, and their outcomes come "
    "in your next instruction. get_run reads a run you delegated to. The token dies with the act."
)
NO_TOKEN = (
    "authentication required: send 'Authorization: Bearer <TETHER_TOKEN>' (the token your act was given)"
)


def _act(ctx: Context) -> gateway.Act:
    request = getattr(ctx.request_context, "request", None)
    act = (getattr(request, "scope", None) or {}).get("tether.act")
    if act is None:  # every request through handle() has one; nothing else reaches here
        raise ToolError("not authenticated")
    return act


async def _call(act: gateway.Act, work: Any) -> Any:
    def serve() -> Any:
        close_old_connections()
        try:
            return work()
        finally:
            close_old_connections()

    if not act.try_enter():
        raise ToolError("your act has ended: this token is no longer valid")
    try:
        return await asyncio.to_thread(serve)
    finally:
        act.leave()


_vetting = threading.Lock()  # one delegate call at a time: an act's calls are counted and carved in order


def _delegate(act: gateway.Act, arguments: dict[str, Any]) -> dict[str, Any]:
    with _vetting:
        if act.ended.is_set() or act.stop.is_set():
            raise ToolError(
                "your act has ended (or the run is being stopped): no child run can start from it"
            )
        run = (
            Run.objects.select_related("instance", "instance__template", "owner")
            .filter(pk=act.run_id)
            .first()
        )
        if run is None or run.status != Run.Status.RUNNING:
            raise ToolError("your run is not running")
        earlier = list(act.delegated)
        try:
            vetted = delegation.check_call(run, arguments, earlier)
        except delegation.Refusal as exc:
            raise ToolError(str(exc)) from None
        number = len(earlier) + 1
        call = {
            "name": "delegate", "id": f"mcp_{act.iteration}_{number}", "input": vetted.as_input(), "delegate": True,
        }
        if not act.accept_delegate(call):
            raise ToolError("your act ended before this call was kept: no child run will start from it")
    return {
        "accepted": True,
        "call": call["id"],
        "to": vetted.to,
        "max_cost_usd": str(vetted.budget),
        "workspace": vetted.mode,
        "note": (
            f"delegate call {number} of this act is accepted. The child run starts when your act ends: exit now, "
            "or delegate more first. Your run then waits, without a worker, until every child started in this "
            "act has finished; their outcomes, answers, spend (and, for 'copy', patches) come in your next "
            "instruction on stdin."
        ),
    }


def _child(act: gateway.Act, run_id: int) -> dict[str, Any]:
    child = Run.objects.select_related("instance").filter(pk=run_id, parent_id=act.run_id).first()
    if child is None:
        raise ToolError(f"run {run_id} not found; this token reads only the runs your run delegated to")
    answer = child.iterations.order_by("-number").values_list("response", flat=True).first() or ""
    return {
        "id": child.pk,
        "parent": act.run_id,
        "instance": child.instance.name,
        "objective": child.objective,
        "status": child.status,
        "outcome": child.outcome or None,
        "verified": child.verified,
        "detail": child.outcome_detail,
        "iterations": child.iterations_done,
        "spent_usd": money.usd_string(child.spent_micros),
        "max_cost_usd": money.usd_string(child.max_cost_micros)
        if child.max_cost_micros is not None
        else None,
        "answer_excerpt": answer[-delegation_results.EXCERPT :],
    }


def build_server() -> MCPServer:
    """Return the act-scoped MCP server: `delegate` and `get_run`, for the act the request's token names."""
    server = TetherMCPServer("tether-act", instructions=INSTRUCTIONS)

    @server.tool()
    async def delegate(
        ctx: Context,
        to: Annotated[
            schemas.Target,
            Field(description="an instance of your owner (name or id), a template's name, or a role of your composition"),
        ],
        objective: Annotated[schemas.Objective, Field(description="what the child must achieve, self-contained")],
        max_cost_usd: Annotated[
            schemas.ChildCap, Field(description="the child's budget in US dollars (at least 0.01), carved from yours")
        ],
        max_iterations: Annotated[schemas.Iterations | None, Field(description="the child's turn limit")] = None,
        workspace: Annotated[
            Literal["own", "copy", "shared"] | None,
            Field(
                description="own (the default): the child's own; copy: a copy of yours (its changes come back as "
                "a patch); shared: yours (template targets only)"
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Hand a sub-objective to another agent as a child run of yours; it starts when your act ends."""
        act = _act(ctx)
        # Checked again by `delegation.check_call`, with the same schema (`loops.schemas.DelegateIn`).
        arguments: dict[str, Any] = {
            "to": to,
            "objective": objective,
            "max_cost_usd": str(max_cost_usd),
            "workspace": workspace,
        }
        if max_iterations is not None:
            arguments["max_iterations"] = max_iterations
        return await _call(act, lambda: _delegate(act, arguments))

    @server.tool()
    async def get_run(
        ctx: Context,
        run_id: Annotated[int, Field(ge=1, le=ID_MAX, description="a run your run delegated to")],
    ) -> dict[str, Any]:
        """Return a run your run delegated to: its status, outcome, verified flag, detail and spend."""
        act = _act(ctx)
        return await _call(act, lambda: _child(act, run_id))

    return server


class _Bridge:
    """The act server's ASGI app on an event loop of this process's own (a thread), fed one request at a time."""

    def __init__(self) -> None:
        self.server = build_server()
        self.app = self.server.streamable_http_app(
            streamable_http_path=PATH,
            json_response=True,
            stateless_http=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), name="tether-act-mcp", daemon=True).start()
        ready.wait(30)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def hold() -> None:
            async with self.server.session_manager.run():
                ready.set()
                await asyncio.Event().wait()  # as long as the process lives

        self.loop.create_task(hold())
        self.loop.run_forever()

    def exchange(self, scope: dict[str, Any], body: bytes) -> gateway.Answer:
        future = asyncio.run_coroutine_threadsafe(_exchange(self.app, scope, body), self.loop)
        return future.result(timeout=EXCHANGE_SECONDS)


async def _exchange(app: Any, scope: dict[str, Any], body: bytes) -> gateway.Answer:
    answered = asyncio.Event()
    given = False
    status, headers, chunks = 500, {}, []

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            headers.update(
                {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", [])}
            )
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                answered.set()

    await app(scope, receive, send)
    answered.set()
    headers.pop("content-length", None)
    return gateway.Answer(status, headers, b"".join(chunks))


_bridge = PerProcess(_Bridge)


def _refuse(status: int, message: str) -> gateway.Answer:
    headers = {"content-type": "application/json"}
    if status == 401:
        headers["www-authenticate"] = 'Bearer realm="tether-act"'
    return gateway.Answer(status, headers, json.dumps({"error": message}).encode())


def handle(
    method: str, path: str, headers: dict[str, str], raw: bytes, *, gone: Any = None
) -> gateway.Answer:
    """Answer one request to an act's `/mcp` (on the worker socket). `headers` are lower-cased."""
    if not gateway.token_from(headers):
        return _refuse(401, NO_TOKEN)
    try:
        act = gateway.act_for(headers)
    except gateway.GatewayError:
        return _refuse(401, "this token is not a live act's: an act's token dies when its act ends")
    if not act.may_delegate:
        return _refuse(403, "this act's instance does not enable the delegate tool")
    if len(raw) > MAX_BODY_BYTES:
        return _refuse(413, f"the request body is over {MAX_BODY_BYTES} bytes")
    route, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": PATH,
        "raw_path": PATH.encode(),
        "root_path": "",
        "query_string": query.encode("latin-1"),
        "headers": [
            (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items() if k != "content-length"
        ]
        + [(b"content-length", str(len(raw)).encode())],
        "client": ("127.0.0.1", 0),
        "server": ("tether-act", 80),
        "tether.act": act,
    }
    return _bridge.get().exchange(scope, raw)
