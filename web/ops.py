"""Operations endpoints: readiness (`/readyz`) and Prometheus metrics (`/metrics`).

Read-only. `/readyz` answers 200 when the database answers, the task broker answers
and at least one worker cluster reported in within the last few seconds (django-q2
clusters publish their status through the shared cache named by Q_CLUSTER["cache"]);
503 otherwise, with `down` listing what failed and `checks` saying how. `/healthz` (web.health) stays the liveness probe:
a load balancer should route on /readyz and restart on /healthz.

`/metrics` speaks the Prometheus text exposition format (version 0.0.4), rendered by
prometheus_client from one collector (`TetherCollector`). It is
served only with `Authorization: Bearer <TETHER_METRICS_TOKEN>`; without a
configured token it does not exist (404). Every figure is read from the database
at scrape time, so any web process gives the same answer.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from django_q.brokers import get_broker
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.status import Stat
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from budgets import money
from budgets.models import Pool, Reservation
from loops.models import Event, Iteration, Run
from tether import dbfaults, tracing

log = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
# Upper bounds (seconds) of the iteration duration histogram.
DURATION_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


# --- readiness ---------------------------------------------------------------------------------


def _check_database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return "ok"


def _check_broker() -> str:
    broker = get_broker()
    if not broker.ping():
        raise RuntimeError("the broker did not answer")
    broker.queue_size()  # the ORM broker's ping is a no-op; this reads its table
    return "ok"


def _live_clusters() -> list:
    # A cluster still starting has no worker process yet; one stopping takes no more tasks.
    return [stat for stat in Stat.get_all() if stat.status in (Conf.IDLE, Conf.WORKING) and stat.workers]


def _check_workers() -> str:
    clusters = _live_clusters()
    if not clusters:
        raise RuntimeError("no worker cluster has reported in (is `manage.py qcluster` running?)")
    workers = sum(len(stat.workers) for stat in clusters)
    return f"ok: {len(clusters)} cluster(s), {workers} worker process(es)"


@never_cache
@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """Return 200 when the database, the broker and some worker are there; 503 naming the failure."""
    checks: dict[str, str] = {}
    down: list[str] = []
    for name, check in (
        ("database", _check_database),
        ("broker", _check_broker),
        ("workers", _check_workers),
    ):
        try:
            checks[name] = check()
        except Exception as exc:
            down.append(name)
            checks[name] = f"failed: {exc}"[:300]
            log.warning("readyz: %s check failed: %s", name, exc)
            if dbfaults.is_transient(exc):
                dbfaults.reset()  # a cut connection: the next check (and probe) reconnects
    body = {"ready": not down, "down": down, "checks": checks, "time": timezone.now().isoformat()}
    response = JsonResponse(body, status=503 if down else 200)
    if down:
        response["Retry-After"] = "5"
    return response


# --- metrics -------------------------------------------------------------------------------------


def _authorized(request: HttpRequest, token: str) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def _usd(micros: int | None) -> float:
    return float(money.micros_to_decimal(micros or 0))  # a Prometheus sample is a float


class TetherCollector(Collector):
    """Every Tether metric, read from the database at each scrape (prometheus_client renders them)."""

    def collect(self) -> Iterator[Metric]:
        yield from self._runs()
        yield from self._iterations()
        yield from self._money()
        yield from self._workers()

    def _runs(self) -> Iterator[Metric]:
        by_status = dict(Run.objects.values_list("status").annotate(n=Count("id")).order_by())
        runs = GaugeMetricFamily("tether_runs", "Runs by status.", labels=["status"])
        for status in Run.Status.values:
            runs.add_metric([status], int(by_status.get(status, 0)))
        yield runs
        by_outcome = dict(
            Run.objects.filter(status=Run.Status.FINISHED)
            .values_list("outcome")
            .annotate(n=Count("id"))
            .order_by()
        )
        finished = CounterMetricFamily(
            "tether_runs_finished_total", "Finished runs by outcome.", labels=["outcome"]
        )
        for outcome in Run.Outcome.values:
            finished.add_metric([outcome], int(by_outcome.get(outcome, 0)))
        yield finished
        leased = Run.objects.filter(lease_token__isnull=False, lease_expires_at__gt=timezone.now()).count()
        yield GaugeMetricFamily(
            "tether_runs_leased", "Runs a worker holds a live lease on right now.", leased
        )

    def _iterations(self) -> Iterator[Metric]:
        duration = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
        bucket_counts = {
            f"le_{i}": Count("id", filter=Q(duration__lte=timedelta(seconds=bound)))
            for i, bound in enumerate(DURATION_BUCKETS)
        }
        iterations = Iteration.objects.annotate(duration=duration).aggregate(
            count=Count("id"), total=Sum("duration"), **bucket_counts
        )
        count = int(iterations["count"] or 0)
        total = iterations["total"] or timedelta(0)
        yield CounterMetricFamily("tether_iterations_total", "Iterations recorded.", count)
        buckets = [
            (floatToGoString(bound), int(iterations[f"le_{i}"] or 0))
            for i, bound in enumerate(DURATION_BUCKETS)
        ]
        yield HistogramMetricFamily(
            "tether_iteration_duration_seconds",
            "Wall time of recorded iterations (act, checks and decision).",
            buckets=[*buckets, ("+Inf", count)],
            sum_value=total.total_seconds(),
        )

    def _money(self) -> Iterator[Metric]:
        # A child run's carve is left out: the child's own reservations count what it spent.
        calls = Reservation.objects.filter(
            carved__isnull=True, lease_for__isnull=True
        )  # not carves or lease slices
        closed = calls.filter(
            status__in=[Reservation.Status.SETTLED, Reservation.Status.ABANDONED]
        ).aggregate(spent=Sum("actual"))
        yield CounterMetricFamily(
            "tether_spent_usd_total",
            "Money settled by iterations, including the conservative settlement of abandoned ones.",
            _usd(closed["spent"]),
        )
        held = calls.filter(status=Reservation.Status.HELD).aggregate(n=Count("id"), amount=Sum("amount"))
        yield GaugeMetricFamily(
            "tether_reservations_held", "Reservations currently held.", int(held["n"] or 0)
        )
        yield GaugeMetricFamily(
            "tether_reserved_usd", "Money currently held by reservations.", _usd(held["amount"])
        )
        # Pools above instance level only: their number stays small whatever the fleet's size.
        pools = list(
            Pool.objects.filter(kind__in=[Pool.Kind.ROOT, Pool.Kind.TEAM]).values_list(
                "name", "kind", "spent", "limit"
            )
        )
        spent = GaugeMetricFamily(
            "tether_pool_spent_usd",
            "Money spent in the current period, by root and team pool.",
            labels=["pool", "kind"],
        )
        limits = GaugeMetricFamily(
            "tether_pool_limit_usd",
            "Limits of the root and team pools (absent: unlimited).",
            labels=["pool", "kind"],
        )
        for name, kind, pool_spent, limit in pools:
            spent.add_metric([name, kind], _usd(pool_spent))
            if limit is not None:
                limits.add_metric([name, kind], _usd(limit))
        yield spent
        yield limits

    def _workers(self) -> Iterator[Metric]:
        queue = OrmQ.objects.using(settings.Q_CLUSTER.get("orm", "default"))
        yield GaugeMetricFamily(
            "tether_queue_depth", "Tasks waiting in the django-q2 queue (ORM broker).", queue.count()
        )
        yield CounterMetricFamily(
            "tether_reaper_actions_total",
            "Runs the reaper re-scheduled after their driver died (run.reaped events).",
            Event.objects.filter(kind="run.reaped").count(),
        )
        try:
            clusters = _live_clusters()
        except Exception:
            log.warning("metrics: worker cluster status unavailable", exc_info=True)
            clusters = []
        yield GaugeMetricFamily("tether_worker_clusters", "Worker clusters that reported in.", len(clusters))
        yield GaugeMetricFamily(
            "tether_worker_processes",
            "Worker processes of the clusters that reported in.",
            sum(len(stat.workers) for stat in clusters),
        )
        yield CounterMetricFamily(
            "tether_trace_spans_dropped_total",
            "Trace spans that could not be exported to the OTLP collector (tether.tracing), every process's.",
            tracing.dropped(),
        )


# Tether's own registry: the default one would add the scraping process's own figures (GC, CPU),
# which differ from one web process to the next.
REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(TetherCollector())


def collect() -> str:
    """Return every Tether metric as Prometheus text, read from the database now."""
    return generate_latest(REGISTRY).decode()


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Return the metrics to a caller bearing the metrics token."""
    token = settings.TETHER_METRICS_TOKEN
    if not token:
        return HttpResponse(
            "metrics are off: set TETHER_METRICS_TOKEN\n", status=404, content_type=CONTENT_TYPE
        )
    if not _authorized(request, token):
        response = HttpResponse("a valid metrics token is required\n", status=401, content_type=CONTENT_TYPE)
        response["WWW-Authenticate"] = 'Bearer realm="tether-metrics"'
        return response
    return HttpResponse(collect(), content_type=CONTENT_TYPE)
