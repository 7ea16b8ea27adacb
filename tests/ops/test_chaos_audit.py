"""The chaos harness's final audit: quiet on a sound fleet, loud on each kind of broken invariant."""

import json

import pytest

from bench import chaos
from loops.models import Event

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(tmp_path, user, make_instance):
    """Two runs driven to their end in this thread, and the logs of viewers that saw everything."""
    from loops import leases, runner, services

    agent = chaos.agent(0, "0.01")
    instance = make_instance(user, command=agent, env={"GOAL": "2"}, max_iterations=5)
    runs = []
    for _ in range(2):
        run = services.run_start(instance=instance, user=user, objective="count", via="api")
        lease = leases.claim(run.pk, 1, "audit-test")
        runner.drive(lease, slice_seconds=60)
        run.refresh_from_db()
        assert run.outcome == "done", run.outcome_detail
        runs.append(run)
    runs_file = tmp_path / "runs.json"
    runs_file.write_text(json.dumps([r.pk for r in runs]))
    seen = [viewer_log(r.pk, list(range(1, r.last_seq + 1))) for r in runs]
    return runs, runs_file, seen, tmp_path / "seen.json"


def viewer_log(run_id, seqs, duplicates=(), gaps=()):
    return {
        "run_id": run_id,
        "seqs": seqs,
        "arrived": [0.0] * len(seqs),
        "opened_at": 0.0,
        "connects": 2,
        "closes": [1000],
        "duplicates": list(duplicates),
        "gaps": list(gaps),
        "finished_seq": seqs[-1] if seqs else 0,
    }


def audit(fleet, seen=None):
    runs, runs_file, logs, seen_file = fleet
    seen_file.write_text(json.dumps(logs if seen is None else seen))
    return chaos.audit(str(runs_file), str(seen_file))


def test_a_sound_fleet_passes(fleet):
    findings = audit(fleet)
    assert findings["failures"] == []
    assert findings["outcomes"] == {"done": 2}
    assert findings["iterations"] == 4
    assert findings["viewers"]["reconnects"] == 2


def test_a_viewer_that_got_an_event_twice_fails(fleet):
    runs, _, logs, _ = fleet
    logs[0]["duplicates"] = [3]
    assert any("twice" in f for f in audit(fleet)["failures"])


def test_a_viewer_that_missed_events_fails(fleet):
    runs, _, logs, _ = fleet
    logs[1]["seqs"] = logs[1]["seqs"][:-2]
    failures = audit(fleet)["failures"]
    assert any(f.startswith(f"viewer of run {runs[1].pk} saw") for f in failures)


def test_a_missing_viewer_fails(fleet):
    _, _, logs, _ = fleet
    assert any("reported nothing" in f for f in audit(fleet, seen=logs[:1])["failures"])


def test_a_run_left_running_fails(fleet):
    from loops.models import Run

    runs, *_ = fleet
    Run.objects.filter(pk=runs[0].pk).update(status="running", outcome="", lease_token="x" * 32)
    failures = audit(fleet)["failures"]
    assert f"run {runs[0].pk} did not finish: running" in failures
    assert any("still holds a lease" in f for f in failures)


def test_a_gap_in_the_events_fails(fleet):
    runs, *_ = fleet
    Event.objects.filter(run=runs[0], seq=2).delete()
    assert any("event seqs are not" in f for f in audit(fleet)["failures"])


def test_a_held_reservation_and_unbalanced_books_fail(fleet):
    from budgets import ledger
    from budgets.models import Pool

    runs, *_ = fleet
    ledger.hold(run=runs[0], iteration=99, amount=1234)
    Pool.objects.filter(kind="root").update(spent=1)
    failures = audit(fleet)["failures"]
    assert any("is still held" in f for f in failures)
    assert any("still reserved at the end" in f for f in failures)
    assert any("spent 1 but Σ settled" in f for f in failures)


def test_an_iteration_out_of_place_fails(fleet):
    from loops.models import Iteration

    runs, *_ = fleet
    Iteration.objects.filter(run=runs[1], number=2).update(number=7)
    assert any(f.startswith(f"run {runs[1].pk}: iterations [1, 7]") for f in audit(fleet)["failures"])


def test_a_pool_over_its_limit_without_an_overdraft_fails(fleet):
    from budgets.models import Pool

    pool = Pool.objects.get(kind="instance")
    Pool.objects.filter(pk=pool.pk).update(limit=pool.spent - 1)
    assert any("over its limit" in f for f in audit(fleet)["failures"])


def test_a_reservation_granted_past_a_limit_fails(fleet):
    from budgets.models import LedgerEntry, Pool

    pool = Pool.objects.get(kind="instance")
    entry = LedgerEntry.objects.filter(pool=pool, kind="reserve").first()
    # The ledger is append-only through the model; this stands in for a ledger bug.
    LedgerEntry.objects.filter(pk=entry.pk).update(limit_after=entry.spent_after)
    assert any("granted past the limit" in f for f in audit(fleet)["failures"])


def test_the_longest_pickup_wait_is_measured_and_one_after_a_cut_is_told_apart():
    from datetime import UTC, datetime, timedelta

    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def at(seconds):
        return t0 + timedelta(seconds=seconds)

    events = [
        (1, "run.queued", at(0)), (1, "run.claimed", at(0.3)), (1, "iteration.finished", at(2)),
        (1, "run.claimed", at(2.5)),  # a hand-back picked up in 0.5 s, no cut near
        (2, "run.queued", at(0)), (2, "run.claimed", at(0.2)), (2, "iteration.finished", at(21)),
        (2, "run.claimed", at(29)),  # handed back just after the cut ended: stalled 8 s
        (3, "run.queued", at(0)), (3, "run.claimed", at(0.1)), (3, "iteration.finished", at(35)),
        (3, "run.claimed", at(47)),  # long, but long after the cut
    ]
    cuts = [(at(17), at(20))]
    assert chaos.pickup_waits(events, cuts) == {"longest": 12.0, "after_cut": 8.0}
    assert chaos.pickup_waits(events, []) == {"longest": 12.0, "after_cut": 0.0}


def test_the_audit_reports_pickup_waits(fleet, tmp_path):
    runs, runs_file, seen, seen_file = fleet
    seen_file.write_text(json.dumps(seen))
    cuts = tmp_path / "cuts.json"
    cuts.write_text(json.dumps([["2000-01-01T00:00:00+00:00", "2000-01-01T00:00:01+00:00"]]))
    pickup = chaos.audit(str(runs_file), str(seen_file), str(cuts))["pickup"]
    assert pickup["after_cut"] == 0.0 and pickup["longest"] > 0
