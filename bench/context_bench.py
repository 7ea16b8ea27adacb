"""Context size per iteration, and stop latency mid-act, for the anthropic brain.

Not a test. `python -m bench.context_bench` runs one long scripted run against the local
Messages API server (tests/fakes/messages_server.py, which counts about four characters a
token and simulates prompt caching at `cache_control` breakpoints): every iteration the
agent writes a file through a tool call, then reports. Tether's brain sees the objective,
the compacted history of every earlier iteration and the instruction; beside it, a naive
loop keeps one growing transcript of the same script. It prints the prompt tokens of the
act at iterations 1, 10, 50 and 200 (split into uncached input, cache reads and cache
writes for Tether), then the time from a stop request to the act's return while a model
call hangs.

No database is touched: the instance is an unsaved row, the key a throwaway one in this
process's environment.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ITERATIONS = 200
REPORT_AT = (1, 10, 50, 200)
KEY = "sk-ant-bench-local-0000000000000000"
OBJECTIVE = "Port the legacy billing package to the new framework."
TOOLS = ["list_files", "read_file", "write_file", "run_command"]
# The API caches prefixes of at least 1024 tokens (more on some models).
CACHE_MIN_TOKENS = 1024


def _setup() -> None:
    root = Path(__file__).resolve().parent.parent
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tether.settings")
    os.environ.setdefault("TETHER_HOME", tempfile.mkdtemp(prefix="tether-context-bench-"))
    os.environ["ANTHROPIC_API_KEY"] = KEY
    import django

    django.setup()
    from django.conf import settings

    settings.TETHER_ANTHROPIC_BACKOFF_SECONDS = 0.01


def _responder(body: dict[str, Any]) -> dict[str, Any]:
    """The scripted model: a tool call on the first turn of an iteration, a report on the second."""
    from tests.fakes.messages_server import text, tool_use

    last = body["messages"][-1]["content"]
    blocks = last if isinstance(last, list) else [{"type": "text", "text": last}]
    if any(b.get("type") == "tool_result" for b in blocks):
        return text(
            "I wrote the module for this step and its unit test, ran the suite (all green except the "
            "integration test that needs the next step), and noted two follow-ups in NOTES.md. " * 3
        )
    said = " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    step = said.rsplit("step ", 1)[-1].split()[0] if "step " in said else "x"
    return tool_use(
        "write_file",
        {"path": f"steps/step_{step}.py", "content": f"# step {step}\n" + "VALUE = 1\n" * 40},
        say=f"Working on step {step}.",
    )


def _instruction(i: int) -> str:
    return (
        f"Implement step {i} of the migration plan: port the next module, add its test, keep the suite green."
    )


def _prompt(usage: dict[str, int]) -> int:
    return usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]


def tether_run(server: Any, workspace: Path) -> dict[int, tuple[int, int, int, int]]:
    """Run the script through AnthropicBrain; return {iteration: (prompt, uncached, cache read, cache write)}."""
    from instances.brains.anthropic.act import AnthropicBrain
    from instances.brains.base import ActRequest
    from instances.models import Instance
    from loops import compaction

    instance = Instance(
        name="bench",
        brain="anthropic",
        model="claude-bench",
        base_url=server.url,
        tools=TOOLS,
        max_tool_turns=5,
    )
    history: list[dict[str, Any]] = []
    figures: dict[int, tuple[int, int, int, int]] = {}
    for i in range(1, ITERATIONS + 1):
        before = len(server.requests)
        reply = AnthropicBrain(instance).act(
            ActRequest(
                run_id=1,
                iteration=i,
                objective=OBJECTIVE,
                instruction=_instruction(i),
                workspace=workspace,
                stop=threading.Event(),
                timeout=60,
                snapshot=list(history),
                history=compaction.for_prompt(history),
            )
        )
        assert reply.ok, reply.detail
        usages = [r.reply["usage"] for r in server.requests[before:]]
        figures[i] = (
            sum(_prompt(u) for u in usages),
            sum(u["input_tokens"] for u in usages),
            sum(u["cache_read_input_tokens"] for u in usages),
            sum(u["cache_creation_input_tokens"] for u in usages),
        )
        # What the runner records per iteration (it also keeps only the last 20; here all are kept).
        history.append(
            {
                "iteration": i,
                "instruction": _instruction(i)[:500],
                "response": reply.text[-500:],
                "checks": {"tests": i % 4 != 0},
                "verdict": "continue",
            }
        )
    return figures


def naive_run(server: Any) -> dict[int, int]:
    """Run the same script as one growing transcript; return {iteration: prompt tokens of its act}."""
    from instances.brains.anthropic.act import DEFAULT_SYSTEM_PROMPT
    from instances.tools import definitions

    messages: list[dict[str, Any]] = []
    figures: dict[int, int] = {}
    tools = definitions(TOOLS)  # the same tools and prompt as Tether's agent
    system = f"{DEFAULT_SYSTEM_PROMPT}\n\nThe objective of this run:\n{OBJECTIVE}"
    for i in range(1, ITERATIONS + 1):
        messages.append({"role": "user", "content": [{"type": "text", "text": _instruction(i)}]})
        total = 0
        while True:
            reply = _post(
                server.url,
                {
                    "model": "claude-bench",
                    "max_tokens": 8192,
                    "tools": tools,
                    "system": system,
                    "messages": messages,
                },
            )
            total += _prompt(reply["usage"])
            messages.append({"role": "assistant", "content": reply["content"]})
            calls = [b for b in reply["content"] if b["type"] == "tool_use"]
            if not calls:
                break
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": c["id"],
                            "content": f"wrote {c['input']['path']}",
                        }
                        for c in calls
                    ],
                }
            )
        figures[i] = total
    return figures


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/v1/messages",
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "content-type": "application/json",
            "authorization": f"Bearer {KEY}",
            "anthropic-version": "2023-06-01",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def stop_latency(server: Any, workspace: Path, samples: int = 5) -> list[float]:
    """Return seconds from a stop request to the act's return while the model call hangs."""
    from instances.brains.anthropic.act import AnthropicBrain
    from instances.brains.base import ActRequest
    from instances.models import Instance
    from tests.fakes.messages_server import Delay, text

    instance = Instance(
        name="bench", brain="anthropic", model="claude-bench", base_url=server.url, tools=["read_file"]
    )
    latencies = []
    for _ in range(samples):
        server.enqueue(Delay(30, text("too late")))
        stop = threading.Event()
        stopped_at: list[float] = []

        def press(stop: threading.Event = stop, stopped_at: list[float] = stopped_at) -> None:
            stopped_at.append(time.monotonic())
            stop.set()

        threading.Timer(0.3, press).start()
        reply = AnthropicBrain(instance).act(
            ActRequest(
                run_id=2,
                iteration=1,
                objective="o",
                instruction="i",
                workspace=workspace,
                stop=stop,
                timeout=60,
            )
        )
        latencies.append(time.monotonic() - stopped_at[0])
        assert reply.stopped
    return latencies


