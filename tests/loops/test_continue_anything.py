"""Continue any finished run: escalated, crashed, credential_error, provider_error, a verified done, a child.

Each outcome is reached the way a run reaches it where that is cheap (a scripted agent that asks a
person and is closed, the local Messages server refusing a key or failing), then continued with a
person's message and driven to its end. A credential error is continued only once the key works:
the provider is asked first (a free count_tokens) and, while the key still fails, nothing is
created or spent. A delegated child continued while its parent waits takes its place among the
parent's children, and the parent reads the continuation's result; once the parent no longer
waits, the person is told how the continuation ended (the notification path).
"""

import json
import threading

import anyio
import pytest
from django.test import Client as DjangoClient

from budgets import limits, metering
from budgets.models import Pool, Reservation
from budgets.services import instance_pool
from instances import gateway
from instances.models import Credential
from loops import services
from loops.models import Event, Interjection, Run
from reviews.models import Delivery, NotificationTarget
from tests.fakes.messages_server import MessagesServer, text, tool_use, tool_uses
from tests.loops import test_delegation as delegation_tests
from tests.loops.conftest import drive_in_thread
from web import mcp_act
from web.auth import make_token
from web.mcp_server import build_server, stdio_caller

family = (
    delegation_tests.family
)  # a Claude lead, its `helper` instance (a command agent), the `fixer` template

pytestmark = pytest.mark.django_db(transaction=True)

KEY = delegation_tests.KEY
WRONG_KEY = "sk-ant-api03-WRONGKEYWRONGKEY-0123456789abcdefWXYZ"
REPORT = "sys.exit(0 if pathlib.Path('REPORT.md').exists() else 1)\n"
ASKER = """
instruction = sys.stdin.read()
if 'Call it Ada' not in instruction:
    print('TETHER_ESCALATE: What should greeting.txt say?', file=sys.stderr)
    sys.exit(3)
pathlib.Path('greeting.txt').write_text('Ada')
print('wrote greeting.txt')
"""
GREETED = "sys.exit(0 if pathlib.Path('greeting.txt').exists() else 1)\n"
COUNTER = """
count = pathlib.Path('count')
n = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(n))
print(f'wrote part {n}: ' + sys.stdin.read()[-80:].replace(chr(10), ' '))
"""
PARTS = "n = int(pathlib.Path('count').read_text()); sys.exit(0 if n >= {n} else 1)\n"


@pytest.fixture
def server():
    with MessagesServer(api_key=KEY) as running:
        yield running


@pytest.fixture
def claude(user, make_instance, script, server, price):
    """A Claude agent on the local Messages server, with its own credential; done once REPORT.md exists."""
    credential = Credential.create_for(user, label="mine", secret=KEY)
    return make_instance(
        user,
        name="writer",
        brain="anthropic",
        decider="checks",
        base_url=server.url,
        credential=credential,
        model="claude-test-1",
        tools=["write_file"],
        command=[],
        checks=[{"name": "report", "command": script(REPORT), "required": True}],
        max_iterations=3,
    )


def write_report():
    return (
        tool_use("write_file", {"path": "REPORT.md", "content": "the report"}),
        text("REPORT.md is written."),
    )


def spent_and_held():
    """What every pool has spent and holds, and how many reservations were ever made."""
    return sorted(Pool.objects.values_list("pk", "spent", "reserved")), Reservation.objects.count()


def model_calls(server):
    return [r for r in server.requests if r.path == "/v1/messages"]


def sent_key(request):
    """The key a request carried (as a Bearer token or an x-api-key header, as the server reads it)."""
    bearer = request.headers.get("authorization", "")
    return (
        bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else request.headers.get("x-api-key")
    )


def key_checks(server):
    return [r for r in server.requests if r.path == "/v1/messages/count_tokens"]


# --- escalated, crashed, provider_error ------------------------------------------------------------


