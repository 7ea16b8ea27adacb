"""Continue a finished run: a new run linked to the old one, with its memory, its workspace and a message.

The agent is a scripted command: it counts its acts in the workspace (`count`), keeps every
instruction it was given (`instructions.log`), and the check passes once the count reaches 4.
A run limited to 2 iterations ends `max_iterations`; its continuation finds the count where the
old run left it and finishes `done` after two more acts.
"""

import json

import pytest
from django.forms.models import model_to_dict

from audit.models import AuditEntry
from loops import continuation, services
from loops.models import Event, Interjection, Iteration, Run

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = """
count = pathlib.Path('count')
n = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(n))
instruction = sys.stdin.read()
with open('instructions.log', 'a') as log:
    log.write(json.dumps({'run': os.environ['TETHER_RUN_ID'], 'n': n, 'instruction': instruction}) + '\\n')
print(f'wrote part {n} of the report')
"""
CHECK = "n = int(pathlib.Path('count').read_text()); print('parts', n); sys.exit(0 if n >= 4 else 1)"
MESSAGE = "Keep each part under a page, please"


@pytest.fixture
def counter(user, make_instance, script):
    return make_instance(
        user,
        name="reporter",
        command=script(AGENT),
        checks=[{"name": "parts", "command": script(CHECK), "required": True}],
        max_iterations=2,
    )


def frozen(run):
    """Everything of a run that continuing it must not touch: its row, events, iterations, messages."""
    run = Run.objects.get(pk=run.pk)
    return (
        model_to_dict(run),
        run.last_seq,
        run.finished_at,
        list(Event.objects.filter(run=run).values_list("seq", "kind", "data")),
        list(Iteration.objects.filter(run=run).values_list("number", "instruction", "response")),
        list(Interjection.objects.filter(run=run).values_list("pk", "text", "consumed_in_iteration")),
    )


def finished(run, outcome, verified=None, detail="ended for the test"):
    """Set a started run's end as the runner leaves it (for the outcomes no scripted agent reaches cheaply)."""
    from django.utils import timezone

    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.FINISHED, outcome=outcome, outcome_detail=detail, verified=verified,
        finished_at=timezone.now(), lease_expires_at=None,
    )
    run.refresh_from_db()
    return run


# --- the service ---------------------------------------------------------------------------------


def test_a_max_iterations_run_continues_with_its_history_workspace_and_message(counter, start, drive, user):
    old = drive(start(counter, objective="write the four-part report"))
    assert (old.outcome, old.iterations_done) == ("max_iterations", 2)
    before = frozen(old)

    new = services.run_continue(run=old, user=user, message=MESSAGE, max_iterations=5)
    assert (new.continued_from_id, new.objective, new.max_iterations, new.status) == (
        old.pk, old.objective, 5, "queued",
    )
    assert frozen(old) == before  # the old run is exactly as it was
    new = drive(new)
    assert (new.outcome, new.verified, new.iterations_done) == ("done", True, 2), new.outcome_detail
    assert frozen(old) == before
    old.refresh_from_db()
    assert old.continuation == new

    first = new.iterations.get(number=1).instruction
    assert f"This run continues run {old.pk}, which ended max iterations" in first
    assert "reached the iteration limit (2 of 2)" in first
    # What the old run did, iteration by iteration: what it was told and what it answered.
    assert f"- run {old.pk}, iteration 1: verdict continue; checks: parts FAILED;" in first
    assert "it answered: wrote part 1 of the report" in first
    assert "it answered: wrote part 2 of the report" in first
    # The person's message, folded in as a message is.
    assert first.endswith(f"A person sent these messages; take them into account first:\n- {MESSAGE}")
    # The agent itself read it (the instruction reached it on stdin), in the workspace the old run left.
    log = [json.loads(line) for line in (counter.workspace_path() / "instructions.log").read_text().splitlines()]
    assert [(int(e["run"]), e["n"]) for e in log] == [(old.pk, 1), (old.pk, 2), (new.pk, 3), (new.pk, 4)]
    assert "it answered: wrote part 2 of the report" in log[2]["instruction"] and MESSAGE in log[2]["instruction"]
    # Its memory: the old run's iterations numbered before its own (0 is the old run's last).
    snapshot = new.history["snapshot"]
    assert [(e["iteration"], e.get("from_run"), e.get("from_iteration")) for e in snapshot] == [
        (-1, old.pk, 1), (0, old.pk, 2), (1, None, None), (2, None, None),
    ]
    # Linked both ways in the events and the audit trail.
    started = Event.objects.get(run=new, kind="run.started")
    assert started.data["continued_from"] == old.pk
    entry = AuditEntry.objects.get(action="run.continue")
    assert (entry.run_id, entry.detail["continued_from"], entry.detail["message"]) == (new.pk, old.pk, MESSAGE)


