"""The run page keeps up with a person: actions redrawn on every state change, a stop named
for who asked it, one registry of event kinds, one way of counting iterations."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from loops import event_kinds, services
from loops.models import Run
from tests.console.conftest import ONE_ITERATION
from web.console import live
from web.console.display import EventView, RunView, worker_note

pytestmark = pytest.mark.django_db


def actions_of(html, run_id):
    match = re.search(rf'<section id="run-{run_id}-actions".*?</section>', html, re.S)
    assert match, "no actions block"
    return match.group(0)


def key_of(block):
    return re.search(r'data-actions="([^"]*)"', block).group(1)


# --- actions follow the run's state ------------------------------------------------------------------


def test_every_state_push_carries_the_actions_for_that_state(instance, start_run):
    run = start_run(instance)
    queued = actions_of(live.render_state(run), run.pk)
    assert 'hx-swap-oob="true"' in queued and "Send message" in queued and "Stop run" in queued
    assert "Close without answering" not in queued

    Run.objects.filter(pk=run.pk).update(status="waiting", outcome_detail="which framework?")
    run.refresh_from_db()
    waiting = actions_of(live.render_state(run), run.pk)
    assert "Send answer" in waiting and "Close without answering" in waiting
    assert key_of(waiting) != key_of(queued)

    Run.objects.filter(pk=run.pk).update(status="finished", outcome="max_iterations", finished_at=timezone.now())
    run.refresh_from_db()
    finished = actions_of(live.render_state(run), run.pk)
    assert "Continue as a new run" in finished and "Start another run" in finished
    assert "Send" not in finished and "Stop run" not in finished and "Close without" not in finished
    assert len({key_of(queued), key_of(waiting), key_of(finished)}) == 3


def test_the_same_state_gives_the_same_actions_key(instance, start_run):
    run = start_run(instance)
    Run.objects.filter(pk=run.pk).update(status="running", lease_token="t")  # a worker drives it
    run.refresh_from_db()
    before = RunView(run).actions_key
    assert before == RunView(Run.objects.get(pk=run.pk)).actions_key  # an update with nothing new keeps the block
    services.run_cancel(run=run, user=instance.owner)
    run.refresh_from_db()
    assert run.status == "running" and RunView(run).actions_key != before  # stopping: no more stop button
    assert "Stop run" not in actions_of(live.render_state(run), run.pk)


def test_the_page_gives_live_forms_a_csrf_token_to_use(signed_in, instance, start_run):
    run = start_run(instance)
    html = signed_in.get(f"/runs/{run.pk}/").content.decode()
    token = re.search(r'data-csrf="([^"]+)"', html)
    assert token and len(token.group(1)) >= 32
    state = live.render_state(run)  # rendered with no request: its forms carry no token of their own
    assert 'name="csrfmiddlewaretoken"' not in state or 'value=""' not in state


def test_a_htmx_post_with_the_token_in_a_header_is_accepted(user, instance, start_run):
    from django.test import Client

    run = start_run(instance)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    token = re.search(r'data-csrf="([^"]+)"', html).group(1)
    refused = client.post(f"/runs/{run.pk}/interject", {"text": "hi"}, headers={"HX-Request": "true"})
    assert refused.status_code == 403
    sent = client.post(
        f"/runs/{run.pk}/interject", {"text": "hi", "csrfmiddlewaretoken": ""},
        headers={"HX-Request": "true", "X-CSRFToken": token},
    )
    assert sent.status_code == 200 and "Sent" in sent.content.decode()


# --- stop: confirmed first, then shown as who stopped it ----------------------------------------------


@pytest.mark.parametrize(("configured", "drawn"), [(None, "20"), (1.5, "1.5")])
def test_the_pages_say_how_long_an_action_waits_for_an_answer(signed_in, instance, start_run, settings, configured,
                                                              drawn):
    """TETHER_CONSOLE_TIMEOUT_SECONDS reaches the script on <body> (a value that is no duration stops Tether
    at start: tests/ops/test_bad_settings.py)."""
    if configured is not None:
        settings.TETHER_CONSOLE_TIMEOUT_SECONDS = configured
    run = start_run(instance)
    assert f'<body data-request-timeout="{drawn}">' in signed_in.get(f"/runs/{run.pk}/").content.decode()


def test_stop_asks_for_confirmation_before_it_posts(signed_in, instance, start_run):
    run = start_run(instance)
    block = actions_of(signed_in.get(f"/runs/{run.pk}/").content.decode(), run.pk)
    confirm = re.search(r'<details class="stop-confirm[^"]*"[^>]*>\s*<summary[^>]*>Stop run…</summary>(.*?)</details>', block, re.S)
    assert confirm, "the stop button is not behind a confirmation"
    assert f'action="/runs/{run.pk}/stop"' in confirm.group(1) and "Yes, stop it" in confirm.group(1)
    assert "Keep it running" in confirm.group(1)


def test_a_stopped_run_reads_stopped_by_its_person_not_a_failed_decision(signed_in, user, instance, start_run, story):
    run = start_run(instance)
    story(run, ONE_ITERATION[:3])  # acting in iteration 1
    Run.objects.filter(pk=run.pk).update(lease_token="t", status="running")
    services.run_cancel(run=run, user=user)
    story(run, [
        ("act.finished", {"iteration": 1, "ok": False, "detail": "stopped", "usage": {}}),
        ("decision.made", {"iteration": 1, "verdict": "failed", "reason": "stopped mid-act"}),
        ("iteration.finished", {"iteration": 1, "cost_usd": "0", "duration_ms": 10}),
        ("run.finished", {"outcome": "cancelled", "detail": "stopped by a person during the act of iteration 1",
                          "iterations": 1, "spent_usd": "0"}),
    ])
    Run.objects.filter(pk=run.pk).update(
        status="finished", outcome="cancelled", finished_at=timezone.now(), lease_token=None,
        outcome_detail="stopped by a person during the act of iteration 1",
    )
    html = signed_in.get(f"/runs/{run.pk}/").content.decode()
    assert "Decision: failed" not in html
    decision = re.search(r'<article class="ev ev-decision-made([^"]*)".*?</article>', html, re.S)
    assert "tone-bad" not in decision.group(1) and "Stopped by ada" in decision.group(0)
    summary = re.search(r'<p class="outcome stopped" data-outcome>(.*?)</p>', html, re.S).group(1)
    assert "Stopped by ada." in summary and "During the act of iteration 1." in summary
    assert "Stop requested by ada" in html


# --- one registry of event kinds ---------------------------------------------------------------------------


def test_every_kind_the_code_records_is_in_the_registry():
    """The timeline can title every kind written (the scan of writers is `tests/loops/test_event_types.py`'s)."""
    from tests.loops.test_event_types import written_kinds

    kinds, _ = written_kinds()
    assert {"run.delegating", "run.delegated", "grade.finished", "protected.changed", "run.resumed"} <= kinds
    assert kinds - set(event_kinds.KINDS) == set()


def view(kind, data, stopped_by=None):
    return EventView(run_id=1, seq=1, kind=kind, at=timezone.now(), data=data, iteration=data.get("iteration"),
                     stopped_by=stopped_by)


@pytest.mark.parametrize(
    ("kind", "data", "title"),
    [
        ("run.delegating", {"iteration": 2, "calls": 2}, "Delegating: 2 delegate calls (the run waits for its children)"),
        ("run.delegated", {"iteration": 2, "children": [7, 8], "refused": []}, "Started 2 child runs"),
        ("run.delegated", {"children": [], "refused": [{"to": "x", "error": "too deep"}]}, "Started 0 child runs (1 call refused)"),
        ("run.resumed", {"reason": "children finished", "children": [7, 8]}, "Resumed: its children finished"),
        ("run.resumed", {"by": "ada", "reason": "budget"}, "Resumed by ada (budget raised)"),
        ("protected.changed", {"iteration": 1, "paths": ["tests/test_x.py"]},
         "Changed what grades it: tests/test_x.py (not verifiable without a person's review)"),
        ("grade.finished", {"iteration": 3, "verified": True, "outcome": "done", "review": False, "reasons": []}, "Graded: verified"),
        ("grade.finished", {"iteration": 3, "verified": False, "outcome": "retry", "review": False, "reasons": ["x"]},
         "Graded: the claimed done was not accepted; the agent goes on"),
        ("iteration.started", {"iteration": 4, "attempt": 2}, "Attempt 2 of iteration 4 (its last worker was lost)"),
        ("iteration.started", {"iteration": 4, "attempt": 1}, "Iteration 4"),
        ("act.started", {"iteration": 4}, "Act started"),
        ("act.finished", {"iteration": 4, "ok": False, "detail": "stopped mid-act"}, "Act stopped"),
        ("act.finished", {"iteration": 4, "ok": False, "detail": "exit status 1: boom"}, "Act failed"),
        ("decision.made", {"iteration": 1, "verdict": "failed", "reason": "stopped mid-act"}, "Stopped by bo (the act was cut short)"),
        ("run.finished", {"outcome": "cancelled"}, "Stopped by bo"),
        ("run.finished", {"outcome": "no_progress"}, "Finished: no progress"),
        ("stall.rewound", {"iteration": 8, "to": 2, "undo": "rollback-1", "added": 0, "modified": 3, "deleted": 1},
         "Progress stalled: the workspace was rewound to iteration 2, its best (4 paths restored; undo: rollback-1)"),
        ("stall.rewound", {"iteration": 8, "to": 2, "refused": "run 9 (x) is running on this workspace"},
         "Not rewound to iteration 2 after a stall (run 9 (x) is running on this workspace)"),
    ],
)
def test_each_kind_has_a_human_title(kind, data, title):
    shown = view(kind, data, stopped_by="bo").title
    assert shown.text + (f" ({shown.note})" if shown.note else "") == title


def test_the_timeline_draws_new_kinds_without_raw_json(signed_in, instance, start_run, story):
    run = start_run(instance)
    story(run, [
        *ONE_ITERATION,
        ("grade.finished", {"iteration": 1, "verified": False, "outcome": "done", "review": True,
                            "reasons": ["the judge was not sure"], "response_check": None, "judge": None}),
        ("run.delegating", {"iteration": 1, "calls": 1}),
        ("run.delegated", {"iteration": 1, "children": [run.pk], "refused": []}),
        ("run.resumed", {"reason": "children finished", "children": [run.pk]}),
    ])
    html = signed_in.get(f"/runs/{run.pk}/").content.decode()
    assert "Graded: done, not verified" in html and "the judge was not sure" in html
    assert '"reasons"' not in html and "&quot;reasons&quot;" not in html
    assert 'Resumed: its children finished</span>' not in html  # the children are linked
    assert f'<a href="/runs/{run.pk}/">run {run.pk}</a>' in html
    # grades, protected changes and delegation belong to their iteration (they fold with it)
    assert re.search(r'data-kind="grade.finished" data-iteration="1"', html)


def test_a_finished_timeline_says_nothing_is_still_acting(signed_in, instance, start_run, story):
    run = start_run(instance)
    story(run, ONE_ITERATION[:3])  # an act that never finished (its worker died, the run was stopped)
    Run.objects.filter(pk=run.pk).update(status="finished", outcome="crashed", finished_at=timezone.now())
    html = signed_in.get(f"/runs/{run.pk}/").content.decode()
    assert "Acting…" not in html and "Act started" in html
    assert 'data-live-run="false"' in html


# --- one way of counting ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "next_iteration", "word"),
    [
        ("queued", 1, "no iteration yet, up to 12"),
        ("running", 1, "iteration 1 of 12"),  # the one in progress
        ("running", 4, "iteration 4 of 12"),
        ("waiting", 4, "iteration 3 of 12"),  # the last finished
        ("queued", 4, "iteration 3 of 12"),
        ("finished", 13, "iteration 12 of 12"),
    ],
)
def test_iteration_word(instance, start_run, status, next_iteration, word):
    run = start_run(instance, max_iterations=12)
    run.status, run.next_iteration = status, next_iteration
    assert RunView(run).iteration_word == word


