"""The console's pages and forms: sign-in, ownership, CSRF, services, clear messages."""

import re
from datetime import timedelta

import pytest
from django.db.models import F
from django.test import Client
from django.utils import timezone

from loops.models import Event, Interjection, Run
from tests.console.conftest import ONE_ITERATION

pytestmark = pytest.mark.django_db


def page_urls(instance, run):
    return [
        "/",
        f"/instances/{instance.pk}/",
        f"/runs/{run.pk}/",
        f"/runs/{run.pk}/timeline?before=2",
        "/history/",
    ]


def form_urls(instance, run):
    return [
        f"/instances/{instance.pk}/start",
        f"/runs/{run.pk}/stop",
        f"/runs/{run.pk}/interject",
        f"/runs/{run.pk}/close",
        f"/runs/{run.pk}/resume",
    ]


def csrf_from(response) -> str:
    match = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', response.content)
    assert match, "the page has no CSRF token in its form"
    return match.group(1).decode()


# --- sign-in and ownership ------------------------------------------------------------------


def test_every_page_and_form_requires_sign_in(client, instance, start_run):
    run = start_run(instance)
    for url in page_urls(instance, run):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url
    for url in form_urls(instance, run):
        response = client.post(url, {"objective": "x", "text": "x", "max_iterations": 3})
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url
    assert Run.objects.count() == 1
    assert not Interjection.objects.exists()


def test_sign_in_page_signs_in_and_sign_out_signs_out(client, user):
    page = client.get("/login/")
    assert page.status_code == 200
    assert b"loginlink" in page.content
    bad = client.post("/login/", {"username": "ada", "password": "wrong"})
    assert bad.status_code == 200
    assert b"do not match" in bad.content
    good = client.post("/login/", {"username": "ada", "password": "pw-ada-123", "next": "/history/"})
    assert good.status_code == 302 and good["Location"] == "/history/"
    assert client.get("/").status_code == 200
    assert client.get("/logout/").status_code == 405  # signing out is a POST (CSRF-protected)
    out = client.post("/logout/")
    assert out.status_code == 302 and out["Location"] == "/login/"
    assert client.get("/").status_code == 302


def test_another_users_run_and_instance_are_404(client, other_user, instance, start_run):
    run = start_run(instance)
    client.force_login(other_user)
    for url in page_urls(instance, run):
        if url in ("/", "/history/"):
            continue
        assert client.get(url).status_code == 404, url
    for url in form_urls(instance, run):
        assert (
            client.post(url, {"objective": "take over", "text": "hi", "max_iterations": 3}).status_code == 404
        ), url
    run.refresh_from_db()
    assert run.cancel_requested_at is None and run.status == Run.Status.QUEUED
    assert Run.objects.count() == 1 and not Interjection.objects.exists()
    # The fleet and history pages do not list it either.
    assert b"write the report" not in client.get("/").content
    assert b"write the report" not in client.get("/history/").content


# --- CSRF ---------------------------------------------------------------------------------------


def test_forms_refuse_a_post_without_the_csrf_token(user, instance, start_run):
    run = start_run(instance)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    for url in form_urls(instance, run):
        response = client.post(url, {"objective": "sneaky", "text": "sneaky", "max_iterations": 3})
        assert response.status_code == 403, url
    assert client.post("/logout/").status_code == 403
    run.refresh_from_db()
    assert Run.objects.count() == 1 and run.cancel_requested_at is None
    assert not Interjection.objects.exists()


def test_forms_work_with_the_csrf_token_from_the_page(user, instance):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    page = client.get(f"/instances/{instance.pk}/")
    token = csrf_from(page)
    response = client.post(
        f"/instances/{instance.pk}/start",
        {"csrfmiddlewaretoken": token, "objective": "count to three", "max_iterations": 4},
    )
    assert response.status_code == 302
    run = Run.objects.get()
    assert response["Location"] == f"/runs/{run.pk}/"
    page = client.get(f"/runs/{run.pk}/")
    response = client.post(
        f"/runs/{run.pk}/interject", {"csrfmiddlewaretoken": csrf_from(page), "text": "use French"}
    )
    assert response.status_code == 302
    assert Interjection.objects.get().text == "use French"