@pytest.mark.parametrize(
    "outcome, verified",
    [("cancelled", None), ("max_iterations", None), ("no_progress", None), ("failed", None),
     ("timed_out", None), ("done", False), ("done", None), ("escalated", None), ("crashed", None),
     ("provider_error", None)],
)
def test_each_continuable_outcome_can_be_continued(counter, start, user, outcome, verified):
    old = finished(start(counter), outcome, verified)
    before = frozen(old)
    new = services.run_continue(run=old, user=user)
    assert new.continued_from_id == old.pk and new.status == "queued"
    assert new.max_iterations == old.max_iterations and new.max_cost_micros == old.max_cost_micros
    ended = "done, but not verified" if outcome == "done" else outcome.replace("_", " ")
    assert new.next_instruction.startswith(f"This run continues run {old.pk}, which ended {ended}: ended for the test")
    assert frozen(old) == before


@pytest.mark.parametrize(
    "outcome, verified, message, status, said",
    [
        ("budget_exhausted", None, "go on", 409, "ran out of budget; use resume"),
        ("done", True, "", 400, "is done and verified: to follow it up, say what to do next in the message"),
    ],
)
def test_finished_runs_that_cannot_be_continued_are_refused(
    counter, start, user, outcome, verified, message, status, said
):
    old = finished(start(counter), outcome, verified)
    before = frozen(old)
    with pytest.raises(services.Refused, match=said) as refused:
        services.run_continue(run=old, user=user, message=message)
    assert refused.value.status == status
    assert frozen(old) == before and Run.objects.count() == 1


@pytest.mark.parametrize(
    "status, said",
    [("queued", "is still queued"), ("running", "is still running"), ("waiting", "is waiting for a person")],
)
def test_a_run_that_has_not_finished_is_refused(counter, start, user, status, said):
    old = start(counter)
    Run.objects.filter(pk=old.pk).update(status=status)
    with pytest.raises(services.Refused, match=said) as refused:
        services.run_continue(run=old, user=user)
    assert refused.value.status == 409 and Run.objects.count() == 1


def test_a_budget_exhausted_run_is_still_resumed(counter, start, user, drive):
    old = finished(start(counter, max_cost_usd="0.50"), "budget_exhausted", detail="the run pool is spent")
    with pytest.raises(services.Refused, match="use resume"):
        services.run_continue(run=old, user=user)
    resumed = services.run_resume(run=old, user=user, max_cost_usd="1.00")
    assert (resumed.pk, resumed.status, resumed.continued_from_id) == (old.pk, "queued", None)


def test_a_run_is_continued_once(counter, start, user):
    old = finished(start(counter), "failed")
    new = services.run_continue(run=old, user=user)
    with pytest.raises(services.Refused, match=f"already continued as run {new.pk}; continue that one") as refused:
        services.run_continue(run=old, user=user)
    assert refused.value.status == 409
    finished(new, "failed")
    newer = services.run_continue(run=new, user=user)  # the chain goes on from the latest
    assert newer.continued_from_id == new.pk