def test_an_escalated_run_closed_without_an_answer_is_continued_with_the_answer(user, make_instance, script):
    asker = make_instance(
        user,
        name="asker",
        command=script(ASKER),
        checks=[{"name": "greeted", "command": script(GREETED), "required": True}],
    )
    old = drive_in_thread(services.run_start(instance=asker, user=user, objective="write greeting.txt"))
    assert old.status == "waiting" and "What should greeting.txt say?" in old.outcome_detail
    old = services.run_close(run=old, user=user)
    assert old.outcome == "escalated"
    new = services.run_continue(run=old, user=user, message="Call it Ada")
    assert new.continued_from_id == old.pk and new.objective == old.objective
    new = drive_in_thread(new)
    assert (new.outcome, new.verified) == ("done", True), new.outcome_detail
    first = new.iterations.get(number=1).instruction
    assert first.startswith(
        f"This run continues run {old.pk}, which ended escalated: What should greeting.txt say?"
    )
    assert first.endswith("- Call it Ada")
    assert (asker.workspace_path() / "greeting.txt").read_text() == "Ada"


def test_a_crashed_run_is_continued(user, make_instance, script):
    counter = make_instance(
        user,
        name="counter",
        command=script(COUNTER),
        checks=[{"name": "parts", "command": script(PARTS.format(n=2)), "required": True}],
    )
    old = services.run_start(instance=counter, user=user, objective="write two parts")
    from loops.lifecycle import finish_run

    # How the runner ends a run whose iteration was claimed TETHER_MAX_ATTEMPTS times and never finished.
    (counter.workspace_path()).mkdir(parents=True, exist_ok=True)
    (counter.workspace_path() / "count").write_text("1")
    old = finish_run(old.pk, None, Run.Outcome.CRASHED, "iteration 2 was claimed 3 times and never finished")
    new = drive_in_thread(services.run_continue(run=old, user=user, message="go on from part 2"))
    assert (new.outcome, new.verified, new.iterations_done) == ("done", True, 1), new.outcome_detail
    assert new.iterations.get(number=1).instruction.startswith(
        f"This run continues run {old.pk}, which ended crashed: iteration 2 was claimed 3 times"
    )


def test_a_provider_error_run_is_continued_once_the_provider_answers(user, claude, server, settings):
    settings.TETHER_ANTHROPIC_RETRIES = 0
    server.enqueue_error(529, "Overloaded")
    old = drive_in_thread(services.run_start(instance=claude, user=user, objective="write REPORT.md"))
    assert old.outcome == "provider_error", old.outcome_detail
    server.enqueue(*write_report())
    new = drive_in_thread(services.run_continue(run=old, user=user, message="try again"))
    assert (new.outcome, new.verified) == ("done", True), new.outcome_detail
    assert key_checks(server) == []  # only a credential error asks the provider about the key first


# --- credential_error: continued once the key works, never spent on while it does not ---------------