def test_the_sign_in_form_needs_its_csrf_token(user):
    client = Client(enforce_csrf_checks=True)
    assert client.post("/login/", {"username": "ada", "password": "pw-ada-123"}).status_code == 403
    page = client.get("/login/")
    response = client.post(
        "/login/", {"username": "ada", "password": "pw-ada-123", "csrfmiddlewaretoken": csrf_from(page)}
    )
    assert response.status_code == 302


# --- start ---------------------------------------------------------------------------------------


def test_start_calls_the_service_and_opens_the_run(signed_in, instance):
    response = signed_in.post(
        f"/instances/{instance.pk}/start",
        {"objective": "  write the report  ", "max_iterations": 7, "max_cost_usd": "2.50", "max_minutes": 30},
    )
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert (run.objective, run.max_iterations, run.max_cost_micros) == ("write the report", 7, 2_500_000)
    assert run.deadline is not None
    started = Event.objects.get(run=run, kind="run.started")
    assert started.data["via"] == "console" and started.data["by"] == "ada"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"objective": "", "max_iterations": 3}, "the objective is empty"),
        ({"objective": "   ", "max_iterations": 3}, "the objective is empty"),
        (
            {"objective": "x" * 201, "max_iterations": 3},
            "objective is 201 characters; this instance accepts at most 200",
        ),
        ({"objective": "go", "max_iterations": "ten"}, "Max iterations must be a whole number"),
        ({"objective": "go", "max_iterations": 0}, "Max iterations must be at least 1"),
        ({"objective": "go", "max_iterations": 20000}, "Max iterations can be at most 10,000"),
        (
            {"objective": "go", "max_iterations": 3, "max_cost_usd": "lots"},
            "The cost cap must be an amount of dollars",
        ),
        (
            {"objective": "go", "max_iterations": 3, "max_cost_usd": "0"},
            "The cost cap must be a number of US dollars, like 2.50, from 0.01 to 1,000,000; got",
        ),
        (
            {"objective": "go", "max_iterations": 3, "max_minutes": "soon"},
            "The time limit must be a whole number",
        ),
    ],
)
def test_start_with_bad_input_shows_a_clear_message_and_keeps_the_text(signed_in, instance, fields, message):
    response = signed_in.post(f"/instances/{instance.pk}/start", fields)
    assert response.status_code == 400
    text = response.content.decode()
    assert message in text, text
    assert 'role="alert"' in text
    if fields["objective"].strip():
        assert fields["objective"][:50] in text  # what was typed is still there
    assert not Run.objects.exists()


def test_a_double_submitted_start_makes_one_run(signed_in, instance):
    page = signed_in.get(f"/instances/{instance.pk}/")
    nonce = re.search(rb'name="nonce" value="([0-9a-f]+)"', page.content).group(1).decode()
    form = {"objective": "write the report", "max_iterations": 3, "nonce": nonce}
    first = signed_in.post(f"/instances/{instance.pk}/start", form)
    second = signed_in.post(f"/instances/{instance.pk}/start", form)
    run = Run.objects.get()
    assert first["Location"] == second["Location"] == f"/runs/{run.pk}/"
    # Another tab's form (another nonce), same objective, seconds later: still one run.
    third = signed_in.post(f"/instances/{instance.pk}/start", {**form, "nonce": "f" * 32})
    assert third["Location"] == f"/runs/{run.pk}/"
    assert Run.objects.count() == 1
    # The same objective a while later is a new run.
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    signed_in.post(f"/instances/{instance.pk}/start", {**form, "nonce": "e" * 32})
    assert Run.objects.count() == 2


