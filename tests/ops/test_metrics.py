"""/metrics: the token gate and the figures, in the Prometheus text format."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.ops.conftest import parse_exposition

pytestmark = pytest.mark.django_db


def scrape(client, token):
    response = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return parse_exposition(response.content.decode())


def value(samples, name, **labels):
    return samples[(name, frozenset((k, str(v)) for k, v in labels.items()))]


def test_metrics_are_off_without_a_configured_token(client, settings):
    settings.TETHER_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 404
    assert client.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 404


def test_metrics_refuse_a_missing_token(client, metrics_token):
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"tether_" not in response.content


@pytest.mark.parametrize(
    "header",
    [
        "Bearer wrong-token",
        "Bearer scrape-me-012345678",  # a prefix of the real one
        "Bearer scrape-me-0123456789x",
        "Basic scrape-me-0123456789",  # the right secret under another scheme
        "scrape-me-0123456789",
        "Bearer",
    ],
)
def test_metrics_refuse_a_bad_token(client, metrics_token, header):
    response = client.get("/metrics", headers={"Authorization": header})
    assert response.status_code == 401
    assert b"tether_" not in response.content


def test_metrics_refuse_a_signed_in_superuser_without_the_token(client, metrics_token, django_user_model):
    admin = django_user_model.objects.create_superuser("root", password="pw-root-123")
    client.force_login(admin)
    assert client.get("/metrics").status_code == 401


def test_metrics_accept_the_scheme_in_any_case(client, metrics_token):
    response = client.get("/metrics", headers={"Authorization": f"bearer {metrics_token}"})
    assert response.status_code == 200


def test_empty_installation_reports_zeros(client, metrics_token):
    samples = scrape(client, metrics_token)
    assert value(samples, "tether_runs", status="running") == 0
    assert value(samples, "tether_runs_finished_total", outcome="done") == 0
    assert value(samples, "tether_iterations_total") == 0
    assert value(samples, "tether_iteration_duration_seconds_count") == 0
    assert value(samples, "tether_iteration_duration_seconds_bucket", le="+Inf") == 0
    assert value(samples, "tether_reservations_held") == 0
    assert value(samples, "tether_queue_depth") == 0
    assert value(samples, "tether_reaper_actions_total") == 0


def test_metrics_count_runs_iterations_spend_queue_and_reaper(
    client, metrics_token, start, user, make_instance
):
    from budgets import ledger
    from loops import events
    from loops.models import Iteration, Run

    instance = make_instance(user)
    start(instance)  # stays queued
    finished = [start(instance) for _ in range(3)]
    now = timezone.now()
    for run, outcome in zip(finished, ["done", "done", "budget_exhausted"], strict=True):
        Run.objects.filter(pk=run.pk).update(status="finished", outcome=outcome, finished_at=now)
    Run.objects.filter(pk=finished[0].pk).update(spent_micros=1)
    running = start(instance)
    Run.objects.filter(pk=running.pk).update(
        status="running", lease_token="t" * 32, lease_expires_at=now + timedelta(seconds=30)
    )
    for number, seconds in enumerate([0.2, 1.5, 3.0, 700.0], start=1):
        Iteration.objects.create(
            run=finished[0],
            number=number,
            instruction="go",
            started_at=now - timedelta(seconds=seconds),
            finished_at=now,
        )
    settled = ledger.hold(run=finished[0], iteration=1, amount=50_000).pk
    ledger.settle(settled, actual=12_345)
    ledger.return_run_lease(finished[0].pk)  # it finished: the root books what it spent
    ledger.hold(run=running, iteration=1, amount=40_000)
    from django.db import transaction

    with transaction.atomic():
        events.append(finished[1].pk, "run.reaped", {"iteration": 1, "previous_worker": "gone"})

    samples = scrape(client, metrics_token)
    assert value(samples, "tether_runs", status="queued") == 1
    assert value(samples, "tether_runs", status="running") == 1
    assert value(samples, "tether_runs", status="finished") == 3
    assert value(samples, "tether_runs", status="waiting") == 0
    assert value(samples, "tether_runs_finished_total", outcome="done") == 2
    assert value(samples, "tether_runs_finished_total", outcome="budget_exhausted") == 1
    assert value(samples, "tether_runs_finished_total", outcome="crashed") == 0
    assert value(samples, "tether_runs_leased") == 1
    assert value(samples, "tether_iterations_total") == 4
    assert value(samples, "tether_iteration_duration_seconds_count") == 4
    assert value(samples, "tether_iteration_duration_seconds_bucket", le="0.5") == 1
    assert value(samples, "tether_iteration_duration_seconds_bucket", le="2.5") == 2
    assert value(samples, "tether_iteration_duration_seconds_bucket", le="5.0") == 3
    assert value(samples, "tether_iteration_duration_seconds_bucket", le="600.0") == 3
    assert value(samples, "tether_iteration_duration_seconds_bucket", le="1800.0") == 4
    assert value(samples, "tether_iteration_duration_seconds_bucket", le="+Inf") == 4
    assert value(samples, "tether_iteration_duration_seconds_sum") == pytest.approx(704.7)
    assert value(samples, "tether_spent_usd_total") == pytest.approx(0.012345)
    assert value(samples, "tether_reservations_held") == 1
    assert value(samples, "tether_reserved_usd") == pytest.approx(0.04)
    assert value(samples, "tether_pool_spent_usd", pool="organisation", kind="root") == pytest.approx(
        0.012345
    )
    # run_start enqueues the first iteration of each run; nothing drained the queue here.
    assert value(samples, "tether_queue_depth") == 5
    assert value(samples, "tether_reaper_actions_total") == 1
    assert value(samples, "tether_worker_clusters") >= 0


def test_buckets_are_cumulative_and_end_at_the_count(client, metrics_token, start, user, make_instance):
    from loops.models import Iteration

    run = start(make_instance(user))
    now = timezone.now()
    for number in range(1, 30):
        Iteration.objects.create(
            run=run,
            number=number,
            instruction="go",
            started_at=now - timedelta(seconds=number * 7),
            finished_at=now,
        )
    samples = scrape(client, metrics_token)
    buckets = sorted(
        (float(dict(labels)["le"]), count)
        for (name, labels), count in samples.items()
        if name == "tether_iteration_duration_seconds_bucket"
    )
    counts = [count for _, count in buckets]
    assert counts == sorted(counts)
    assert buckets[-1] == (float("inf"), 29)


def test_label_values_are_escaped(client, metrics_token):
    from budgets import services

    name = 'a "quoted"\\ name\nnext'
    services.pool_create(kind="team", name=name, parent=services.root_pool(), limit=2_000_000)
    samples = scrape(client, metrics_token)
    escaped = 'a \\"quoted\\"\\\\ name\\nnext'
    assert value(samples, "tether_pool_limit_usd", pool=escaped, kind="team") == 2.0


def test_metrics_are_rendered_by_prometheus_client():
    """The exposition is prometheus_client's, from one collector: no hand-written text format."""
    import inspect

    from prometheus_client import CollectorRegistry

    from web import ops

    assert isinstance(ops.REGISTRY, CollectorRegistry)
    assert [type(c).__name__ for c in ops.REGISTRY._collector_to_names] == ["TetherCollector"]
    source = inspect.getsource(ops)
    assert "# TYPE" not in source and "# HELP" not in source, (
        "the text format is prometheus_client's to write"
    )