def test_the_run_page_fleet_and_history_count_the_same_way(signed_in, instance, start_run):
    run = start_run(instance, max_iterations=3)
    Run.objects.filter(pk=run.pk).update(status="running", next_iteration=1, lease_token="t",
                                         lease_expires_at=timezone.now() + timedelta(seconds=30))
    for url in (f"/runs/{run.pk}/", "/", "/history/", f"/instances/{instance.pk}/"):
        html = signed_in.get(url).content.decode()
        assert "iteration 1 of 3" in html, url
        assert "0 of 3" not in html, url
    Run.objects.filter(pk=run.pk).update(status="finished", outcome="failed", next_iteration=3, finished_at=timezone.now())
    for url in (f"/runs/{run.pk}/", "/", "/history/", f"/instances/{instance.pk}/"):
        html = signed_in.get(url).content.decode()
        assert "iteration 2 of 3" in html and "of 3 iterations" not in html, url


# --- a run whose worker vanished --------------------------------------------------------------------------------


def test_a_run_whose_worker_went_quiet_says_it_waits_for_a_worker(signed_in, instance, start_run, settings):
    settings.TETHER_LEASE_SECONDS = 30
    run = start_run(instance)
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(status="running", lease_token="t", lease_expires_at=now + timedelta(seconds=25))
    run.refresh_from_db()
    assert worker_note(run, now) is None  # renewed on time
    Run.objects.filter(pk=run.pk).update(lease_expires_at=now + timedelta(seconds=6))
    run.refresh_from_db()
    note = worker_note(run, now)
    assert note.seconds == 6 and "waiting for a worker to pick it up" in note.text
    html = signed_in.get(f"/runs/{run.pk}/").content.decode()
    assert re.search(r"waiting for a worker to pick it up \(lease expires in <span data-countdown=\"[^\"]+\">\d s</span>\)", html)
    Run.objects.filter(pk=run.pk).update(status="queued", lease_token=None, lease_expires_at=now - timedelta(seconds=1))
    run.refresh_from_db()
    assert "waiting for a worker to pick it up" in worker_note(run, now).text