def test_instance_page_shows_the_count_settings_and_history(signed_in, instance, start_run):
    instance.env = {"API_TOKEN": "sk-very-secret"}
    instance.checks = [{"name": "pytest", "command": ["pytest"], "required": True}]
    instance.save()
    start_run(instance, objective="an earlier objective")
    text = signed_in.get(f"/instances/{instance.pk}/").content.decode()
    assert 'data-max-chars="200"' in text and "/ 200 characters" in text
    assert "an earlier objective" in text
    assert "pytest" in text and "API_TOKEN" in text
    assert "sk-very-secret" not in text


# --- stop, interject, close, resume ------------------------------------------------------------------


def test_stop_calls_the_service_and_a_second_stop_is_fine(signed_in, instance, start_run):
    run = start_run(instance)
    response = signed_in.post(f"/runs/{run.pk}/stop")
    assert response.status_code == 302
    run.refresh_from_db()
    assert (run.status, run.outcome) == ("finished", "cancelled")  # nobody was driving it
    again = signed_in.post(f"/runs/{run.pk}/stop", follow=True)
    assert again.status_code == 200
    assert b"had already finished (cancelled)" in again.content
    assert Event.objects.filter(run=run, kind="run.stop_requested").count() == 1


def test_stop_of_a_driven_run_is_requested_once(signed_in, instance, start_run):
    run = start_run(instance)
    Run.objects.filter(pk=run.pk).update(status="running", lease_token="held-by-a-worker")
    for _ in range(2):
        response = signed_in.post(f"/runs/{run.pk}/stop", headers={"HX-Request": "true"})
        assert response.status_code == 200
        assert b"Stopping" in response.content
        assert b"<html" not in response.content  # htmx gets the block alone
    run.refresh_from_db()
    assert run.cancel_requested_at is not None and run.status == "running"
    assert Event.objects.filter(run=run, kind="run.stop_requested").count() == 1


def test_interject_calls_the_service_and_drops_a_duplicate(signed_in, instance, start_run):
    run = start_run(instance)
    form = {"text": "use the new API", "nonce": "a" * 32}
    first = signed_in.post(f"/runs/{run.pk}/interject", form, headers={"HX-Request": "true"})
    assert first.status_code == 200 and b"Sent" in first.content
    again = signed_in.post(f"/runs/{run.pk}/interject", form, headers={"HX-Request": "true"})
    assert b"sent already" in again.content
    # A second device sending the same words at the same moment (its own nonce) is a repeat too.
    other = signed_in.post(
        f"/runs/{run.pk}/interject", {**form, "nonce": "b" * 32}, headers={"HX-Request": "true"}
    )
    assert b"sent already" in other.content
    interjection = Interjection.objects.get()
    assert interjection.text == "use the new API"
    assert Event.objects.get(run=run, kind="interjection.queued").data["via"] == "console"
    signed_in.post(f"/runs/{run.pk}/interject", {"text": "and keep it short", "nonce": "c" * 32})
    assert Interjection.objects.count() == 2


def test_interject_with_bad_input_shows_a_clear_message(signed_in, instance, start_run):
    run = start_run(instance)
    empty = signed_in.post(f"/runs/{run.pk}/interject", {"text": "  "})
    assert empty.status_code == 400 and b"The message is empty" in empty.content
    long = signed_in.post(f"/runs/{run.pk}/interject", {"text": "x" * 8001}, headers={"HX-Request": "true"})
    assert long.status_code == 200  # htmx swaps the block with its message
    assert b"The message is 8,001 characters; at most 8,000 are accepted." in long.content
    signed_in.post(f"/runs/{run.pk}/stop")
    finished = signed_in.post(f"/runs/{run.pk}/interject", {"text": "too late"})
    assert finished.status_code == 409
    assert b"already finished (cancelled); start a new run to continue the work" in finished.content
    assert not Interjection.objects.exists()