# What dashboards and alerts read: every family's name, type and help, as they were written by hand
# before prometheus_client rendered them. A change here is a change to every scraper's queries.
FAMILIES = [
    "# HELP tether_runs Runs by status.",
    "# TYPE tether_runs gauge",
    "# HELP tether_runs_finished_total Finished runs by outcome.",
    "# TYPE tether_runs_finished_total counter",
    "# HELP tether_runs_leased Runs a worker holds a live lease on right now.",
    "# TYPE tether_runs_leased gauge",
    "# HELP tether_iterations_total Iterations recorded.",
    "# TYPE tether_iterations_total counter",
    "# HELP tether_iteration_duration_seconds Wall time of recorded iterations (act, checks and decision).",
    "# TYPE tether_iteration_duration_seconds histogram",
    "# HELP tether_spent_usd_total Money settled by iterations, including the conservative settlement of abandoned ones.",
    "# TYPE tether_spent_usd_total counter",
    "# HELP tether_reservations_held Reservations currently held.",
    "# TYPE tether_reservations_held gauge",
    "# HELP tether_reserved_usd Money currently held by reservations.",
    "# TYPE tether_reserved_usd gauge",
    "# HELP tether_pool_spent_usd Money spent in the current period, by root and team pool.",
    "# TYPE tether_pool_spent_usd gauge",
    "# HELP tether_pool_limit_usd Limits of the root and team pools (absent: unlimited).",
    "# TYPE tether_pool_limit_usd gauge",
    "# HELP tether_queue_depth Tasks waiting in the django-q2 queue (ORM broker).",
    "# TYPE tether_queue_depth gauge",
    "# HELP tether_reaper_actions_total Runs the reaper re-scheduled after their driver died (run.reaped events).",
    "# TYPE tether_reaper_actions_total counter",
    "# HELP tether_worker_clusters Worker clusters that reported in.",
    "# TYPE tether_worker_clusters gauge",
    "# HELP tether_worker_processes Worker processes of the clusters that reported in.",
    "# TYPE tether_worker_processes gauge",
    "# HELP tether_trace_spans_dropped_total Trace spans that could not be exported to the OTLP collector (tether.tracing), every process's.",
    "# TYPE tether_trace_spans_dropped_total counter",
]


def test_families_keep_their_names_types_and_help(client, metrics_token):
    response = client.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
    heads = [line for line in response.content.decode().splitlines() if line.startswith("# ")]
    assert heads == FAMILIES
