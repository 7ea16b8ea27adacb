"""Whole runs of a template agent through the runner, with Claude played by the local server."""

from decimal import Decimal

import pytest

from instances.templates_loader import create_instance
from loops import leases, runner, services
from loops.models import Event, Iteration, Run
from tests.fakes.messages_server import Error, text, tool_use, tool_uses
from tests.instances.conftest import KEY

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "claude-test-1"


def usage(i, o, w=0, r=0):
    return {"input_tokens": i, "output_tokens": o, "cache_creation_input_tokens": w, "cache_read_input_tokens": r}


@pytest.fixture
def coder(user, server, tmp_path, price, script):
    from instances.models import Credential

    key = Credential.create_for(user, label="mine", secret=KEY)
    check = script("sys.exit(0 if pathlib.Path('answer.py').read_text() == 'ANSWER = 42\\n' else 1)\n")

    def build(**overrides):
        values = {
            "base_url": server.url,
            "credential_id": key.pk,
            "model": MODEL,
            "workspace": str(tmp_path / "ws"),
            "checks": [{"name": "answer", "command": check, "required": True}],
            "max_iterations": 3,
            **overrides,
        }
        inst = create_instance(owner=user, template="coder", name="coder", overrides=values)
        inst.workspace_path().mkdir(parents=True, exist_ok=True)
        return inst

    return build


def drive(instance, objective="write answer.py holding ANSWER = 42"):
    run = services.run_start(instance=instance, user=instance.owner, objective=objective)
    lease = leases.claim(run.pk, run.next_iteration, "test-driver")
    assert lease is not None
    runner.drive(lease, slice_seconds=3600)
    run.refresh_from_db()
    return run


def resume(run):
    lease = leases.claim(run.pk, run.next_iteration, "test-driver")
    assert lease is not None
    runner.drive(lease, slice_seconds=3600)
    run.refresh_from_db()
    return run


def cost(*usages):
    micros = Decimal(0)
    for u in usages:
        micros += (
            u["input_tokens"] * Decimal(3) + u["output_tokens"] * Decimal(15)
            + u["cache_creation_input_tokens"] * Decimal("3.75") + u["cache_read_input_tokens"] * Decimal("0.30")
        )
    return int(micros.to_integral_value(rounding="ROUND_CEILING"))


def everything_recorded(run):
    rows = [str(e.data) for e in Event.objects.filter(run=run)]
    rows += [f"{i.response} {i.act_detail} {i.decision} {i.usage} {i.checks}" for i in Iteration.objects.filter(run=run)]
    rows += [run.outcome_detail, str(run.history), run.next_instruction]
    return "\n".join(rows)


def test_a_coder_run_edits_its_workspace_and_finishes_done_verified_at_the_exact_cost(coder, server):
    inst = coder()
    act_usage = [usage(1500, 120, 800, 0), usage(200, 60, 150, 800), usage(90, 40, 100, 950)]
    decide_usage = usage(900, 70, 0, 300)
    server.enqueue(
        tool_uses([("write_file", {"path": "answer.py", "content": "ANSWER = 41\n"})], say="Writing.",
                  usage=act_usage[0]),
        tool_use("edit_file", {"path": "answer.py", "old_text": "41", "new_text": "42"}, usage=act_usage[1]),
        text("answer.py now holds ANSWER = 42.", usage=act_usage[2]),
        tool_use("record_decision", {"verdict": "done", "reason": "the answer check passes"}, usage=decide_usage),
    )
    run = drive(inst)

    assert (run.status, run.outcome, run.verified) == ("finished", "done", True), run.outcome_detail
    assert (inst.workspace_path() / "answer.py").read_text() == "ANSWER = 42\n"
    assert server.calls == 4 and server.problems == []
    # The iteration is settled once, at the summed usage of its four calls, priced per token class.
    assert run.spent_micros == cost(*act_usage, decide_usage) == 16_973  # $0.016973
    assert Iteration.objects.get(run=run, number=1).cost_micros == run.spent_micros
    assert KEY not in everything_recorded(run)
    for received in server.requests:
        assert received.headers["authorization"] == f"Bearer {KEY}"


def test_a_refused_key_ends_the_run_as_credential_error_after_one_call(coder, server):
    server.enqueue(Error(401, "invalid x-api-key"))
    run = drive(coder())
    assert run.outcome == "credential_error", run.outcome_detail
    assert server.calls == 1
    assert "rejected the API key" in run.outcome_detail


def test_a_billing_refusal_ends_the_run_as_credential_error_after_one_call(coder, server):
    server.enqueue(Error(400, "Your credit balance is too low to access the Anthropic API."))
    run = drive(coder())
    assert run.outcome == "credential_error" and server.calls == 1