# --- reading aids: the chart's scope, the timeline's tools ------------------------------------------------


def test_the_chart_says_which_iterations_it_shows_and_can_show_all(signed_in, instance, start_run):
    from loops.models import Iteration

    run = start_run(instance, max_iterations=100)
    now = timezone.now()
    Iteration.objects.bulk_create(
        Iteration(run=run, number=n, instruction="x", started_at=now, finished_at=now, cost_micros=n)
        for n in range(1, 71)
    )
    Run.objects.filter(pk=run.pk).update(next_iteration=71)
    html = signed_in.get(f"/runs/{run.pk}/").content.decode()
    assert "Showing iterations 11–70: the latest 60 of 70." in html
    assert f'href="?chart=all#run-{run.pk}-chart">Show all 70</a>' in html
    everything = signed_in.get(f"/runs/{run.pk}/?chart=all").content.decode()
    assert "Showing all 70 iterations." in everything and "Show all" not in everything
    assert everything.count('class="chart-col"') == 70 and html.count('class="chart-col"') == 60
    assert f'ws-connect="/ws/runs/{run.pk}/?chart=all"' in everything  # live updates keep showing all
    run.refresh_from_db()
    assert live.render_state(run, chart_all=True).count('class="chart-col"') == 70


def test_the_timeline_offers_follow_jump_and_folding(signed_in, instance, start_run, story):
    run = start_run(instance)
    story(run)
    html = signed_in.get(f"/runs/{run.pk}/").content.decode()
    assert "oldest first, newest at the bottom" in html
    assert f'href="#run-{run.pk}-latest">Jump to latest' in html and f'id="run-{run.pk}-latest"' in html
    assert "data-follow" in html and "data-fold-all" in html
    assert 'data-iter-toggle="1"' in html