def test_a_continued_run_no_longer_needs_you_its_continuation_does(counter, start, user):
    from loops import selectors

    old = finished(start(counter), "failed")
    unverified = finished(start(counter), "done", False)
    needs = selectors.needs_you(user)
    assert [r.pk for r in needs.failed] == [old.pk] and [r.pk for r in needs.unverified] == [unverified.pk]
    new = finished(services.run_continue(run=old, user=user), "failed")
    services.run_continue(run=unverified, user=user)
    needs = selectors.needs_you(user)
    assert [r.pk for r in needs.failed] == [new.pk] and needs.unverified == []


def test_another_users_run_is_not_found(counter, start, other_user):
    old = finished(start(counter), "failed")
    with pytest.raises(services.Refused, match=f"run {old.pk} not found") as refused:
        services.run_continue(run=old, user=other_user)
    assert refused.value.status == 404 and Run.objects.count() == 1


@pytest.mark.parametrize(
    "fields, said",
    [
        ({"max_iterations": 0}, "max_iterations must be a whole number from 1 to 10000"),
        ({"max_iterations": 10**30}, "max_iterations must be a whole number from 1 to 10000"),
        ({"max_cost_usd": "-1"}, "max_cost_usd must be more than 0 dollars"),
        ({"max_cost_usd": "1e30"}, "max_cost_usd must be a number of US dollars"),
        ({"max_minutes": 10**10}, "max_minutes must be a whole number of minutes from 1 to"),
        ({"message": "x" * 8001}, "message is 8,001 characters; at most 8,000"),
        ({"message": "a\x00b"}, "NUL"),
        ({"message": "a\ud800b"}, "lone surrogate"),
    ],
)
def test_bad_limits_and_messages_are_refused(counter, start, user, fields, said):
    old = finished(start(counter), "failed")
    with pytest.raises(services.Refused, match=said) as refused:
        services.run_continue(run=old, user=user, **fields)
    assert refused.value.status == 400 and Run.objects.count() == 1


def test_a_message_counts_crlf_as_one_character(counter, start, user):
    old = finished(start(counter), "failed")
    new = services.run_continue(run=old, user=user, message=("ab\r\n" * 2000).strip())  # 7,999 after CRLF → LF
    assert Interjection.objects.get(run=new).text == ("ab\n" * 2000).strip()


def test_the_limits_default_to_the_old_runs_and_can_be_changed(counter, start, user):
    old = finished(start(counter, max_iterations=7, max_cost_usd="0.25"), "no_progress")
    new = services.run_continue(run=old, user=user, max_iterations=3, max_cost_usd="1.5", max_minutes=30)
    assert (new.max_iterations, new.max_cost_micros) == (3, 1_500_000)
    assert new.deadline is not None
    from budgets.models import Pool

    assert Pool.objects.get(kind="run", run=new).limit == 1_500_000  # a pool of its own


# --- protected evidence carries over --------------------------------------------------------------

TAMPER_THEN_FIX = """
instruction = sys.stdin.read()
if 'This run continues run' in instruction:
    pathlib.Path('app.py').write_text('def add(a, b):\\n    return a + b\\n')
    print('fixed add')
else:
    pathlib.Path('tests/test_app.py').write_text('from app import add\\n\\nassert True\\n')
    print('All tests pass!')
"""
RUN_TESTS = (
    "sys.path.insert(0, os.getcwd())\nimport glob, runpy\n"
    "for f in sorted(glob.glob('tests/test_*.py')):\n    runpy.run_path(f)\n"
)


def test_a_continuation_of_a_run_that_changed_its_tests_is_never_verified(
    user, make_instance, script, start, drive, settings, tmp_path
):
    settings.TETHER_SNAPSHOTS = tmp_path / "snapshots"
    settings.TETHER_REVIEW_SAMPLE_PERCENT = 0
    instance = make_instance(
        user,
        command=script(TAMPER_THEN_FIX),
        checks=[{"name": "tests", "command": script(RUN_TESTS), "required": True}],
        protected_paths=["tests/**"],
        max_iterations=2,
    )
    workspace = instance.workspace_path()
    (workspace / "tests").mkdir(parents=True)
    (workspace / "app.py").write_text("def add(a, b):\n    return a - b\n")
    (workspace / "tests" / "test_app.py").write_text("from app import add\n\nassert add(2, 3) == 5\n")
    old = drive(start(instance, objective="make add(2, 3) return 5"))
    assert (old.outcome, old.verified, old.protected_changed) == ("done", False, ["tests/test_app.py"])
    new = drive(services.run_continue(run=old, user=user, message="fix app.py, not the test"))
    # Its own act changed no test, but the tests it is graded by are still the rewritten ones.
    assert (new.outcome, new.verified) == ("done", False), new.outcome_detail
    assert new.protected_changed == ["tests/test_app.py"]
    assert "changed what grades it (tests/test_app.py)" in new.outcome_detail


