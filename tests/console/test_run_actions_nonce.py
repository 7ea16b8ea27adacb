"""A form's nonce is spent only by a message that was accepted: a refused one leaves it for the next try."""

import re

import pytest

from loops.models import Event, Interjection, Run

HX = {"HX-Request": "true"}


def nonce_of(html: str) -> str:
    return re.search(r'name="nonce" value="([0-9a-f]+)"', html).group(1)


@pytest.mark.django_db
@pytest.mark.parametrize("htmx", [True, False])
def test_a_refused_message_does_not_spend_the_forms_nonce(signed_in, instance, start_run, htmx):
    run = start_run(instance)
    Run.objects.filter(pk=run.pk).update(status="running", lease_token="held-by-a-worker")
    nonce = nonce_of(signed_in.get(f"/runs/{run.pk}/").content.decode())
    headers = HX if htmx else {}
    too_long = signed_in.post(f"/runs/{run.pk}/interject", {"text": "x" * 9000, "nonce": nonce}, headers=headers)
    assert "at most 8,000" in too_long.content.decode()
    assert nonce_of(too_long.content.decode()) == nonce  # the same form, as typed, comes back
    assert not Interjection.objects.exists()

    real = signed_in.post(
        f"/runs/{run.pk}/interject", {"text": "A real message after an error", "nonce": nonce}, headers=headers,
        follow=not htmx,
    )
    assert "sent already" not in real.content.decode()
    assert "Sent: the agent reads it" in real.content.decode()
    assert list(Interjection.objects.values_list("text", flat=True)) == ["A real message after an error"]
    assert Event.objects.filter(run=run, kind="interjection.queued").count() == 1

    # Accepted, the nonce is spent: the same form again (a double click) is not sent twice.
    again = signed_in.post(f"/runs/{run.pk}/interject", {"text": "A second, different message", "nonce": nonce},
                           headers=HX)
    assert "That message was sent already." in again.content.decode()
    assert Interjection.objects.count() == 1