def test_an_answer_resumes_a_waiting_run_and_close_ends_one(signed_in, instance, start_run):
    run = start_run(instance)
    Run.objects.filter(pk=run.pk).update(status="waiting", outcome_detail="which database?", lease_token=None)
    page = signed_in.get(f"/runs/{run.pk}/").content.decode()
    assert "which database?" in page and "Send answer" in page and "Close without answering" in page
    response = signed_in.post(f"/runs/{run.pk}/interject", {"text": "PostgreSQL"}, follow=True)
    assert b"Answer sent" in response.content
    run.refresh_from_db()
    assert run.status == "queued"
    assert Event.objects.filter(run=run, kind="run.resumed").exists()

    second = start_run(instance, objective="another")
    Run.objects.filter(pk=second.pk).update(status="waiting", outcome_detail="which one?", lease_token=None)
    signed_in.post(f"/runs/{second.pk}/close")
    second.refresh_from_db()
    assert (second.status, second.outcome) == ("finished", "escalated")
    refused = signed_in.post(f"/runs/{second.pk}/close", follow=True)
    assert b"only a waiting run can be closed" in refused.content


def test_resume_is_refused_clearly_unless_the_budget_ran_out(signed_in, instance, start_run):
    run = start_run(instance)
    response = signed_in.post(f"/runs/{run.pk}/resume", follow=True)
    assert b"only a run that ended budget_exhausted can be resumed" in response.content


# --- the run page --------------------------------------------------------------------------------------


def test_run_page_draws_every_part_of_an_iteration(signed_in, instance, start_run, story):
    run = start_run(instance)
    story(run)
    story(
        run,
        [
            (
                "interjection.queued",
                {"id": 1, "text": "mind the <b>tests</b>", "by": "ada", "via": "console"},
            ),
            ("run.waiting", {"iteration": 1, "question": "which test framework?"}),
            ("run.resumed", {"by": "ada", "via": "console", "reason": "answered"}),
            ("run.reaped", {"iteration": 2}),
        ],
    )
    # A kind this Tether does not know (a newer one wrote it): the writer refuses it, the page still draws it.
    Run.objects.filter(pk=run.pk).update(last_seq=F("last_seq") + 1)
    Event.objects.create(run=run, seq=Run.objects.get(pk=run.pk).last_seq, kind="something.new", data={"x": 1},
                         created_at=timezone.now())
    story(
        run,
        [
            ("run.stop_requested", {"by": "ada", "via": "console"}),
            (
                "run.finished",
                {
                    "outcome": "no_progress",
                    "detail": "stuck",
                    "verified": None,
                    "iterations": 1,
                    "spent_usd": "0.001200",
                },
            ),
        ],
    )
    Run.objects.filter(pk=run.pk).update(status="finished", outcome="no_progress", finished_at=timezone.now())
    text = signed_in.get(f"/runs/{run.pk}/").content.decode()
    seqs = [
        int(s) for s in re.findall(r'<article class="ev [^"]*" id="run-\d+-ev-\d+" data-seq="(\d+)"', text)
    ]
    assert seqs == list(range(1, run.events.count() + 1))
    assert f'data-last-seq="{seqs[-1]}"' in text
    assert f'ws-connect="/ws/runs/{run.pk}/"' in text
    for expected in [
        "Iteration 1",
        "write the report",  # instruction
        "wrote report.md &lt;script&gt;alert(1)&lt;/script&gt;",  # response excerpt, escaped
        "write_file",  # tool call
        "Checks: 1 of 2 passed",
        "1 failed",  # check output
        "Decision: continue",
        "a test still fails",
        "Iteration 1 finished",
        "Cost $0.0012 in 1.5 s",  # cost and duration
        "mind the &lt;b&gt;tests&lt;/b&gt;",
        "which test framework?",
        "Finished: no progress",
        "Resumed by ada <small>(with their answer)</small>",
        "something.new",
        f"/v1/instances/{instance.pk}/loop/{run.pk}/events",
        '<svg class="chart"',
        "Spend and headroom",
        "Who did what",  # the audit trail from reviews
        "signed receipt",  # the run has finished
    ]:
        assert expected in text, expected
    assert "<script>alert(1)</script>" not in text


