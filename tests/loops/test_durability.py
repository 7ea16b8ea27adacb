"""Real worker clusters: killed mid-act, competing for runs, and stopped mid-act."""

import time

import pytest

from loops.models import Event, Iteration, Run
from tests.support.cluster import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def counting_agent(script, seconds):
    return script(
        f"""
        time.sleep({seconds})
        p = pathlib.Path('count'); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n))
        print('count', n)
        """
    )


def test_run_survives_a_sigkilled_worker_cluster(client, user, make_instance, script, clusters):
    from web.auth import make_token

    check = script(
        "n = int(pathlib.Path('count').read_text()); print('count', n); sys.exit(0 if n >= 3 else 1)\n"
    )
    inst = make_instance(
        user, command=counting_agent(script, 1.0), checks=[{"name": "three", "command": check}]
    )
    token = make_token(user)
    response = client.post(
        f"/v1/instances/{inst.pk}/loop",
        {"objective": "count to three"},
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    # The API client is gone; the run lives on in the workers.
    first = clusters("first")
    wait_for(
        lambda: Event.objects.filter(run_id=run_id, kind="act.started", data__iteration=2).exists(),
        30,
        "iteration 2's act to start",
    )
    first.kill()  # mid-act
    # The survivor holds longer leases than the killed cluster: the kill is taken over after 2 s, and
    # a loaded machine never expires a lease it keeps (a scripted reply asked twice runs out).
    clusters("second", TETHER_LEASE_SECONDS="10")
    run = wait_for(
        lambda: Run.objects.filter(pk=run_id, status="finished").first(),
        60,
        "the run to finish on the new cluster",
    )
    assert (run.outcome, run.verified) == ("done", True)
    numbers = list(Iteration.objects.filter(run=run).order_by("number").values_list("number", flat=True))
    acts = list(Event.objects.filter(run=run, kind="act.started").values_list("data__iteration", flat=True))
    # Iteration 1 ran once; iteration 2's act ran twice (the killed attempt, then the re-run). On a
    # loaded machine the kill can land after the killed act already counted (it counts after 1 s),
    # and then the re-run reaches three and the run is done in two iterations: both are correct.
    assert acts.count(1) == 1 and acts.count(2) == 2, acts
    assert numbers in ([1, 2], [1, 2, 3]), numbers
    assert Event.objects.filter(run=run, kind="run.reaped").exists()
    seqs = list(Event.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    run.refresh_from_db()
    assert run.lease_token is None
    from budgets.models import Reservation

    statuses = list(Reservation.objects.filter(run_id=run.pk).order_by("iteration").values_list("iteration", "status"))
    assert ("held" not in {s for _, s in statuses}), statuses
    assert (2, "abandoned") in statuses  # the killed act's reservation, closed by the reaper


def test_a_driver_whose_database_is_busy_longer_than_its_lease_keeps_its_run(user, make_instance, script, clusters, start):
    """A heartbeat that waits on the database is a live driver: it still beats, and nobody reaps its run."""
    from django.db import transaction

    from loops import liveness

    clusters("w")
    run = start(make_instance(user, command=script("time.sleep(2)\n")))
    wait_for(lambda: Event.objects.filter(run=run, kind="act.started").exists(), 30, "the act to start")
    holder = Run.objects.get(pk=run.pk).lease_holder
    silent = []
    with transaction.atomic():  # the run's row (SQLite: the one writer) held past the lease and the beat's patience
        list(Run.objects.select_for_update().filter(pk=run.pk))
        ends = time.monotonic() + 6.5
        while time.monotonic() < ends:
            if not liveness.still_driving(holder, run.pk):
                silent.append(round(6.5 - (ends - time.monotonic()), 1))
            time.sleep(0.25)
    assert not silent, f"the driver's beat went silent while it waited on the database, at {silent} s"
    run = wait_for(lambda: Run.objects.filter(pk=run.pk, status="finished").first(), 30, "the run to finish")
    assert run.outcome == "done" and run.attempt == 1, (run.outcome, run.attempt)
    assert not Event.objects.filter(run=run, kind="run.reaped").exists()


def test_two_clusters_never_drive_one_run_at_once(user, make_instance, script, clusters, start):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("runs on the PostgreSQL pass of the suite")
    check = script("n = int(pathlib.Path('count').read_text()); print('count', n); sys.exit(0 if n >= 4 else 1)\n")
    runs = []
    for i in range(4):
        inst = make_instance(
            user,
            name=f"i{i}",
            command=counting_agent(script, 0.3),
            checks=[{"name": "four", "command": check}],
        )
        runs.append(start(inst))
    # Short slices hand each run back to the queue often, so both clusters keep competing.
    a = clusters("a", TETHER_SLICE_SECONDS="0.5")
    b = clusters("b", TETHER_SLICE_SECONDS="0.5")
    for run in runs:
        wait_for(lambda r=run: Run.objects.filter(pk=r.pk, status="finished").exists(), 90, f"run {run.pk}")
    holders = set()
    for run in runs:
        run.refresh_from_db()
        assert run.outcome == "done"
        spans = list(
            Iteration.objects.filter(run=run)
            .order_by("number")
            .values_list("number", "started_at", "finished_at", "worker")
        )
        assert [s[0] for s in spans] == [1, 2, 3, 4]
        for (_, _, end, _), (_, nxt, _, _) in zip(spans, spans[1:], strict=False):
            assert end <= nxt, "two iterations of one run overlapped"
        holders |= {s[3] for s in spans}
    assert len(holders) >= 2, "both clusters should have driven iterations"
    del a, b


def test_stop_mid_act_lands_long_before_the_act_would_end(user, make_instance, script, clusters, start):
    from loops import services

    inst = make_instance(user, command=script("time.sleep(60)\n"), act_timeout_seconds=120)
    clusters("w")
    run = start(inst)
    wait_for(lambda: Event.objects.filter(run=run, kind="act.started").exists(), 30, "the act to start")
    time.sleep(0.5)
    asked = time.monotonic()
    services.run_cancel(run=run, user=user)
    # The act would sleep 60 s: a stop that lands within the wait's 10 s bound cut it short. (How
    # fast a stop lands on a quiet machine is the driver's 0.25 s poll; a loaded one adds its own.)
    run = wait_for(lambda: Run.objects.filter(pk=run.pk, status="finished").first(), 10, "the run to stop")
    print(f"the stop landed {time.monotonic() - asked:.2f}s after it was asked")
    assert run.outcome == "cancelled"
    assert Iteration.objects.get(run=run, number=1).act_ok is False


def test_a_worker_sigkilled_mid_act_leaves_an_attempt_lost_event(user, make_instance, script, clusters, start, tmp_path):
    from budgets import money
    from budgets.models import LedgerEntry, Reservation

    workspace = tmp_path / "ws-lost"
    workspace.mkdir()
    (workspace / "keep.txt").write_text("as found")
    # The first attempt changes the workspace and hangs; the re-run finds its file and answers
    # with the instruction it was given.
    agent = script(
        """
        instruction = sys.stdin.read()
        notes = pathlib.Path('notes.txt')
        if not notes.exists():
            pathlib.Path('keep.txt').write_text('changed')
            notes.write_text('half done')
            time.sleep(60)
        print(instruction)
        """
    )
    inst = make_instance(user, command=agent, workspace=str(workspace), act_timeout_seconds=120)
    first = clusters("first")
    run = start(inst)
    wait_for(lambda: (workspace / "notes.txt").exists(), 30, "the act to write its file")
    worker = Event.objects.get(run=run, kind="run.claimed").data["worker"]
    first.kill()  # mid-act
    second = clusters("second", TETHER_LEASE_SECONDS="10")  # it never loses a lease it keeps, however loaded
    run = wait_for(lambda: Run.objects.filter(pk=run.pk, status="finished").first(), 60, "the re-run to finish")
    assert run.outcome == "done", second.tail()
    [lost] = Event.objects.filter(run=run, kind="attempt.lost")
    assert (lost.data["iteration"], lost.data["attempt"], lost.data["worker"]) == (1, 1, worker)
    assert lost.data["changed"] == [
        {"path": "keep.txt", "change": "modified"},
        {"path": "notes.txt", "change": "added"},
    ]
    # The amount closed is what the ledger closed: the killed act's reservation, settled in full.
    reservation = Reservation.objects.get(run_id=run.pk, iteration=1, status="abandoned")
    entries = LedgerEntry.objects.filter(reservation=reservation, kind="abandoned")
    assert entries.exists() and {e.spent_delta for e in entries} == {reservation.actual} and reservation.actual > 0
    assert lost.data["closed_usd"] == money.usd_string(reservation.actual)
    assert lost.data["reservations"] == [reservation.pk]
    told = "A previous attempt of this iteration was interrupted; it changed keep.txt, notes.txt (added)."
    assert told in run.iterations.get(number=1).response  # what the re-run's agent read on its stdin


def test_a_stop_during_the_checks_ends_cancelled_never_done(user, make_instance, script, clusters, start):
    from loops import services

    check = script("pathlib.Path('checking').write_text('yes')\ntime.sleep(60)\n")
    inst = make_instance(user, command=script("print('did it')\n"), checks=[{"name": "slow", "command": check}])
    clusters("w")
    run = start(inst)
    wait_for(lambda: (inst.workspace_path() / "checking").exists(), 30, "the check to start")
    services.run_cancel(run=run, user=user)
    run = wait_for(lambda: Run.objects.filter(pk=run.pk, status="finished").first(), 10, "the run to stop")
    assert run.outcome == "cancelled", (run.outcome, run.outcome_detail)