# --- the receipt as a page -------------------------------------------------------------------------------


def test_the_receipt_is_a_readable_page_with_a_valid_signature_and_a_download(signed_in, user, instance, start_run):
    import json

    from reviews import receipts
    from reviews.models import Receipt

    run = start_run(instance)
    live_page = signed_in.get(f"/runs/{run.pk}/receipt")
    assert live_page.status_code == 404  # no receipt while it runs
    services.run_cancel(run=run, user=user)
    page = signed_in.get(f"/runs/{run.pk}/receipt")
    html = page.content.decode()
    assert page.status_code == 200 and "<h1>Receipt of run" in html
    assert 'data-signature="valid">signature valid' in html
    assert "Stopped by ada" in html and "write the report" in html
    assert '"signature"' not in html and "&quot;mac&quot;" not in html  # not a wall of JSON
    download = signed_in.get(f"/runs/{run.pk}/receipt.json")
    assert download.status_code == 200 and download["Content-Disposition"].startswith("attachment;")
    envelope = json.loads(download.content)
    assert receipts.verify(envelope).ok
    assert f'href="/runs/{run.pk}/receipt"' in signed_in.get(f"/runs/{run.pk}/").content.decode()

    stored = Receipt.objects.get(run=run)
    stored.envelope["receipt"]["outcome"] = "done"  # altered after signing
    stored.save()
    altered = signed_in.get(f"/runs/{run.pk}/receipt").content.decode()
    assert 'data-signature="invalid">signature not valid' in altered and "changed: outcome" in altered


