"""A stop stops spending: the model call in flight is streamed, and a stop closes its connection.

Claude is played by the local Messages server, which streams like the real API and notices at
once when a client goes away. The runs are driven by a real worker cluster, as in production:
the cancel reaches the act through the driver's stop signal.
"""

import time

import pytest

from budgets.models import Reservation
from instances.models import Credential
from loops import services
from loops.models import Iteration, Run
from tests.fakes.messages_server import MessagesServer, Trickle, text, tool_use
from tests.support.cluster import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


KEY = "sk-ant-api03-STOPSPENDINGKEY-0123456789abcdefQRST"
SLOW = "Thinking it over, one careful word at a time. " * 40


def test_a_stop_mid_stream_closes_the_connection_at_once_and_counts_what_arrived(
    user, make_instance, price, clusters
):
    with MessagesServer(api_key=KEY) as server:
        credential = Credential.create_for(user, label="k", secret=KEY)
        inst = make_instance(user, brain="anthropic", decider="checks", base_url=server.url, credential=credential,
                             model="claude-test-1", tools=[], command=[], checks=[])
        inst.workspace_path().mkdir(parents=True, exist_ok=True)
        server.enqueue(Trickle(text(SLOW), every=0.1, size=8))
        run = services.run_start(instance=inst, user=user, objective="think", max_cost_usd="1.00")
        clusters("w")
        wait_for(lambda: len(server.requests) >= 1, 30, "the model call to go out")
        time.sleep(1.0)  # some of the answer has arrived
        asked = time.monotonic()
        services.run_cancel(run=run, user=user)
        # The answer trickles for ~23 s: a connection closed within 5 s was closed by the stop.
        assert server.disconnected.wait(5.0), "the model call's connection stayed open after the stop"
        print(f"the connection closed {time.monotonic() - asked:.2f}s after the stop")
        run = wait_for(lambda: Run.objects.filter(pk=run.pk, status="finished").first(), 10, "the run to stop")
    assert run.outcome == "cancelled"
    call = Reservation.objects.get(run_id=run.pk, call=1)
    sent = call.usage["input_tokens"] + call.usage["cache_write_tokens"] + call.usage["cache_read_tokens"]
    assert call.status == "settled" and sent > 0 and call.usage["output_tokens"] > 0
    assert 0 < call.actual < call.amount  # what arrived, not the worst case
    assert Iteration.objects.get(run=run, number=1).cost_micros == call.actual == run.spent_micros


def test_a_stop_during_a_slow_decider_ends_the_run_long_before_the_decider_would(
    user, make_instance, script, price, clusters
):
    with MessagesServer(api_key=KEY) as server:
        credential = Credential.create_for(user, label="k", secret=KEY)
        inst = make_instance(user, command=script("print('did the work')\n"), decider="llm", base_url=server.url,
                             credential=credential, model="claude-test-1", checks=[])
        server.enqueue(Trickle(tool_use("record_decision", {"verdict": "done", "reason": SLOW}), every=0.2, size=4))
        run = services.run_start(instance=inst, user=user, objective="decide slowly")
        clusters("w")
        wait_for(lambda: len(server.requests) >= 1, 30, "the decider's call to go out")
        time.sleep(0.5)
        asked = time.monotonic()
        services.run_cancel(run=run, user=user)
        # The decision trickles for ~90 s: a run finished within the wait's 10 s bound was stopped.
        run = wait_for(lambda: Run.objects.filter(pk=run.pk, status="finished").first(), 10, "the run to stop")
        print(f"the stop landed {time.monotonic() - asked:.2f}s after it was asked")
        assert server.disconnected.wait(5.0), "the decider's connection stayed open"
    assert run.outcome == "cancelled"


def test_a_stream_cut_mid_answer_is_paid_for_what_arrived_and_retried(user, make_instance, price):
    """A network cut after `message_start`: the provider bills what it sent, so Tether counts it too."""
    from tests.loops.conftest import drive_in_thread

    with MessagesServer(api_key=KEY) as server:
        credential = Credential.create_for(user, label="k", secret=KEY)
        inst = make_instance(user, brain="anthropic", decider="checks", base_url=server.url, credential=credential,
                             model="claude-test-1", tools=[], command=[], checks=[], max_iterations=1)
        inst.workspace_path().mkdir(parents=True, exist_ok=True)
        server.enqueue(Trickle(text(SLOW), every=0, size=8, cut_after=6), text("Done."))
        run = drive_in_thread(services.run_start(instance=inst, user=user, objective="think", max_cost_usd="1.00"))
    assert run.outcome == "done" and len(server.requests) == 2  # the cut call was retried
    calls = list(Reservation.objects.filter(run_id=run.pk, call__gt=0).order_by("call"))
    cut, answered = calls
    sent = cut.usage["input_tokens"] + cut.usage["cache_write_tokens"] + cut.usage["cache_read_tokens"]
    assert cut.status == "settled" and sent > 0 and cut.usage["output_tokens"] > 0, cut.usage
    assert 0 < cut.actual < cut.amount
    assert run.spent_micros == cut.actual + answered.actual