def test_run_page_shows_the_latest_window_and_earlier_events_on_demand(signed_in, instance, start_run, story):
    from loops import selectors

    run = start_run(instance)
    story(run, [(kind, {**data, "iteration": n}) for n in range(1, 61) for kind, data in ONE_ITERATION])
    run.refresh_from_db()
    text = signed_in.get(f"/runs/{run.pk}/").content.decode()
    seqs = [int(s) for s in re.findall(r'data-seq="(\d+)"', text)]
    assert seqs[-1] == run.last_seq and len(seqs) >= selectors.TIMELINE_WINDOW
    assert seqs == list(range(seqs[0], run.last_seq + 1))
    first_kind = Event.objects.get(run=run, seq=seqs[0]).kind
    assert first_kind == "iteration.started"  # the window starts at an iteration's start
    # "Show earlier" walks back a window at a time, each one ending where the one after it starts.
    shown, chunks = seqs, 0
    while (link := re.search(r'hx-get="[^"]*\?before=(\d+)"', text)) is not None:
        before = int(link.group(1))
        assert before == shown[0]
        text = signed_in.get(
            f"/runs/{run.pk}/timeline?before={before}", headers={"HX-Request": "true"}
        ).content.decode()
        assert "<html" not in text
        earlier = [int(s) for s in re.findall(r'data-seq="(\d+)"', text)]
        assert earlier == list(range(earlier[0], before))
        shown, chunks = earlier + shown, chunks + 1
    assert shown == list(range(1, run.last_seq + 1)) and chunks >= 2
    assert signed_in.get(f"/runs/{run.pk}/timeline?before=x").status_code == 400


def test_run_page_query_count_does_not_grow_with_events(
    signed_in, instance, start_run, story, django_assert_max_num_queries
):
    run = start_run(instance)
    story(run, [(kind, {**data, "iteration": n}) for n in range(1, 31) for kind, data in ONE_ITERATION])
    with django_assert_max_num_queries(15) as few:
        signed_in.get(f"/runs/{run.pk}/")
    story(run, [(kind, {**data, "iteration": n}) for n in range(31, 301) for kind, data in ONE_ITERATION])
    with django_assert_max_num_queries(len(few.captured_queries)):
        signed_in.get(f"/runs/{run.pk}/")


# --- fleet and history --------------------------------------------------------------------------------


def test_fleet_shows_instances_active_runs_and_what_needs_you(signed_in, user, instance, start_run):
    now = timezone.now()
    active = start_run(instance, objective="still working")
    waiting = start_run(instance, objective="asked a question")
    failed = start_run(instance, objective="gave up")
    unverified = start_run(instance, objective="done but unchecked")
    fine = start_run(instance, objective="all good")
    Run.objects.filter(pk=waiting.pk).update(status="waiting", outcome_detail="which branch?")
    Run.objects.filter(pk=failed.pk).update(
        status="finished", outcome="failed", outcome_detail="cannot", finished_at=now
    )
    Run.objects.filter(pk=unverified.pk).update(
        status="finished", outcome="done", verified=False, finished_at=now
    )
    Run.objects.filter(pk=fine.pk).update(status="finished", outcome="done", verified=True, finished_at=now)
    text = signed_in.get("/").content.decode()
    needs = text[text.index('id="fleet-needs"') : text.index('id="fleet-active"')]
    working = text[text.index('id="fleet-active"') : text.index('id="fleet-instances"')]
    for objective in ("asked a question", "gave up", "done but unchecked"):
        assert objective in needs
    assert "which branch?" in needs
    assert "all good" not in needs and "still working" not in needs
    assert "still working" in working and "gave up" not in working
    assert "scribe" in text and 'ws-connect="/ws/fleet/"' in text
    assert "Trust per template" in text and 'href="/reviews/"' in text
    assert active.pk