def test_an_unavailable_provider_ends_the_run_as_provider_error_after_bounded_retries(coder, server):
    server.responder = lambda body: Error(529, "Overloaded", "overloaded_error")
    run = drive(coder())
    assert run.outcome == "provider_error", run.outcome_detail
    assert server.calls == 4


def test_usage_before_a_failure_is_settled(coder, server):
    first = usage(1000, 100, 0, 0)
    server.enqueue(tool_use("list_files", {}, usage=first), Error(403, "forbidden"))
    run = drive(coder())
    assert run.outcome == "credential_error"
    assert run.spent_micros == cost(first)


def test_a_tool_needing_approval_parks_the_run_escalated(coder, server):
    server.enqueue(
        tool_use("run_command", {"command": "make deploy"}, say="Deploying."),
        tool_use("record_decision", {"verdict": "continue", "reason": "waiting for the deploy"}),
    )
    run = drive(coder(approval_tools=["run_command"]))
    assert run.status == "waiting", (run.status, run.outcome, run.outcome_detail)
    assert "needs approval: run_command" in run.outcome_detail
    assert server.calls == 1  # the act only: no checks or decider call for a parked run
    assert not (run.instance.workspace_path() / "deployed").exists()


def test_approving_a_parked_call_runs_it_and_resumes_the_run(coder, server, user):
    call = {"path": "answer.py", "content": "ANSWER = 42\n"}
    server.enqueue(tool_use("write_file", call, say="I need to write the answer."))
    run = drive(coder(approval_tools=["write_file"]))
    assert run.status == "waiting"
    assert not (run.instance.workspace_path() / "answer.py").exists()
    with pytest.raises(services.Refused, match="no tool call waiting"):
        services.run_interject(run=Run.objects.create(instance=run.instance, owner=user, objective="x", max_iterations=1), user=user, text="", approve=True)
    services.run_interject(run=run, user=user, text="go ahead", approve=True)
    run.refresh_from_db()
    assert run.status == "queued"
    server.enqueue(
        text("Wrote it."),
        tool_use("record_decision", {"verdict": "done", "reason": "the answer is written"}),
    )
    run = resume(run)
    assert (run.instance.workspace_path() / "answer.py").read_text() == "ANSWER = 42\n"
    assert (run.outcome, run.verified) == ("done", True)
    second = Iteration.objects.get(run=run, number=2)
    assert "approved: write_file" in second.instruction


def test_refusing_a_parked_call_tells_the_agent(coder, server, user):
    server.enqueue(tool_use("run_command", {"command": "make deploy"}))
    run = drive(coder(approval_tools=["run_command"]))
    services.run_interject(run=run, user=user, text="not on a Friday", approve=False)
    server.enqueue(text("Understood."), tool_use("record_decision", {"verdict": "failed", "reason": "deploy refused"}))
    run = resume(run)
    assert run.outcome == "failed"
    assert "refused: run_command" in Iteration.objects.get(run=run, number=2).instruction
    assert "not on a Friday" in Iteration.objects.get(run=run, number=2).instruction


def test_a_run_without_a_key_is_refused_up_front(user, tmp_path, price):
    inst = create_instance(owner=user, template="coder", name="keyless", overrides={"workspace": str(tmp_path)})
    with pytest.raises(services.Refused, match="no Anthropic API key"):
        services.run_start(instance=inst, user=user, objective="anything")
    assert not Run.objects.filter(instance=inst).exists()


def test_a_nul_in_what_the_model_writes_is_kept_as_a_replacement_character(coder, server):
    """PostgreSQL's text and JSON cannot hold a NUL: the model's reply, tool call and decision keep U+FFFD."""
    inst = coder()
    server.enqueue(
        tool_use("write_file", {"path": "answer.py", "content": "ANSWER = 42\n", "note": "a\x00b"}, usage=usage(10, 5)),
        text("Wrote answer.py \x00 there.", usage=usage(10, 5)),
        tool_use("record_decision", {"verdict": "done", "reason": "it passes \x00 now"}, usage=usage(10, 5)),
    )
    run = drive(inst)

    assert (run.status, run.outcome) == ("finished", "done"), run.outcome_detail  # the journal took the call
    act = Event.objects.get(run=run, kind="act.finished").data
    assert act["response"] == "Wrote answer.py \ufffd there."
    assert "\x00" not in str(act["tool_calls"])
    decided = Event.objects.get(run=run, kind="decision.made").data
    assert decided["reason"] == "it passes \ufffd now"
    assert Iteration.objects.get(run=run, number=1).response == "Wrote answer.py \ufffd there."
    assert (inst.workspace_path() / "answer.py").read_text() == "ANSWER = 42\n"
