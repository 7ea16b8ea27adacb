"""HTML and JSON go out gzipped to a client that accepts it; a response that shows a secret does not (BREACH)."""

import gzip

import pytest

from tests.console.conftest import record

pytestmark = pytest.mark.django_db

GZIP = {"HTTP_ACCEPT_ENCODING": "gzip, deflate, br"}


def many_events(run, n=150):
    items = []
    for i in range(1, n + 1):
        items += [
            ("iteration.started", {"iteration": i, "instruction": "write the report", "interjections": 0}),
            ("act.started", {"iteration": i}),
            ("act.finished", {"iteration": i, "ok": True, "detail": "", "response": f"wrote part {i} of report.md"}),
            ("decision.made", {"iteration": i, "verdict": "continue", "reason": "a test still fails"}),
        ]
    record(run, items)


def test_a_large_run_page_is_served_gzipped(signed_in, instance, start_run):
    run = start_run(instance)
    many_events(run)
    plain = signed_in.get(f"/runs/{run.pk}/")
    assert plain.status_code == 200 and "Content-Encoding" not in plain
    zipped = signed_in.get(f"/runs/{run.pk}/", **GZIP)
    assert zipped.status_code == 200
    assert zipped["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in zipped["Vary"]
    page = gzip.decompress(zipped.content).decode()
    assert "wrote part 150 of report.md" in page
    assert len(zipped.content) * 4 < len(plain.content), (len(zipped.content), len(plain.content))


def test_api_json_is_served_gzipped(client, user, instance, start_run):
    from web.auth import make_token

    run = start_run(instance)
    many_events(run, 20)
    token = make_token(user)
    response = client.get(
        f"/v1/instances/{instance.pk}/loop/{run.pk}/events", headers={"Authorization": f"Bearer {token}"}, **GZIP
    )
    assert response.status_code == 200, response.content
    assert response["Content-Encoding"] == "gzip"
    assert b"wrote part" in gzip.decompress(response.content)


def test_the_page_that_shows_a_new_token_once_is_never_compressed(signed_in, user):
    from loops.models import ApiToken

    response = signed_in.post("/tokens/", {"name": "laptop", "days": ""}, follow=True, **GZIP)
    assert response.status_code in (200, 201), response.status_code
    assert ApiToken.objects.filter(user=user, name="laptop").exists()
    assert "no-store" in response["Cache-Control"]
    assert "Content-Encoding" not in response  # the secret is not sized by compression (BREACH)
    assert "laptop" in response.content.decode()


def test_only_whole_html_and_json_bodies_are_compressed(rf):
    from django.http import HttpResponse, StreamingHttpResponse

    from tether.compression import ConsoleGZipMiddleware

    body = b"x" * 5000
    request = rf.get("/", HTTP_ACCEPT_ENCODING="gzip")

    def through(response):
        return ConsoleGZipMiddleware(lambda r: response)(request)

    assert through(HttpResponse(body, content_type="text/html; charset=utf-8"))["Content-Encoding"] == "gzip"
    assert through(HttpResponse(body, content_type="application/json"))["Content-Encoding"] == "gzip"
    assert not through(HttpResponse(body, content_type="text/plain")).has_header("Content-Encoding")
    secret = HttpResponse(body, content_type="text/html")
    secret["Cache-Control"] = "no-store"
    assert not through(secret).has_header("Content-Encoding")
    streamed = StreamingHttpResponse(iter([body]), content_type="application/json")
    assert not through(streamed).has_header("Content-Encoding")
