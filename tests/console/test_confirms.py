"""Destructive actions ask first, as Stop does: revoking a token, removing a key."""

import pytest

pytestmark = pytest.mark.django_db


def test_removing_a_key_asks_first_and_the_yes_removes_it(signed_in, user):
    from instances.models import Credential

    credential = Credential.create_for(user, label="work", secret="sk-ant-api03-" + "x" * 60)
    page = signed_in.get("/credentials/").content.decode()
    confirm = page[page.index('<details class="stop-confirm">') :]
    assert confirm.index("Remove…") < confirm.index("Yes, remove it") < confirm.index("Keep it") < confirm.index("</details>")
    assert signed_in.post(f"/credentials/{credential.pk}/remove").status_code == 302
    assert not Credential.objects.filter(pk=credential.pk).exists()