def main() -> None:
    _setup()
    from tests.fakes.messages_server import MessagesServer

    with (
        tempfile.TemporaryDirectory(prefix="tether-bench-ws-") as scratch,
        MessagesServer(api_key=KEY, cache_min_tokens=CACHE_MIN_TOKENS) as server,
    ):
        server.responder = _responder
        began = time.monotonic()
        tether = tether_run(server, Path(scratch) / "tether")
        naive = naive_run(server)
        elapsed = time.monotonic() - began
        assert not server.problems, server.problems[:3]
        latencies = stop_latency(server, Path(scratch) / "stop")

    print(
        f"Context per iteration: prompt tokens of one act (2 model calls), {ITERATIONS}-iteration scripted run"
    )
    print(
        f"{'iteration':>9}  {'tether':>8}  {'uncached':>8}  {'cache read':>10}  {'cache write':>11}  {'naive':>8}  {'naive/tether':>12}"
    )
    for i in REPORT_AT:
        total, uncached, read, write = tether[i]
        print(
            f"{i:>9}  {total:>8}  {uncached:>8}  {read:>10}  {write:>11}  {naive[i]:>8}  {naive[i] / total:>12.1f}"
        )
    print(f"(both loops ran in {elapsed:.1f}s against the local server)")
    print(
        f"Stop latency mid-act (model call hanging): median {statistics.median(latencies) * 1000:.0f} ms, "
        f"max {max(latencies) * 1000:.0f} ms over {len(latencies)} stops"
    )


if __name__ == "__main__":
    main()