# --- what a continuation carries (pure) -----------------------------------------------------------


def test_carried_history_numbers_the_old_iterations_before_the_new_ones():
    history = {
        "snapshot": [{"iteration": 2, "instruction": "b"}, {"iteration": 3, "instruction": "c"}],
        "instructions": ["b", "c"],
        "progress": [["f", "s"]] * 3,
        "pending_approval": [{"name": "run_command"}],
    }
    carried = continuation.carried_history(history, run_id=5, iterations_done=3)
    assert carried == {
        "snapshot": [
            {"iteration": -1, "instruction": "b", "from_run": 5, "from_iteration": 2},
            {"iteration": 0, "instruction": "c", "from_run": 5, "from_iteration": 3},
        ]
    }  # no no-progress bookkeeping, no pending approvals: the new run is judged on its own iterations
    again = continuation.carried_history(
        {"snapshot": [*carried["snapshot"], {"iteration": 1, "instruction": "d"}]}, run_id=6, iterations_done=1
    )
    assert [(e["iteration"], e["from_run"], e["from_iteration"]) for e in again["snapshot"]] == [
        (-2, 5, 2), (-1, 5, 3), (0, 6, 1),
    ]
    assert continuation.carried_history({}, run_id=5, iterations_done=0) == {}


def test_the_first_instruction_shows_the_last_iterations_clipped():
    carried = [
        {"iteration": i - 12, "from_run": 9, "from_iteration": i, "instruction": f"step {i} " + "x" * 900,
         "response": f"did {i}", "checks": {"tests": i > 11}, "verdict": "continue"}
        for i in range(1, 13)
    ]
    text = continuation.first_instruction(
        run_id=9, outcome="no_progress", detail="no progress: repeats", carried=carried, last_instruction="step 12"
    )
    assert text.startswith("This run continues run 9, which ended no progress: no progress: repeats\n")
    assert "its last 8 iterations, oldest first; 4 earlier not shown" in text
    assert "- run 9, iteration 4:" not in text and "- run 9, iteration 5: verdict continue; checks: tests FAILED;" in text
    assert "- run 9, iteration 12: verdict continue; checks: tests passed;" in text
    assert text.endswith("The last instruction run 9 was given:\nstep 12")
    assert len(text) < 4000


# --- the API ----------------------------------------------------------------------------------------


@pytest.fixture
def api(client, user):
    from web.auth import make_token

    token = make_token(user)

    def call(method, path, body=None, raw=None, token=token):
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        return getattr(client, method)(
            path, data=data, content_type="application/json", headers={"Authorization": f"Bearer {token}"}
        )

    return call


def test_api_continues_a_run_and_links_both_ways(api, counter, start, drive, user):
    old = drive(start(counter))
    base = f"/v1/instances/{counter.pk}/loop"
    before = frozen(old)
    answer = api("post", f"{base}/{old.pk}/continue", {"max_iterations": 4, "max_cost_usd": "2.5", "message": MESSAGE})
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert (body["continued_from"], body["continued_as"], body["status"]) == (old.pk, None, "queued")
    assert (body["max_iterations"], body["max_cost_usd"]) == (4, "2.500000")
    assert frozen(old) == before
    assert api("get", f"{base}/{old.pk}").json()["continued_as"] == body["id"]
    listed = {r["id"]: (r["continued_from"], r["continued_as"]) for r in api("get", base).json()["runs"]}
    assert listed == {old.pk: (None, body["id"]), body["id"]: (old.pk, None)}
    new = drive(Run.objects.get(pk=body["id"]))
    assert new.outcome == "done" and MESSAGE in new.iterations.get(number=1).instruction
    again = api("post", f"{base}/{old.pk}/continue", {})
    assert again.status_code == 409 and f"already continued as run {new.pk}" in again.json()["error"]


