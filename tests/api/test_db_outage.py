"""During a database outage the API answers 503 JSON with Retry-After, never 500; /readyz names what is down.

The outage is injected where the database meets Django (`connection.execute_wrapper`, its
documented query hook): on PostgreSQL it terminates the request's own backend before the
chosen statement (a real cut); on SQLite it raises the "database is locked" a busy writer
causes.
"""

import pytest
from django.db import OperationalError, connection

from tests.support.pg import terminate_backend
from web.auth import make_token

pytestmark = pytest.mark.django_db(transaction=True)


class Outage:
    """Break the connection before every statement containing `marker` while active."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.hits = 0

    def __call__(self, execute, sql, params, many, context):
        if self.marker in sql:
            self.hits += 1
            if connection.vendor == "postgresql":
                terminate_backend(context["connection"].connection.info.backend_pid)
            else:
                raise OperationalError("database is locked")
        return execute(sql, params, many, context)


@pytest.fixture
def events_url(user, make_instance):
    from loops import services

    run = services.run_start(instance=make_instance(user), user=user, objective="say hello")
    return f"/v1/instances/{run.instance_id}/loop/{run.pk}/events"


def test_events_during_a_cut_answer_503_json_with_retry_after_then_recover(client, user, events_url):
    auth = {"Authorization": f"Bearer {make_token(user)}"}
    outage = Outage('FROM "loops_event"')
    with connection.execute_wrapper(outage):
        response = client.get(events_url, headers=auth)
    assert outage.hits >= 1
    assert response.status_code == 503
    assert response["Content-Type"].startswith("application/json")
    assert int(response["Retry-After"]) > 0
    assert "database" in response.json()["error"]
    after = client.get(events_url, headers=auth)  # the next request reconnects
    assert after.status_code == 200, after.content
    assert [e["kind"] for e in after.json()["events"]][:1] == ["run.started"]


def test_a_console_page_during_a_cut_says_it_is_reconnecting(client, user):
    client.force_login(user)
    outage = Outage('FROM "instances_instance"')
    with connection.execute_wrapper(outage):
        response = client.get("/", headers={"Accept": "text/html"})
    assert outage.hits >= 1
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/html")
    assert "reconnecting" in response.content.decode()
    assert "Retry-After" in response


def test_a_non_transient_database_error_is_not_disguised(client, user, events_url):
    """Only outages become 503s: a real bug (here a missing table) still surfaces as an error."""
    from django.db import ProgrammingError

    def broken(execute, sql, params, many, context):
        if 'FROM "loops_event"' in sql:
            raise ProgrammingError('relation "loops_event" does not exist')
        return execute(sql, params, many, context)

    auth = {"Authorization": f"Bearer {make_token(user)}"}
    with connection.execute_wrapper(broken), pytest.raises(ProgrammingError):
        client.get(events_url, headers=auth)


def test_readyz_names_the_database_when_it_is_down(client):
    outage = Outage("SELECT 1")
    with connection.execute_wrapper(outage):
        response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["checks"]["database"].startswith("failed")
    assert "database" in body["down"]
    assert client.get("/readyz").json()["checks"]["database"] == "ok"  # reconnected


class Touches:
    """A middleware inside the outage one that reads the database, as sessions and sign-in throttling do."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from django.contrib.auth.models import User

        User.objects.filter(pk=0).exists()
        return self.get_response(request)


def test_an_outage_met_by_another_middleware_is_a_503_too(settings, user, events_url):
    from django.test import Client

    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.api.test_db_outage.Touches"]
    client = Client(raise_request_exception=False)
    auth = {"Authorization": f"Bearer {make_token(user)}"}
    outage = Outage('FROM "auth_user"')
    with connection.execute_wrapper(outage):
        response = client.get(events_url, headers=auth)
    assert outage.hits >= 1
    assert response.status_code == 503, response.content[:300]
    assert "database" in response.json()["error"] and int(response["Retry-After"]) > 0
    assert client.get(events_url, headers=auth).status_code == 200  # reconnected
