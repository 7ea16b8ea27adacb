"""Hard caps: every model call reserves its worst case before it goes out, through the real runner.

Claude is played by the local Messages server (the real `anthropic` SDK talks to it). Like a
real provider it never writes more than the request's `max_tokens`, and it counts the input
tokens from the request itself. For every metered run and every pool: `spent <= limit` at
every ledger entry (the balances each entry recorded), `spent == Σ settled`, and nothing is
held at the end.
"""

import threading

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from budgets import limits, selectors
from budgets import services as budget_services
from budgets.models import LedgerEntry, Pool, Reservation
from instances.models import Credential
from loops import services
from loops.models import Run
from tests.fakes.messages_server import MessagesServer, tool_use
from tests.loops.conftest import drive_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-ant-api03-METERINGTESTKEY-0123456789abcdefQRST"


def replies(server, *, turns, output_tokens, stop_after=None, on_call=None):
    """Answer every request with a tool call (until `turns`), never beyond its max_tokens."""
    seen = {"n": 0}

    def respond(body):
        seen["n"] += 1
        if on_call is not None:
            on_call(seen["n"])
        used = min(output_tokens, int(body["max_tokens"]))
        if seen["n"] > turns:
            return {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn",
                    "usage": {"output_tokens": used}}
        reply = tool_use("list_files", {"path": "."}, say="looking")
        reply["usage"] = {"output_tokens": used}
        return reply

    server.responder = respond
    return seen


def claude_instance(user, make_instance, server, **fields):
    credential = Credential.create_for(user, label="mine", secret=KEY)
    fields.setdefault("max_tool_turns", 50)
    fields.setdefault("max_output_tokens", 200_000)
    inst = make_instance(
        user, brain="anthropic", decider="checks", base_url=server.url, credential=credential,
        model="claude-test-1", tools=["list_files"], command=[], checks=[], **fields,
    )
    inst.workspace_path().mkdir(parents=True, exist_ok=True)
    return inst


def assert_books_hold(run):
    """spent <= limit at every entry of every pool; Σ settled == spent; nothing held."""
    assert not Reservation.objects.filter(run_id=run.pk, status="held").exists()
    for pool in Pool.objects.all():
        for entry in LedgerEntry.objects.filter(pool=pool).order_by("pk"):
            if entry.limit_after is not None:
                assert entry.spent_after <= entry.limit_after, (pool.name, entry.kind, entry.spent_after)
                assert entry.spent_after + entry.reserved_after <= entry.limit_after or entry.kind != "reserve"
    assert selectors.audit_pools() == []
    assert run.spent_micros == sum(
        Reservation.objects.filter(run_id=run.pk).values_list("actual", flat=True)
    )


def test_a_thirty_cent_cap_holds_against_twenty_tool_turns(user, make_instance, price):
    with MessagesServer(api_key=KEY) as server:
        inst = claude_instance(user, make_instance, server)
        replies(server, turns=20, output_tokens=4000)
        run = drive_in_thread(services.run_start(instance=inst, user=user, objective="look", max_cost_usd="0.30"))
    assert run.outcome == Run.Outcome.BUDGET_EXHAUSTED, run.outcome_detail
    assert run.spent_micros <= 300_000
    assert run.spent_micros > 150_000  # it worked until the cap, not refusing up front
    calls = Reservation.objects.filter(run_id=run.pk, call__gt=0)
    assert calls.count() >= 3 and all(r.model == "claude-test-1" for r in calls)
    assert all(r.usage["output_tokens"] > 0 and r.actual <= r.amount for r in calls)
    assert_books_hold(run)


def test_max_tokens_is_clamped_to_what_the_headroom_can_pay(user, make_instance, price):
    with MessagesServer(api_key=KEY) as server:
        inst = claude_instance(user, make_instance, server)
        replies(server, turns=50, output_tokens=3000)
        run = drive_in_thread(services.run_start(instance=inst, user=user, objective="look", max_cost_usd="0.25"))
        asked = [r.body["max_tokens"] for r in server.requests]
    assert asked[0] == 8192 and asked[-1] < asked[0]  # the last calls got what was left
    assert run.outcome == Run.Outcome.BUDGET_EXHAUSTED and run.spent_micros <= 250_000
    assert_books_hold(run)


def test_a_call_the_headroom_cannot_pay_is_never_sent(user, make_instance, price):
    with MessagesServer(api_key=KEY) as server:
        inst = claude_instance(user, make_instance, server)
        replies(server, turns=5, output_tokens=100)
        run = drive_in_thread(services.run_start(instance=inst, user=user, objective="look", max_cost_usd="0.000100"))
        assert server.calls == 0
    assert run.outcome == Run.Outcome.BUDGET_EXHAUSTED
    assert "cannot pay for another call" in run.outcome_detail
    assert run.spent_micros == 0


@hsettings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    turns=st.integers(0, 12),
    output_tokens=st.integers(1, 6000),
    cap_cents=st.integers(1, 60),
    output_rate=st.sampled_from(["1", "15", "75"]),
    cancel_at=st.one_of(st.none(), st.integers(1, 8)),
    capped=st.sampled_from(["run", "user"]),
)
def test_property_metered_runs_never_pass_a_cap(django_user_model, tmp_path_factory, turns, output_tokens,
                                                cap_cents, output_rate, cancel_at, capped):
    """The cap is the run's own, or its user's pool's (then the run draws lease slices from it)."""
    from decimal import Decimal

    from django.utils import timezone

    from budgets.models import Price
    from instances.models import Instance

    Price.objects.update_or_create(
        model="claude-test-1",
        defaults=dict(input_usd_per_mtok=Decimal("3"), output_usd_per_mtok=Decimal(output_rate),
                      cache_write_usd_per_mtok=Decimal("3.75"), cache_read_usd_per_mtok=Decimal("0.30"),
                      effective_from=timezone.now().date().replace(year=2020)),
    )
    user = django_user_model.objects.create_user(f"u{django_user_model.objects.count()}")
    workspace = tmp_path_factory.mktemp("ws")
    with MessagesServer(api_key=KEY) as server:
        credential = Credential.create_for(user, label="k", secret=KEY)
        inst = Instance.objects.create(
            owner=user, name="p", brain="anthropic", decider="checks", base_url=server.url, credential=credential,
            model="claude-test-1", tools=["list_files"], command=[], checks=[], workspace=str(workspace),
            max_tool_turns=50, max_output_tokens=200_000, max_iterations=3,
        )
        if capped == "user":
            limits.set_limit(budget_services.user_pool(user), cap_cents * 10_000, "test")
        cap = f"0.{cap_cents:02d}" if capped == "run" else None
        run = services.run_start(instance=inst, user=user, objective="look", max_cost_usd=cap)

        def maybe_cancel(n):
            if cancel_at is not None and n == cancel_at:
                threading.Thread(target=services.run_cancel, kwargs={"run": run, "user": user}).start()

        replies(server, turns=turns, output_tokens=output_tokens, on_call=maybe_cancel)
        run = drive_in_thread(run)
    assert run.status == "finished"
    assert run.spent_micros <= cap_cents * 10_000
    assert_books_hold(run)
    if capped == "user":  # the run's lease went back: its user's pool books exactly what it spent
        user_pool = budget_services.user_pool(user)
        assert (user_pool.spent, user_pool.reserved) == (run.spent_micros, 0)