def test_api_continue_without_a_body_uses_the_old_limits(api, counter, start, user):
    old = finished(start(counter, max_iterations=9), "cancelled")
    answer = api("post", f"/v1/instances/{counter.pk}/loop/{old.pk}/continue")
    assert answer.status_code == 201, answer.content
    assert answer.json()["max_iterations"] == 9 and not Interjection.objects.exists()


@pytest.mark.parametrize(
    "outcome, verified, status, said",
    [
        ("budget_exhausted", None, 409, "use resume"),
        ("done", True, 400, "done and verified: to follow it up, say what to do next"),
    ],
)
def test_api_refuses_what_cannot_be_continued(api, counter, start, outcome, verified, status, said):
    old = finished(start(counter), outcome, verified)
    answer = api("post", f"/v1/instances/{counter.pk}/loop/{old.pk}/continue", {} if verified else {"message": "go on"})
    assert answer.status_code == status and said in answer.json()["error"]
    assert Run.objects.count() == 1


def test_api_refuses_a_run_still_going(api, counter, start):
    old = start(counter)
    answer = api("post", f"/v1/instances/{counter.pk}/loop/{old.pk}/continue", {})
    assert answer.status_code == 409 and "is still queued" in answer.json()["error"]


def test_api_another_users_run_is_a_404(client, api, counter, start, other_user):
    from web.auth import make_token

    old = finished(start(counter), "failed")
    answer = api("post", f"/v1/instances/{counter.pk}/loop/{old.pk}/continue", {}, token=make_token(other_user))
    assert answer.status_code == 404 and answer.json() == {"error": f"run {old.pk} of instance {counter.pk} not found"}
    assert Run.objects.count() == 1


@pytest.mark.parametrize(
    "raw, said",
    [
        ('{"max_iterations": "5"}', "max_iterations must be a whole number, not str"),
        ('{"max_iterations": true}', "max_iterations must be a whole number, not true/false"),
        ('{"max_iterations": 100000000000000000000000000000}', "max_iterations must be a whole number from 1 to 10000"),
        ('{"max_cost_usd": "1e30"}', "max_cost_usd must be a number of US dollars"),
        ('{"max_cost_usd": 0.0000001}', "max_cost_usd must be a number of US dollars"),
        ('{"max_minutes": 10000000000}', "max_minutes must be a whole number of minutes from 1 to"),
        ('{"message": 5}', "message must be a string, not int"),
        ('{"message": "a\\u0000b"}', "NUL"),
        ('{"message": "a\\ud800b"}', "lone surrogate"),
        ('{"mesage": "typo"}', "unknown field(s): mesage"),
        ("[1]", "must be a JSON object"),
        ("{not json", "not valid JSON"),
    ],
)
def test_api_bad_fields_are_a_400_with_a_json_error(api, counter, start, raw, said):
    old = finished(start(counter), "failed")
    answer = api("post", f"/v1/instances/{counter.pk}/loop/{old.pk}/continue", raw=raw)
    assert answer.status_code == 400 and answer["Content-Type"] == "application/json"
    assert said in answer.json()["error"]
    assert Run.objects.count() == 1


def test_api_continue_is_post_only_and_documented(api, client, counter, start):
    old = finished(start(counter), "failed")
    answer = api("get", f"/v1/instances/{counter.pk}/loop/{old.pk}/continue")
    assert answer.status_code == 405 and "use POST" in answer.json()["error"]
    spec = client.get("/v1/openapi.json").json()
    operation = spec["paths"]["/v1/instances/{instance_id}/loop/{run_id}/continue"]["post"]
    assert set(operation["responses"]) >= {"201", "400", "404", "409"}
    assert set(spec["components"]["schemas"]["RunContinueIn"]["properties"]) == {
        "message", "max_iterations", "max_cost_usd", "max_minutes",
    }
    assert {"continued_from", "continued_as"} <= set(spec["components"]["schemas"]["Run"]["properties"])


