"""Every way an iteration ends goes through the policy (issue #25): a lead that delegates on every
turn is bounded like any run, its instructions do not grow, and the no-progress rules see
compositions (the same delegation again, the same refusal again).

The lead is Claude (the local Messages server scripts it with a responder that answers every
request the same way, as a model that lost the thread would); its children are scripted command
agents. Everything runs through the real runner, each run driven in this thread in turn.
"""

import json
import re

import pytest

from instances.models import Credential
from loops import continuation, services
from loops.models import Event, Iteration, Run
from tests.fakes.messages_server import MessagesServer, text, tool_use, tool_uses
from tests.loops.conftest import drive_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-ant-api03-ONEDOORTESTKEY-0123456789abcdefQRSTUV"
HELPER = "print('I helped with it')\n"
BUMP_AND_FAIL = (
    "n = pathlib.Path('.checked'); k = int(n.read_text()) + 1 if n.exists() else 1; n.write_text(str(k))\n"
    "print('check run', k); sys.exit(1)\n"
)


@pytest.fixture
def server():
    with MessagesServer(api_key=KEY) as running:
        yield running


@pytest.fixture
def lead(user, make_instance, script, server, price):
    """A Claude lead that may list, read and delegate, and a `helper` instance it owns."""
    credential = Credential.create_for(user, label="k", secret=KEY)

    def build(max_iterations, checks=(), tools=("list_files", "read_file", "delegate")):
        inst = make_instance(
            user, name="lead", brain="anthropic", decider="checks", base_url=server.url, credential=credential,
            model="claude-test-1", tools=list(tools), command=[],
            checks=list(checks), max_iterations=max_iterations,
        )
        inst.workspace_path().mkdir(parents=True, exist_ok=True)
        (inst.workspace_path() / "notes.txt").write_text("the lead's notes\n")
        make_instance(user, name="helper", command=script(HELPER), checks=[])
        return inst

    return build


def delegating(objective_of=lambda body: "help with the report"):
    """A model that calls `delegate` on every turn and never reads its children's results."""

    def answer(body):
        return tool_use("delegate", {"to": "helper", "objective": objective_of(body), "max_cost_usd": 0.05})

    return answer


def drive_tree(run, rounds=200):
    """Drive the lead and, whenever it waits, its children, until it finishes."""
    for _ in range(rounds):
        run = drive_in_thread(Run.objects.get(pk=run.pk))
        if run.status == "finished":
            return run
        for child in Run.objects.filter(parent=run).exclude(status="finished"):
            drive_in_thread(child)
        run.refresh_from_db()
        if run.status == "finished":
            return run
    raise AssertionError("the tree did not finish")


def begun(run):
    return sorted({e.data["iteration"] for e in Event.objects.filter(run=run, kind="iteration.started")})


def sizes(server):
    return [len(json.dumps(r.body)) for r in server.requests if r.path.startswith("/v1/messages")]


def test_a_runaway_lead_begins_at_most_max_iterations_and_ends_naming_the_bound(user, lead, server):
    server.responder = delegating()
    inst = lead(max_iterations=2)
    run = drive_tree(services.run_start(instance=inst, user=user, objective="write the report", max_cost_usd="3.00"))
    assert begun(run) == [1, 2]
    assert Iteration.objects.filter(run=run).count() == 2
    assert run.outcome == "max_iterations", run.outcome_detail
    assert "reached the iteration limit (2 of 2)" in run.outcome_detail
    assert "its 1 delegate call was not started: to 'helper' (help with the report)" in run.outcome_detail
    # The second iteration's delegation was not started: one child, from the first.
    assert Run.objects.filter(parent=run).count() == 1
    # Exactly one `iteration.finished` per begun iteration, and the run never driven again.
    assert Event.objects.filter(run=run, kind="iteration.finished").count() == 2
    first, second = sizes(server)
    assert second <= 1.2 * first, (first, second)


def test_the_resume_instruction_is_built_from_the_objective_and_this_rounds_results(user, lead, server, settings):
    settings.TETHER_DELEGATION_MAX_RUNS = 1000
    # A new objective each round (the iteration's number), so no no-progress rule stops the loop.
    server.responder = delegating(lambda body: "step " + re.findall(r"Iteration (\d+)\.", json.dumps(body))[-1])
    # 30 rounds: an instruction that carried the previous one would be about 30 times its second size.
    inst = lead(max_iterations=30)
    run = drive_tree(services.run_start(instance=inst, user=user, objective="write the report", max_cost_usd="50.00"))
    assert run.outcome == "max_iterations" and begun(run) == list(range(1, 31)), run.outcome_detail
    told = dict(Iteration.objects.filter(run=run).values_list("number", "instruction"))
    assert told[30].count("Go on with the objective") == 1  # never the previous instruction again
    assert len(told[30]) <= 1.2 * len(told[2]), (len(told[2]), len(told[30]))
    # Each round delegates another objective, so its iterations are not alike: the request grows only by
    # the compacted history of earlier iterations, which has a budget of its own (TETHER_CONTEXT_BUDGET_TOKENS,
    # about four characters a token), not by the instruction. (A lead that repeats itself: the next test.)
    requests, history = sizes(server), 4 * settings.TETHER_CONTEXT_BUDGET_TOKENS
    assert requests[-1] <= 1.2 * requests[1] + history, (requests[1], requests[-1])


