"""Every console page has an icon (no 404 per page) and reaches the model keys from its navigation."""

import re

import pytest

pytestmark = pytest.mark.django_db
ICON = re.compile(r"console/favicon(\.[0-9a-f]{12})?\.svg")


@pytest.mark.parametrize("page", ["/", "/history/", "/tokens/", "/credentials/"])
def test_every_page_links_its_icon_and_the_keys(signed_in, page):
    html = signed_in.get(page).content.decode()
    # Its plain name, or its hashed one once a `serve` of this home has collected the static files.
    assert 'rel="icon"' in html and ICON.search(html)
    nav = html[html.index('class="top-nav"') : html.index("</nav>")]
    assert 'href="/credentials/"' in nav


def test_favicon_ico_points_at_the_icon(client):
    answer = client.get("/favicon.ico")
    assert answer.status_code == 301 and ICON.search(answer["Location"]) and answer["Location"].startswith("/static/console/")
