"""The `command` brain: an external program acts (an agent CLI, a script, a fixer).

Protocol (README, "The `command` brain"): cwd = the workspace; the instruction on stdin; TETHER_RUN_ID,
TETHER_ITERATION, TETHER_OBJECTIVE_FILE, TETHER_USAGE_FILE in the environment plus
the variables the instance names, and nothing else of the platform's; stdout is the
response (capped); exit status 0 = the act succeeded; killed at the act timeout or
when the run is stopped. Usage the program reports in TETHER_USAGE_FILE is priced
by the ledger.

When the instance has a usable credential and the act is metered, the program also gets
the metering gateway (`instances.gateway`): a per-act token as ANTHROPIC_API_KEY and
ANTHROPIC_BASE_URL on its own loopback, so its model calls are metered like the Claude
brain's; a call the budget cannot pay ends the run `budget_exhausted`.

When the instance enables the `delegate` tool, the program gets the act's MCP endpoint too
(TETHER_MCP_URL on its own loopback, TETHER_TOKEN, the same per-act token): its `delegate`
calls are vetted as they come and handed to the loop as the act's tool calls when it ends,
which parks the run until the child runs finish (loops.delegation).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from django.conf import settings

from budgets import money
from instances import gateway, sandbox
from instances.brains import process
from instances.brains.base import ActRequest, BudgetExhausted, Reply, Usage
from instances.pinned import Pinned
from tether.redaction import redact

# The end of a failed act's stderr that its detail keeps (and the next instruction quotes).
STDERR_TAIL_CHARS = 500


def reported_spend_allowance() -> int:
    """Return what a command's act may report spending (TETHER_COMMAND_ITERATION_RESERVE_USD, default 0.05).

    Its model calls through the gateway are metered one by one; this covers only what it reports
    itself (`TETHER_USAGE_FILE`), and a report above it ends the run.
    """
    return money.usd_to_micros(str(settings.TETHER_COMMAND_ITERATION_RESERVE_USD))


class CommandBrain:
    def __init__(self, instance: Any) -> None:
        self.instance = instance

    def unmetered_reserve(self) -> int:
        return reported_spend_allowance()

    def act(self, request: ActRequest) -> Reply:
        argv = list(self.instance.command or [])
        if not argv:
            return Reply(ok=False, text="", detail="the instance has no command to run")
        request.workspace.mkdir(parents=True, exist_ok=True)
        metered = gateway.open_act(
            self.instance, run_id=request.run_id, iteration=request.iteration, meter=request.meter, stop=request.stop,
            delegation="delegate" in (self.instance.tools or []),
        )
        with tempfile.TemporaryDirectory(prefix=f"tether-run{request.run_id}-") as scratch, metered as act:
            Path(scratch, "objective.txt").write_text(request.objective)
            usage_file = Path(scratch) / "usage.json"
            # The program sees the scratch directory at SCRATCH when sandboxed.
            seen = Path(sandbox.SCRATCH) if sandbox.enabled() else Path(scratch)
            spec = sandbox.Spec(
                workspace=request.workspace,
                instance_id=self.instance.pk,
                network=bool(getattr(self.instance, "network", False)),
                binds=[sandbox.Bind(Path(scratch), sandbox.SCRATCH, writable=True)],
            )
            env = process.base_env(request.workspace)
            env.update({str(k): str(v) for k, v in (self.instance.env or {}).items()})
            env.update(
                {
                    "TETHER_RUN_ID": str(request.run_id),
                    "TETHER_ITERATION": str(request.iteration),
                    "TETHER_OBJECTIVE_FILE": str(seen / "objective.txt"),
                    "TETHER_USAGE_FILE": str(seen / "usage.json"),
                }
            )
            if act is not None and _startable(argv[0], env, request.workspace):
                # Model calls (and delegate calls) go through the gateway: the token is the only key
                # the program sees.
                socket_path = gateway.SOCKET if sandbox.enabled() else gateway.serve()
                if sandbox.enabled():
                    spec.binds.append(sandbox.Bind(Path(gateway.serve()), gateway.SOCKET))
                env.pop("ANTHROPIC_AUTH_TOKEN", None)
                env.update(act.env(socket_path))
                argv = gateway.wrap(argv, socket_path, act)
            done = process.run(
                argv,
                cwd=request.workspace,
                env=env,
                stdin=request.instruction,
                timeout=request.timeout,
                stop=request.stop,
                cap=settings.TETHER_OUTPUT_CAP_BYTES,
                spec=spec,
            )
            usage = read_usage(usage_file)
        delegated: list[dict[str, Any]] = []
        if act is not None:
            usage = usage.add(act.usage)  # the gateway's calls, metered and settled one by one
            delegated = list(act.delegated)  # final: the act has ended
        done.stdout, done.stderr = redact(done.stdout), redact(done.stderr)
        if act is not None and act.exhausted:
            raise BudgetExhausted(
                f"the agent's model calls spent the budget: {act.exhausted}", usage, text=done.stdout
            )
        if done.spawn_error:
            return Reply(ok=False, text="", usage=usage, detail=done.spawn_error)
        if done.stopped:
            return Reply(ok=False, text=done.stdout, usage=usage, detail="stopped mid-act", stopped=True)
        if done.timed_out:
            detail = f"act timed out after {request.timeout:g}s and was killed"
            if said := done.stderr[-STDERR_TAIL_CHARS:].strip():
                detail += f"; its stderr ended: {said}"
            return Reply(ok=False, text=done.stdout, usage=usage, detail=detail, timed_out=True, tool_calls=delegated)
        ok = done.exit_code == 0
        if ok:
            return Reply(ok=True, text=done.stdout, usage=usage, tool_calls=delegated)
        detail = f"exit status {done.exit_code}{_signal(done.exit_code)}: {done.stderr[-STDERR_TAIL_CHARS:].strip()}"
        return Reply(ok=False, text=done.stdout, usage=usage, detail=detail, tool_calls=delegated)


def _signal(exit_code: int | None) -> str:
    """Return " (SIGSEGV)" when an exit status says a signal ended the program, else ""."""
    if exit_code is None:
        return ""
    # Negative: killed by that signal; 128 + n: the sandbox (or a shell) reporting signal n.
    number = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else 0
    try:
        return f" ({signal.Signals(number).name})" if number else ""
    except ValueError:
        return ""


def _startable(program: str, env: dict[str, str], cwd: Path) -> bool:
    """Return whether `program` names an executable (else it is left to fail as itself, unwrapped)."""
    found = program if os.sep in program else shutil.which(program, path=env.get("PATH", ""))
    return found is not None and os.access(Path(cwd, found), os.X_OK)


MAX_USAGE_BYTES = 64 * 1024
MAX_REPORTED_TOKENS = 10**12  # more than any act reads or writes; a larger count would overflow the books


def read_usage(path: Path) -> Usage:
    """Read what the program reported spending; ignore a missing, malformed or oversized file.

    The program owns the file: it is read through its directory held open, never through a
    link, only if it is a regular file, and at most MAX_USAGE_BYTES of it (a FIFO, `/dev/zero`
    or a sparse file of gigabytes reads as no report).
    """
    try:
        with Pinned(path.parent) as scratch:
            data, size = scratch.read(path.name, MAX_USAGE_BYTES + 1)
        if size > MAX_USAGE_BYTES:
            return Usage()
        raw = json.loads(data)
    except (OSError, ValueError):
        return Usage()
    if not isinstance(raw, dict):
        return Usage()

    def count(key: str) -> int:  # a count past MAX_REPORTED_TOKENS is counted as that many, never as none
        value = raw.get(key, 0)
        return min(value, MAX_REPORTED_TOKENS) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    cost = _reported_cost(raw["cost_usd"]) if "cost_usd" in raw else None
    return Usage(
        model=str(raw.get("model", ""))[:100],
        input_tokens=count("input_tokens"),
        output_tokens=count("output_tokens"),
        cache_write_tokens=count("cache_write_tokens"),
        cache_read_tokens=count("cache_read_tokens"),
        cost_micros=cost,
        calls=1,
    )


def _reported_cost(value: Any) -> int | None:
    """Return a reported `cost_usd` as micro-dollars, rounded up; None if it is not a cost.

    A report beyond what Tether counts (even an infinite one) counts as the most it does:
    a cost is never under-counted because it was too large to read.
    """
    try:
        return money.usd_to_micros(value)
    except money.MoneyError:
        pass
    try:
        dollars = Decimal(str(value))
    except InvalidOperation:
        return None
    return money.MAX_MICROS if not dollars.is_nan() and dollars > 0 else None