def test_a_credential_error_is_continued_only_once_the_key_works_and_nothing_is_spent_before(
    user, claude, server
):
    credential = claude.credential
    credential.set_secret(WRONG_KEY)
    credential.save()
    old = drive_in_thread(
        services.run_start(instance=claude, user=user, objective="write REPORT.md", max_cost_usd="1.00")
    )
    assert old.outcome == "credential_error" and "rejected the API key" in old.outcome_detail
    calls, books = len(model_calls(server)), spent_and_held()

    with pytest.raises(services.Refused) as refused:  # still broken: refused, and nothing is made or spent
        services.run_continue(run=old, user=user, message="the key is fixed", max_cost_usd="0.50")
    assert refused.value.status == 409
    said = refused.value.message
    assert said.startswith(
        f"run {old.pk} ended credential_error, and the instance's key still does not work: "
    )
    assert "Anthropic rejected the API key (401" in said and "nothing was spent" in said
    assert WRONG_KEY not in said and WRONG_KEY[-12:] not in said
    assert Run.objects.count() == 1 and not Run.objects.filter(continued_from=old).exists()
    assert spent_and_held() == books and len(model_calls(server)) == calls  # no model call, no reservation
    [check] = key_checks(server)  # the one free question asked, with the instance's own key
    assert sent_key(check) == WRONG_KEY

    answer = DjangoClient().post(  # the same refusal through the API, as JSON
        f"/v1/instances/{claude.pk}/loop/{old.pk}/continue",
        data="{}",
        content_type="application/json",
        headers={"Authorization": f"Bearer {make_token(user)}"},
    )
    assert answer.status_code == 409 and "still does not work" in answer.json()["error"]
    assert Run.objects.count() == 1 and spent_and_held() == books

    credential.set_secret(KEY)  # the person fixes the key
    credential.save()
    server.enqueue(*write_report())
    new = services.run_continue(run=old, user=user, message="the key is fixed", max_cost_usd="0.50")
    assert sent_key(key_checks(server)[-1]) == KEY
    new = drive_in_thread(new)
    assert (new.outcome, new.verified, new.max_cost_micros) == ("done", True, 500_000), new.outcome_detail
    assert new.iterations.get(number=1).instruction.startswith(
        f"This run continues run {old.pk}, which ended credential error: Anthropic rejected the API key"
    )


# --- a verified done, followed up ---------------------------------------------------------------------


def test_a_verified_done_is_followed_up_with_the_message_as_its_objective(user, make_instance, script):
    counter = make_instance(
        user,
        name="counter",
        command=script(COUNTER),
        checks=[{"name": "parts", "command": script(PARTS.format(n=2)), "required": True}],
    )
    old = drive_in_thread(services.run_start(instance=counter, user=user, objective="write two parts"))
    assert (old.outcome, old.verified) == ("done", True), old.outcome_detail
    with pytest.raises(services.Refused, match="say what to do next in the message") as refused:
        services.run_continue(run=old, user=user)
    assert refused.value.status == 400 and Run.objects.count() == 1

    follow_up = "Now write a third part about testing"
    new = services.run_continue(run=old, user=user, message=follow_up, max_iterations=2)
    assert (new.objective, new.continued_from_id) == (follow_up, old.pk)
    assert not Interjection.objects.filter(run=new).exists()  # the message is the objective, not a message
    new = drive_in_thread(new)
    assert new.outcome == "done", new.outcome_detail
    first = new.iterations.get(number=1).instruction
    assert first.startswith(f"This run follows up on run {old.pk}, which ended done, and verified")
    assert first.endswith(f"Its work is done. What to do now (the objective of this run):\n{follow_up}")
    assert (counter.workspace_path() / "count").read_text() == "3"  # the workspace as the old run left it


# --- a delegated child --------------------------------------------------------------------------------


def delegate_two(server, then=()):
    server.enqueue(
        tool_uses(
            [
                delegation_tests.delegate("helper", "write the first half", 0.20),
                delegation_tests.delegate("helper", "write the second half", 0.20),
            ],
            say="Delegating.",
        ),
        *then,
    )


