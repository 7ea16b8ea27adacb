"""The 1,504-event run page is under 20 KB on the wire (issue #26), and nothing is lost to get there.

The page shows the latest iterations; older events fold behind "Show earlier events", each part
linking the one before it. Following those links from the page gives every event exactly once, and
the page's `data-last-seq` (the live socket's `?after=SEQ`) is the run's last event, so the socket
neither repeats nor misses one.
"""

import gzip
import re

import pytest

from loops.models import Run
from tests.console.conftest import record

pytestmark = pytest.mark.django_db

GZIP = {"HTTP_ACCEPT_ENCODING": "gzip, deflate, br"}
EVENTS = 1504
SEQS = re.compile(r'<article[^>]*\sdata-seq="(\d+)"')
EARLIER = re.compile(r'href="(/runs/\d+/timeline\?before=\d+)"')


def iteration(i: int) -> list[tuple[str, dict]]:
    """One iteration as a real run records it: an act with a tool call and usage, checks, a decision."""
    return [
        (
            "iteration.started",
            {"iteration": i, "instruction": "make the failing test pass", "interjections": 0},
        ),
        ("act.started", {"iteration": i}),
        (
            "act.finished",
            {
                "iteration": i,
                "ok": True,
                "detail": "",
                "response": f"edited parser.py (attempt {i}); ran the tests",
                "tool_calls": [
                    {"name": "write_file", "input": {"path": "parser.py"}, "is_error": False, "result": "ok"}
                ],
                "usage": {"input_tokens": 1200 + i, "output_tokens": 300},
            },
        ),
        (
            "checks.finished",
            {
                "iteration": i,
                "checks": [
                    {
                        "name": "tests",
                        "required": True,
                        "passed": False,
                        "output": f"{i % 7 + 1} failed, {40 + i % 5} passed",
                    },
                ],
            },
        ),
        ("decision.made", {"iteration": i, "verdict": "continue", "reason": "a required check still fails"}),
        (
            "iteration.finished",
            {"iteration": i, "cost_usd": "0.004200", "duration_ms": 2100 + i, "act_ok": True},
        ),
    ]


def test_the_1504_event_run_page_is_under_20_kb_on_the_wire_and_folds_nothing_away(
    signed_in, instance, start_run
):
    run = start_run(instance, max_iterations=1000)
    run.refresh_from_db()
    items = [("run.claimed", {"iteration": 1, "worker": "w1", "attempt": 1})]
    i = 0
    while run.last_seq + len(items) < EVENTS:  # after what starting the run recorded
        i += 1
        items += iteration(i)
    assert record(run, items[: EVENTS - run.last_seq]) == EVENTS
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)

    zipped = signed_in.get(f"/runs/{run.pk}/", **GZIP)
    assert zipped.status_code == 200 and zipped["Content-Encoding"] == "gzip"
    assert len(zipped.content) < 20 * 1024, f"{len(zipped.content)} bytes on the wire"
    page = gzip.decompress(zipped.content).decode()
    assert f'data-last-seq="{EVENTS}"' in page  # the socket asks for what comes after the newest shown

    shown = [int(s) for s in SEQS.findall(page)]
    assert shown and shown[-1] == EVENTS and len(shown) < EVENTS  # the latest iterations; older ones folded
    seen = list(shown)
    link = EARLIER.search(page)
    while link:  # "Show earlier events", as far back as it goes
        part = signed_in.get(link.group(1).replace("&amp;", "&"))
        assert part.status_code == 200
        html = part.content.decode()
        seen = [int(s) for s in SEQS.findall(html)] + seen
        link = EARLIER.search(html)
    assert seen == list(range(1, EVENTS + 1))  # every event once, in order
