"""Static files: hashed names once collected (as `serve` does), gzip, a far-future cache; plain names before."""

import gzip
import re

import pytest
from django.core.management import call_command
from django.test import Client

pytestmark = pytest.mark.django_db


def asset_urls(html):
    return re.findall(r'(?:href|src)="(/static/[^"]+)"', html)


def test_before_collectstatic_pages_link_plain_names(client, user, settings, tmp_path):
    settings.STATIC_ROOT = tmp_path / "empty"
    client.force_login(user)
    html = client.get("/").content.decode()
    assert "/static/console/console.css" in asset_urls(html)
    assert client.get("/static/console/console.css").status_code == 200  # from the source tree


def test_collected_files_have_hashed_names_gzip_and_a_long_cache(user, settings, tmp_path):
    settings.STATIC_ROOT = tmp_path / "static"
    call_command("collectstatic", interactive=False, verbosity=0)  # what `manage.py serve` runs at start
    client = Client()  # a fresh client: WhiteNoise indexes the collected files when it starts
    client.force_login(user)
    html = client.get("/").content.decode()
    urls = asset_urls(html)
    css = next(u for u in urls if u.startswith("/static/console/console."))
    js = next(u for u in urls if u.startswith("/static/console/console.") and u.endswith(".js"))
    assert re.fullmatch(r"/static/console/console\.[0-9a-f]{12}\.css", css), css
    assert re.fullmatch(r"/static/console/console\.[0-9a-f]{12}\.js", js), js
    assert any(re.fullmatch(r"/static/vendor/htmx\.min\.[0-9a-f]{12}\.js", u) for u in urls), urls

    plain = client.get(js)
    assert plain.status_code == 200
    assert "immutable" in plain["Cache-Control"] and "max-age=315360000" in plain["Cache-Control"]
    body = b"".join(plain.streaming_content) if plain.streaming else plain.content
    squeezed = client.get(js, headers={"Accept-Encoding": "gzip"})
    assert squeezed["Content-Encoding"] == "gzip"
    packed = b"".join(squeezed.streaming_content) if squeezed.streaming else squeezed.content
    assert gzip.decompress(packed) == body and len(packed) < len(body)
    assert b"data-last-seq" in body