def test_a_child_continued_while_its_parent_waits_is_waited_for_and_its_result_reaches_the_parent(
    user, family, server
):
    delegate_two(
        server,
        then=[
            tool_use("write_file", {"path": "REPORT.md", "content": "fixed by both halves"}),
            text("The report is written."),
        ],
    )
    parent = drive_in_thread(
        services.run_start(instance=family, user=user, objective="write the report", max_cost_usd="1.00")
    )
    first, second = delegation_tests.children_of(parent)
    stopped = services.run_cancel(run=first, user=user)  # a person stops one child; the other runs on
    assert stopped.outcome == "cancelled"
    parent.refresh_from_db()
    assert parent.status == "waiting" and parent.delegation["children"] == [first.pk, second.pk]

    again = services.run_continue(run=stopped, user=user, message="write it after all", max_cost_usd="0.30")
    assert (again.parent_id, again.depth, again.continued_from_id, again.max_cost_micros) == (
        parent.pk,
        first.depth,
        first.pk,
        300_000,
    )
    parent.refresh_from_db()
    assert parent.delegation["children"] == [again.pk, second.pk]  # the parent waits for the continuation now
    assert str(again.pk) in parent.delegation["placed"] and str(first.pk) not in parent.delegation["placed"]
    told = Event.objects.get(run=parent, kind="run.child_continued")
    assert told.data == {"child": first.pk, "as": again.pk, "by": "ada"}
    # Its cap is carved from the parent's budget, as its children's are.
    parent_pool = Pool.objects.get(kind="run", run=parent)
    assert Pool.objects.get(kind="run", run=again).parent_id == parent_pool.pk
    assert Reservation.objects.get(carved__run=again).amount == 300_000

    again = drive_in_thread(again)
    assert (again.outcome, again.verified) == ("done", True), again.outcome_detail
    assert Run.objects.get(pk=parent.pk).status == "waiting"  # the second child still runs
    assert drive_in_thread(second).outcome == "done"
    parent.refresh_from_db()
    assert parent.status == "queued"  # resumed by the last of its children, the continuation among them
    assert f"run {again.pk} on helper: done (verified)" in parent.next_instruction
    assert f"run {first.pk} on" not in parent.next_instruction
    parent = drive_in_thread(parent)
    assert (parent.outcome, parent.verified) == ("done", True), parent.outcome_detail
    assert not Reservation.objects.filter(status="held").exists()
    assert not Delivery.objects.filter(
        event="run.child_result"
    ).exists()  # the parent heard it, not the person


def test_a_child_continued_after_its_parent_finished_tells_the_person(user, family, server, settings):
    settings.TETHER_NOTIFY_ATTEMPTS = 1
    NotificationTarget.objects.create(owner=user, kind="email", address="ada@example.com")
    server.enqueue(
        tool_uses([delegation_tests.delegate("helper", "write half", 0.20)]),
        tool_use("write_file", {"path": "REPORT.md", "content": "fixed without the helper"}),
        text("Done without it."),
    )
    parent = drive_in_thread(
        services.run_start(instance=family, user=user, objective="write the report", max_cost_usd="1.00")
    )
    (child,) = delegation_tests.children_of(parent)
    child = services.run_cancel(run=child, user=user)
    parent = drive_in_thread(Run.objects.get(pk=parent.pk))
    assert parent.outcome == "done", parent.outcome_detail

    again = services.run_continue(run=child, user=user, message="finish it anyway", max_cost_usd="0.40")
    assert (again.parent_id, again.continued_from_id) == (None, child.pk)  # a run of its own: nobody waits
    assert Pool.objects.get(kind="run", run=again).parent_id == instance_pool(child.instance).pk
    parent_events = Event.objects.filter(run=parent).count()
    again = drive_in_thread(again)
    assert again.outcome == "done", again.outcome_detail
    [told] = Delivery.objects.filter(event="run.child_result")
    assert told.run_id == again.pk
    assert told.payload["parent"]["id"] == parent.pk and told.payload["parent"]["outcome"] == "done"
    assert (told.payload["run"]["outcome"], told.payload["continued_from"]) == ("done", child.pk)
    assert Event.objects.filter(run=parent).count() == parent_events  # a finished run is never changed again


def test_a_childs_continuation_must_fit_what_its_waiting_parent_has_left(user, family, server):
    delegate_two(server)
    parent = drive_in_thread(
        services.run_start(instance=family, user=user, objective="o", max_cost_usd="0.50")
    )
    first, second = delegation_tests.children_of(parent)
    stopped = services.run_cancel(run=first, user=user)
    runs, books = Run.objects.count(), spent_and_held()
    with pytest.raises(services.Refused, match="does not fit") as refused:
        services.run_continue(run=stopped, user=user, max_cost_usd="0.45")
    assert refused.value.status == 400
    assert Run.objects.count() == runs and spent_and_held() == books
    assert Run.objects.get(pk=parent.pk).delegation["children"] == [first.pk, second.pk]


