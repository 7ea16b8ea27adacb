"""A database cut while Claude answers costs nothing: the meter reconnects, no model call is made twice."""

import pytest
from django.db import connection

from instances.templates_loader import create_instance
from loops import leases, runner, services
from loops.models import Event, Iteration
from tests.fakes.messages_server import text, tool_use, tool_uses
from tests.instances.conftest import KEY
from tests.loops.test_db_faults import FaultOnce

pytestmark = pytest.mark.django_db(transaction=True)


def usage(i, o):
    return {
        "input_tokens": i,
        "output_tokens": o,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


@pytest.mark.parametrize(
    ("where", "marker"),
    [
        ("settling a call", '"usage" = '),  # the meter's settle writes the call's tokens with its close
        ("reading the headroom", 'FROM "budgets_pool"'),
    ],
)
def test_a_cut_inside_an_act_is_retried_by_the_meter(where, marker, user, server, tmp_path, price, script):
    from instances.models import Credential

    key = Credential.create_for(user, label="mine", secret=KEY)
    check = script("sys.exit(0 if pathlib.Path('answer.py').read_text() == 'ANSWER = 42\\n' else 1)\n")
    inst = create_instance(
        owner=user,
        template="coder",
        name="coder",
        overrides={
            "base_url": server.url,
            "credential_id": key.pk,
            "model": "claude-test-1",
            "workspace": str(tmp_path / "ws"),
            "checks": [{"name": "answer", "command": check, "required": True}],
            "max_iterations": 3,
        },
    )
    inst.workspace_path().mkdir(parents=True, exist_ok=True)
    server.enqueue(
        tool_uses(
            [("write_file", {"path": "answer.py", "content": "ANSWER = 41\n"})], usage=usage(1500, 120)
        ),
        tool_use(
            "edit_file", {"path": "answer.py", "old_text": "41", "new_text": "42"}, usage=usage(200, 60)
        ),
        text("answer.py now holds ANSWER = 42.", usage=usage(90, 40)),
        tool_use(
            "record_decision", {"verdict": "done", "reason": "the answer check passes"}, usage=usage(900, 70)
        ),
    )
    run = services.run_start(instance=inst, user=user, objective="write answer.py holding ANSWER = 42")
    lease = leases.claim(run.pk, 1, "test-driver")
    fault = FaultOnce(marker, skip=1)  # the second such statement: mid-act, between two model calls
    with connection.execute_wrapper(fault):
        runner.drive(lease, slice_seconds=3600)
    run.refresh_from_db()

    assert fault.fired == 1, f"the cut while {where} never happened"
    assert (run.outcome, run.verified) == ("done", True), run.outcome_detail
    assert server.calls == 4  # no model call made twice
    assert run.spent_micros == (1500 + 200 + 90 + 900) * 3 + (120 + 60 + 40 + 70) * 15  # exact, nothing lost
    assert Iteration.objects.get(run=run, number=1).cost_micros == run.spent_micros
    assert Event.objects.filter(run=run, kind="run.claimed").count() == 1
    assert not Event.objects.filter(run=run, kind="run.reaped").exists()