def test_a_runaway_lead_sends_at_iteration_100_a_request_no_bigger_than_at_iteration_2(user, lead, server, settings):
    """A lead that scribbles in its notes and delegates the same objective on every turn, and hears the same
    answer each time. Its notes change, so no no-progress rule ends it: only the iteration limit does. Its
    history says once what went the same way 98 times, so its request stays the size of its second."""
    settings.TETHER_DELEGATION_MAX_RUNS = 1000

    def answer(body):
        number = re.findall(r"Iteration (\d+)\.", json.dumps(body))[-1]
        return tool_uses([
            ("write_file", {"path": "notes.txt", "content": f"asked for help again in iteration {number}\n"}),
            ("delegate", {"to": "helper", "objective": "help with the report", "max_cost_usd": 0.05}),
        ])

    server.responder = answer
    inst = lead(max_iterations=100, tools=["list_files", "read_file", "write_file", "delegate"])
    run = drive_tree(
        services.run_start(instance=inst, user=user, objective="write the report", max_cost_usd="50.00"), rounds=120,
    )
    assert run.outcome == "max_iterations" and begun(run) == list(range(1, 101)), run.outcome_detail
    # One request an iteration (the act ends with its delegate call), measured as the SDK sent it.
    sent = [len(r.raw) for r in server.requests if r.path == "/v1/messages"]
    assert len(sent) == 100
    assert sent[99] <= 1.2 * sent[1], (sent[1], sent[99])


def test_the_same_delegation_repeated_with_nothing_changed_ends_no_progress(user, lead, server):
    server.responder = delegating()
    inst = lead(max_iterations=10)
    run = drive_tree(services.run_start(instance=inst, user=user, objective="write the report", max_cost_usd="3.00"))
    assert run.outcome == "no_progress", run.outcome_detail
    assert (
        "the same delegation (to 'helper': 'help with the report') repeated with no change to the workspace or to "
        "its results (iterations 2 and 3)"
    ) in run.outcome_detail
    # Two rounds came back the same; the third was not started.
    assert begun(run) == [1, 2, 3] and Run.objects.filter(parent=run).count() == 2


def test_a_delegation_that_changes_the_workspace_is_not_a_repeat(user, lead, server, script):
    """The same call, but each round's results differ (the helper counts its runs): no no-progress stop."""
    server.responder = delegating()
    inst = lead(max_iterations=4)
    inst.__class__.objects.filter(name="helper").update(command=script(
        "n = pathlib.Path('count'); k = int(n.read_text()) + 1 if n.exists() else 1; n.write_text(str(k))\n"
        "print('helped, round', k)\n"
    ))
    run = drive_tree(services.run_start(instance=inst, user=user, objective="write the report", max_cost_usd="3.00"))
    assert run.outcome == "max_iterations", run.outcome_detail
    assert begun(run) == [1, 2, 3, 4]


def test_the_same_refused_delegation_three_times_in_a_row_ends_no_progress(user, lead, server, settings, script):
    """Refused in the act (its tool_result) or when the children start: the same refusal, 3 iterations in a row."""
    settings.TETHER_DELEGATION_MAX_RUNS = 1  # the lead's tree is full: every delegation is refused
    ask = delegating(lambda body: "step " + re.findall(r"Iteration (\d+)\.", json.dumps(body))[-1])

    def answer(body):
        last = body["messages"][-1]
        if last["role"] == "user" and any(b.get("type") == "tool_result" for b in last["content"]):
            return text("Then I will wait.")
        return ask(body)

    server.responder = answer
    # The check changes the workspace each time, so only the refusal rule can stop the run.
    inst = lead(max_iterations=10, checks=[{"name": "bump", "command": script(BUMP_AND_FAIL)}])
    run = drive_tree(services.run_start(instance=inst, user=user, objective="write the report", max_cost_usd="3.00"))
    assert run.outcome == "no_progress", run.outcome_detail
    assert "the same refusal 3 times in a row" in run.outcome_detail
    assert "this tree of runs already has 1, the limit" in run.outcome_detail
    assert begun(run) == [1, 2, 3] and not Run.objects.filter(parent=run).exists()


def test_the_same_refused_tool_call_three_times_in_a_row_ends_no_progress(user, lead, server, script):
    """A read outside the workspace is refused each time; the check changes the workspace, so only this rule fires."""

    def answer(body):
        last = body["messages"][-1]
        if last["role"] == "user" and any(b.get("type") == "tool_result" for b in last["content"]):
            return text("I could not read it.")
        return tool_use("read_file", {"path": "../../outside.txt"})

    server.responder = answer
    inst = lead(max_iterations=8, checks=[{"name": "bump", "command": script(BUMP_AND_FAIL)}])
    run = drive_tree(services.run_start(instance=inst, user=user, objective="write the report", max_cost_usd="3.00"))
    assert run.outcome == "no_progress", run.outcome_detail
    assert "the same refusal 3 times in a row: read_file refused: " in run.outcome_detail
    assert "unchanged" not in run.outcome_detail
    assert begun(run) == [1, 2, 3]


def test_a_question_on_the_last_iteration_ends_the_run_max_iterations_with_the_question(user, make_instance, script, drive, start):
    asking = "sys.stderr.write('TETHER_ESCALATE: which colour?\\n'); sys.exit(1)\n"
    inst = make_instance(user, command=script(asking), checks=[], max_iterations=1)
    run = drive(start(inst))
    assert run.outcome == "max_iterations", (run.status, run.outcome_detail)
    assert "reached the iteration limit (1 of 1)" in run.outcome_detail
    assert "its question for a person was not asked" in run.outcome_detail and "which colour?" in run.outcome_detail


def test_a_chain_of_continuations_does_not_grow_the_first_instruction():
    last = "x" * 50
    for number in range(1, 30):
        last = continuation.first_instruction(
            run_id=number, outcome="max_iterations", detail="reached the limit", carried=[], last_instruction=last,
        )
    assert len(last) <= 2600, len(last)