def test_another_users_receipt_is_404(client, other_user, user, instance, start_run):
    run = start_run(instance)
    services.run_cancel(run=run, user=user)
    client.force_login(other_user)
    assert client.get(f"/runs/{run.pk}/receipt").status_code == 404
    assert client.get(f"/runs/{run.pk}/receipt.json").status_code == 404


# --- history: done verified apart from done unverified ----------------------------------------------------


def test_history_splits_done_verified_from_done_not_verified(signed_in, instance, start_run):
    now = timezone.now()
    for verified in (True, True, False):
        run = start_run(instance, objective=f"task {verified} {timezone.now().timestamp()}")
        Run.objects.filter(pk=run.pk).update(status="finished", outcome="done", verified=verified, finished_at=now)
    html = signed_in.get("/history/").content.decode()
    assert '<span class="badge">done, verified 2</span>' in html
    assert '<span class="badge">done, not verified 1</span>' in html
    assert '<span class="badge">done 3</span>' not in html
    only = signed_in.get("/history/?outcome=verified").content.decode()
    assert re.search(r"<strong data-total-runs>2</strong>", only)
    assert 'value="verified"' in only


def test_a_replayed_act_shows_which_calls_came_from_the_journal(signed_in, instance, start_run, story):
    run = start_run(instance)
    calls = [
        {"name": "write_file", "input": {"path": "a.txt"}, "is_error": False, "result": "wrote a.txt",
         "key": f"r{run.pk}-i1-t1-c0", "replayed": "result"},
        {"name": "run_command", "input": {"command": "sleep 20"}, "is_error": True, "result": "interrupted: …",
         "key": f"r{run.pk}-i1-t2-c0", "replayed": "interrupted"},
        {"name": "read_file", "input": {"path": "a.txt"}, "is_error": False, "result": "x", "key": f"r{run.pk}-i1-t3-c0"},
    ]
    story(run, [("act.finished", {"iteration": 1, "ok": True, "detail": "", "response": "", "tool_calls": calls})])
    html = signed_in.get(f"/runs/{run.pk}/").content.decode()
    tools = re.search(r'<ul class="tools ev-body">(.*?)</ul>', html, re.S).group(1)
    rows = re.findall(r"<li.*?</li>", tools, re.S)
    assert f'title="r{run.pk}-i1-t1-c0">write_file' in rows[0] and "replayed from the journal" in rows[0]
    assert "interrupted, effect unknown" in rows[1]
    assert "journal" not in rows[2] and "interrupted" not in rows[2]