def test_history_filters_paginates_and_totals(signed_in, user, other_user, make_instance, start_run):
    first = make_instance(user, name="first")
    second = make_instance(user, name="second")
    theirs = make_instance(other_user, name="theirs")
    for n in range(30):
        run = start_run(first, objective=f"first objective {n}")
        Run.objects.filter(pk=run.pk).update(
            status="finished", outcome="done" if n % 2 else "failed", spent_micros=1000, next_iteration=3
        )
    old = start_run(second, objective="an old one")
    Run.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=40))
    start_run(theirs, objective="not mine")

    page = signed_in.get("/history/").content.decode()
    assert "not mine" not in page
    assert "<strong data-total-runs>31</strong>" in page
    assert "<strong data-total-spent>$0.03</strong>" in page
    assert "page 1 of 2" in page
    second_page = signed_in.get("/history/?page=2").content.decode()
    assert "an old one" in second_page

    done = signed_in.get(f"/history/?instance={first.pk}&outcome=done").content.decode()
    assert "<strong data-total-runs>15</strong>" in done
    assert "first objective 1" in done and "first objective 2<" not in done

    since = (timezone.now() - timedelta(days=7)).date().isoformat()
    recent = signed_in.get(f"/history/?since={since}").content.decode()
    assert "<strong data-total-runs>30</strong>" in recent and "an old one" not in recent
    until = (timezone.now() - timedelta(days=30)).date().isoformat()
    older = signed_in.get(f"/history/?until={until}").content.decode()
    assert "<strong data-total-runs>1</strong>" in older and "an old one" in older

    filtered = signed_in.get(f"/history/?instance={first.pk}&outcome=done&page=2").content.decode()
    assert "first objective 1" in filtered  # a page past the end shows the last page
    bad = signed_in.get("/history/?since=yesterday").content.decode()
    assert "Enter a valid date" in bad
    foreign = signed_in.get(f"/history/?instance={theirs.pk}").content.decode()
    assert "Select a valid choice" in foreign


def test_pages_have_no_fixed_widths_that_would_scroll_a_phone(signed_in, instance):
    text = signed_in.get(f"/instances/{instance.pk}/").content.decode()
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in text


def test_fleet_shows_five_of_a_kind_and_links_to_the_rest(signed_in, instance, start_run):
    now = timezone.now()
    for n in range(7):
        run = start_run(instance, objective=f"attempt {n}")
        Run.objects.filter(pk=run.pk).update(status="finished", outcome="crashed", finished_at=now)
    old = start_run(instance, objective="an old failure")
    Run.objects.filter(pk=old.pk).update(
        status="finished",
        outcome="failed",
        created_at=now - timedelta(days=9),
        finished_at=now - timedelta(days=9),
    )
    text = signed_in.get("/").content.decode()
    assert text.count('id="needs-row-') == 5
    assert "an old failure" not in text
    link = (
        re.search(r'href="(/history/\?outcome=stopped&amp;since=[0-9-]+)"', text)
        .group(1)
        .replace("&amp;", "&")
    )
    listed = signed_in.get(link).content.decode()
    assert "<strong data-total-runs>7</strong>" in listed and "an old failure" not in listed
    everything = signed_in.get("/history/?outcome=stopped").content.decode()
    assert "<strong data-total-runs>8</strong>" in everything


def test_line_breaks_count_once_against_the_objective_cap(signed_in, instance):
    objective = "line\r\n" * 39 + "end"  # the cap is 200: 198 characters typed, 237 sent as CRLF
    response = signed_in.post(
        f"/instances/{instance.pk}/start", {"objective": objective, "max_iterations": 3}
    )
    assert response.status_code == 302
    assert Run.objects.get().objective == "line\n" * 39 + "end"
