"""/readyz: database, broker and workers; 503 naming what is missing."""

import pytest

from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_stale_cluster_status():
    from django.core.cache import caches

    caches["workers"].clear()


def test_not_ready_without_a_worker_cluster(client):
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["ready"] is False
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["broker"] == "ok"
    assert body["checks"]["workers"].startswith("failed: no worker cluster")


def test_not_ready_when_the_database_fails(client, monkeypatch):
    from django.db import OperationalError

    from web import ops

    def broken():
        raise OperationalError("connection refused")

    # The database is the outside world here: stand in for a server that went away.
    monkeypatch.setattr(ops, "_check_database", broken)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["database"] == "failed: connection refused"


def test_readyz_is_get_only_and_never_cached(client):
    assert client.post("/readyz").status_code == 405
    assert "no-cache" in client.get("/readyz")["Cache-Control"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_ready_once_a_worker_cluster_reports_in(client, tmp_path):
    cluster = Cluster("ready", tmp_path)
    try:
        response = wait_for(
            lambda: (r := client.get("/readyz")).status_code == 200 and r, 30, "/readyz to turn ready"
        )
        body = response.json()
        assert body["ready"] is True
        assert body["checks"]["workers"].startswith("ok: 1 cluster(s), 1 worker process(es)")
        assert client.get("/healthz").json()["worker_clusters"] == 1
    finally:
        cluster.stop()
    wait_for(lambda: client.get("/readyz").status_code == 503, 15, "/readyz to notice the cluster stopped")
