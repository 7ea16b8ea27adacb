"""Liveness and readiness probes."""

from django.db import connection
from django.http import JsonResponse
from django.utils import timezone
from django_q.status import Stat


def healthz(request):
    """Report database reachability and whether any worker cluster is alive."""

    db_ok = True
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        db_ok = False
    clusters = []
    try:
        clusters = Stat.get_all()
    except Exception:
        pass
    workers = sum(len(c.workers) for c in clusters)
    body = {
        "database": "ok" if db_ok else "unreachable",
        "worker_clusters": len(clusters),
        "workers": workers,
        "time": timezone.now().isoformat(),
    }
    return JsonResponse(body, status=200 if db_ok else 503)