# --- the CLI ----------------------------------------------------------------------------------------


def test_cli_continues_a_run_and_refuses_with_the_reason(counter, start, drive):
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    old = drive(start(counter))
    out = io.StringIO()
    call_command("loop", "continue", str(old.pk), "--message", MESSAGE, "--max-iterations", "3", stdout=out)
    new = Run.objects.get(continued_from=old)
    assert out.getvalue().strip() == f"run {new.pk} continues run {old.pk} (max_iterations) on instance {counter.pk}"
    assert new.max_iterations == 3 and Interjection.objects.get(run=new).text == MESSAGE
    assert AuditEntry.objects.get(action="run.continue").via == "cli"
    with pytest.raises(CommandError, match=f"already continued as run {new.pk}"):
        call_command("loop", "continue", str(old.pk), stdout=io.StringIO())
    with pytest.raises(CommandError, match=f"run {new.pk} is still queued"):
        call_command("loop", "continue", str(new.pk), stdout=io.StringIO())


def test_continuation_is_pure():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    probe = "import json, sys; before = set(sys.modules); import loops.continuation; print(json.dumps(sorted(set(sys.modules) - before)))"
    loaded = json.loads(
        subprocess.run(
            [sys.executable, "-c", probe], cwd=root, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout
    )
    assert [m for m in loaded if m.split(".")[0] in ("django", "datetime", "socket", "subprocess", "sqlite3")] == []
    # only the other pure modules: the run's memory, the policy (and its decisions) whose window it keeps,
    # and the ways a run can end
    assert sorted(m for m in loaded if m.startswith("loops.")) == [
        "loops.continuation", "loops.decision", "loops.memory", "loops.outcomes", "loops.policy"
    ]


@pytest.mark.parametrize(
    "outcome, verified",
    [("cancelled", None), ("max_iterations", None), ("no_progress", None), ("failed", None),
     ("timed_out", None), ("done", False)],
)
def test_api_continues_each_continuable_outcome(api, counter, start, outcome, verified):
    old = finished(start(counter), outcome, verified)
    before = frozen(old)
    answer = api("post", f"/v1/instances/{counter.pk}/loop/{old.pk}/continue", {"message": "go on"})
    assert answer.status_code == 201, answer.content
    assert answer.json()["continued_from"] == old.pk and frozen(old) == before


@pytest.mark.parametrize("status, said", [("running", "is still running"), ("waiting", "is waiting for a person")])
def test_api_refuses_a_running_or_waiting_run(api, counter, start, status, said):
    old = start(counter)
    Run.objects.filter(pk=old.pk).update(status=status)
    answer = api("post", f"/v1/instances/{counter.pk}/loop/{old.pk}/continue", {})
    assert answer.status_code == 409 and said in answer.json()["error"]
    assert Run.objects.count() == 1


def test_a_continued_run_carries_an_entry_for_iterations_alike_with_its_count():
    history = {"snapshot": [{"iteration": 99, "first": 2, "times": 98, "instruction": "the round's results",
                             "delegated": "to 'helper': 'help'", "refused": ["delegate refused: the tree is full"]}]}
    [entry] = continuation.carried_history(history, run_id=7, iterations_done=99)["snapshot"]
    assert (entry["iteration"], entry["first"], entry["from_iteration"], entry["times"]) == (0, -97, 99, 98)
    text = continuation.first_instruction(
        run_id=7, outcome="max_iterations", detail="reached the limit", carried=[entry], last_instruction="go"
    )
    assert (
        "- run 7, iteration 99 (and 97 earlier alike, since iteration 2): told: the round's results "
        "— it delegated to 'helper': 'help' — refused: delegate refused: the tree is full"
    ) in text
