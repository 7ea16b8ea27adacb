"""Every console page has an icon (no 404 per page) and reaches the model keys from its navigation."""

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("page", ["/", "/history/", "/tokens/", "/credentials/"])
def test_every_page_links_its_icon_and_the_keys(signed_in, page):
    html = signed_in.get(page).content.decode()
    assert 'rel="icon"' in html and "favicon.svg" in html
    nav = html[html.index('class="top-nav"') : html.index("</nav>")]
    assert 'href="/credentials/"' in nav


def test_favicon_ico_points_at_the_icon(client):
    answer = client.get("/favicon.ico")
    assert answer.status_code == 301 and answer["Location"].endswith("console/favicon.svg")
