"""The `command` brain: an external program acts (an agent CLI, a script, a fixer).

Protocol (DESIGN.md): cwd = the workspace; the instruction on stdin; TETHER_RUN_ID,
TETHER_ITERATION, TETHER_OBJECTIVE_FILE, TETHER_USAGE_FILE in the environment plus
the variables the instance names, and nothing else of the platform's; stdout is the
response (capped); exit status 0 = the act succeeded; killed at the act timeout or
when the run is stopped. Usage the program reports in TETHER_USAGE_FILE is priced
by the ledger.
"""

from __future__ import annotations

import json
import tempfile
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from django.conf import settings

from instances.brains import process
from instances.brains.base import ActRequest, Reply, Usage


class CommandBrain:
    def __init__(self, instance: Any) -> None:
        self.instance = instance

    def act(self, request: ActRequest) -> Reply:
        argv = list(self.instance.command or [])
        if not argv:
            return Reply(ok=False, text="", detail="the instance has no command to run")
        request.workspace.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f"tether-run{request.run_id}-") as scratch:
            objective_file = Path(scratch) / "objective.txt"
            objective_file.write_text(request.objective)
            usage_file = Path(scratch) / "usage.json"
            env = process.base_env(request.workspace)
            env.update({str(k): str(v) for k, v in (self.instance.env or {}).items()})
            env.update(
                {
                    "TETHER_RUN_ID": str(request.run_id),
                    "TETHER_ITERATION": str(request.iteration),
                    "TETHER_OBJECTIVE_FILE": str(objective_file),
                    "TETHER_USAGE_FILE": str(usage_file),
                }
            )
            done = process.run(
                argv,
                cwd=request.workspace,
                env=env,
                stdin=request.instruction,
                timeout=request.timeout,
                stop=request.stop,
                cap=settings.TETHER_OUTPUT_CAP_BYTES,
            )
            usage = read_usage(usage_file)
        if done.spawn_error:
            return Reply(ok=False, text="", usage=usage, detail=done.spawn_error)
        if done.stopped:
            return Reply(ok=False, text=done.stdout, usage=usage, detail="stopped mid-act", stopped=True)
        if done.timed_out:
            detail = f"act timed out after {request.timeout:g}s and was killed"
            return Reply(ok=False, text=done.stdout, usage=usage, detail=detail, timed_out=True)
        ok = done.exit_code == 0
        detail = "" if ok else f"exit status {done.exit_code}: {done.stderr[-500:].strip()}"
        return Reply(ok=ok, text=done.stdout, usage=usage, detail=detail)


def read_usage(path: Path) -> Usage:
    """Read what the program reported spending; ignore a missing or malformed file."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return Usage()
    if not isinstance(raw, dict):
        return Usage()

    def count(key: str) -> int:
        value = raw.get(key, 0)
        return value if isinstance(value, int) and value >= 0 else 0

    cost = None
    if "cost_usd" in raw:
        try:
            dollars = Decimal(str(raw["cost_usd"]))
            if dollars >= 0:
                cost = int(dollars * 1_000_000)
        except InvalidOperation:
            pass
    return Usage(
        model=str(raw.get("model", ""))[:100],
        input_tokens=count("input_tokens"),
        output_tokens=count("output_tokens"),
        cache_write_tokens=count("cache_write_tokens"),
        cache_read_tokens=count("cache_read_tokens"),
        cost_micros=cost,
        calls=1,
    )
