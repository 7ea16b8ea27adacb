"""Destructive actions ask first, as Stop does: revoking a token, removing a key, closing a run unanswered."""

import re

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


def _close_confirm(html, run_id):
    match = re.search(
        rf'<details class="stop-confirm close-confirm[^"]*" id="run-{run_id}-close">\s*'
        r"<summary[^>]*>Close without answering…</summary>(.*?)</details>",
        html,
        re.S,
    )
    assert match, "no confirm for Close without answering"
    return match.group(1)


def test_closing_a_waiting_run_asks_first_and_the_yes_closes_it(signed_in, instance, start_run):
    from loops.models import Run

    run = start_run(instance)
    Run.objects.filter(pk=run.pk).update(status="waiting", outcome_detail="which database?", lease_token=None)
    confirm = _close_confirm(signed_in.get(f"/runs/{run.pk}/").content.decode(), run.pk)
    # Inside the confirm: what happens, said truly (escalated is not resumed, only continued as a new run), then yes / keep.
    said = re.sub(r"<[^>]+>", "", confirm)
    assert f"Close run {run.pk} without answering? It ends at once as escalated" in said
    assert "cannot be answered or resumed later, only continued as a new run" in said
    assert said.index("Yes, close it") < said.index("Keep it waiting")
    assert f'action="/runs/{run.pk}/close"' in confirm and 'name="csrfmiddlewaretoken"' in confirm
    assert re.search(r'<button type="button" data-close-details>Keep it waiting</button>', confirm)

    # "Yes, close it" posts what Close posted before: the run ends escalated.
    closed = signed_in.post(f"/runs/{run.pk}/close", headers={"HX-Request": "true"})
    assert closed.status_code == 200 and "Closed without an answer (escalated)." in closed.content.decode()
    run.refresh_from_db()
    assert (run.status, run.outcome) == ("finished", "escalated")
    assert "close-confirm" not in closed.content.decode()  # nothing more to close


def test_the_live_drawn_close_confirm_carries_the_viewers_csrf_token(instance, start_run):
    from loops.models import Run
    from web.console import live

    run = start_run(instance)
    Run.objects.filter(pk=run.pk).update(status="waiting", outcome_detail="which database?", lease_token=None)
    run.refresh_from_db()
    message = live.for_viewer(live.render_state(run), "viewer-token-123")
    confirm = _close_confirm(message, run.pk)
    assert 'name="csrfmiddlewaretoken" value="viewer-token-123"' in confirm
    assert f'hx-post="/runs/{run.pk}/close"' in confirm and live.CSRF_SLOT not in message