def test_a_continuations_fresh_cap_is_bounded_by_the_pools(user, make_instance, script):
    counter = make_instance(
        user,
        name="counter",
        command=script(COUNTER),
        checks=[{"name": "parts", "command": script(PARTS.format(n=9)), "required": True}],
    )
    limits.set_limit(instance_pool(counter), 1_000_000, "operator")
    old = services.run_cancel(run=services.run_start(instance=counter, user=user, objective="o"), user=user)
    with pytest.raises(services.Refused, match="does not fit|headroom|left") as refused:
        services.run_continue(run=old, user=user, max_cost_usd="5.00")
    assert refused.value.status == 400 and Run.objects.count() == 1
    new = services.run_continue(run=old, user=user, max_cost_usd="0.75")
    assert Pool.objects.get(kind="run", run=new).limit == 750_000


# --- abuse: another user, an agent's token ----------------------------------------------------------


def rest_continue(instance, run, token):
    return DjangoClient().post(
        f"/v1/instances/{instance.pk}/loop/{run.pk}/continue",
        data=json.dumps({"message": "mine now"}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


def mcp_continue(user, run):
    from mcp import Client

    async def go():
        async with Client(build_server(stdio_caller(user.pk))) as client:
            result = await client.call_tool("continue_run", {"run_id": run.pk, "message": "mine now"})
            return result.is_error, result.content[0].text

    return anyio.run(go)


@pytest.mark.parametrize(
    "outcome, verified",
    [
        ("escalated", None),
        ("crashed", None),
        ("provider_error", None),
        ("credential_error", None),
        ("done", True),
    ],
)
def test_another_user_cannot_continue_a_run_on_rest_or_mcp(
    user, other_user, make_instance, outcome, verified
):
    from loops.lifecycle import finish_run

    instance = make_instance(user, name="adas")
    old = services.run_start(instance=instance, user=user, objective="Ada's private objective")
    old = finish_run(old.pk, None, outcome, "ended for the test", verified)
    answer = rest_continue(instance, old, make_token(other_user))
    assert answer.status_code == 404 and answer.json() == {
        "error": f"run {old.pk} of instance {instance.pk} not found"
    }
    refused, said = mcp_continue(other_user, old)
    assert refused and "not found" in said and "private" not in said
    with pytest.raises(services.Refused, match="not found") as direct:
        services.run_continue(run=old, user=other_user, message="mine now")
    assert direct.value.status == 404
    assert Run.objects.count() == 1


def test_an_agents_token_cannot_continue_a_run_on_rest_or_mcp(user, family, server):
    from loops.lifecycle import finish_run

    done = services.run_start(instance=family, user=user, objective="the earlier work")
    done = finish_run(done.pk, None, "escalated", "closed")
    running = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    Run.objects.filter(pk=running.pk).update(status=Run.Status.RUNNING)
    meter = metering.RunMeter(running, 1)
    with gateway.open_act(
        family, run_id=running.pk, iteration=1, meter=meter, stop=threading.Event(), delegation=True
    ) as act:
        assert act is not None
        answer = rest_continue(family, done, act.token)  # an act's token is no API token
        assert answer.status_code == 401 and "not valid" in answer.json()["error"]
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "continue_run", "arguments": {"run_id": done.pk}},
            }
        ).encode()
        reply = mcp_act.handle(
            "POST",
            "/mcp",
            {
                "authorization": f"Bearer {act.token}",
                "accept": "application/json, text/event-stream",
                "content-type": "application/json",
            },
            body,
        )
    said = json.dumps(json.loads(reply.body))
    assert "continue_run" in said and ("Unknown tool" in said or "not found" in said.lower()), said
    assert not Run.objects.filter(continued_from=done).exists() and Run.objects.count() == 2
