"""The run page's "Continue this run" form and the links between a run and its continuation."""

import re

import pytest
from django.utils import timezone

from loops import services
from loops.models import Interjection, Run

pytestmark = pytest.mark.django_db

FORM = 'id="run-{}-continue"'


def ended(run, outcome, verified=None):
    Run.objects.filter(pk=run.pk).update(
        status="finished", outcome=outcome, outcome_detail="ended for the test", verified=verified,
        finished_at=timezone.now(),
    )
    run.refresh_from_db()
    return run


def test_a_stopped_run_is_continued_from_its_page_and_the_runs_link_both_ways(signed_in, instance, start_run, user):
    old = services.run_cancel(run=start_run(instance, max_iterations=4), user=user)
    assert old.outcome == "cancelled"
    page = signed_in.get(f"/runs/{old.pk}/")
    html = page.content.decode()
    assert FORM.format(old.pk) in html and "Continue as a new run" in html
    assert 'value="4"' in html  # the old run's limit, ready to change

    answer = signed_in.post(
        f"/runs/{old.pk}/continue", {"message": "try\r\nagain", "max_iterations": "6", "max_cost_usd": "1.25"}
    )
    new = Run.objects.get(continued_from=old)
    assert answer.status_code == 302 and answer["Location"] == f"/runs/{new.pk}/"
    assert (new.max_iterations, new.max_cost_micros, new.owner) == (6, 1_250_000, user)
    assert Interjection.objects.get(run=new).text == "try\nagain"

    shown = signed_in.get(answer["Location"]).content.decode()
    assert f"Run {new.pk} continues run {old.pk}." in shown
    assert re.search(rf'Continued from <a href="/runs/{old.pk}/">run {old.pk}</a>', shown)
    assert f'continuing <a href="/runs/{old.pk}/">run {old.pk}</a>' in shown  # its timeline's first event
    assert FORM.format(new.pk) not in shown  # it has not finished
    back = signed_in.get(f"/runs/{old.pk}/").content.decode()
    assert re.search(rf'Continued as <a href="/runs/{new.pk}/">run {new.pk}</a>', back)
    assert FORM.format(old.pk) not in back  # continued once


def test_a_second_click_shows_the_run_that_continues_it(signed_in, instance, start_run):
    old = ended(start_run(instance), "max_iterations")
    first = signed_in.post(f"/runs/{old.pk}/continue", {"max_iterations": "3"})
    again = signed_in.post(f"/runs/{old.pk}/continue", {"max_iterations": "3"})
    new = Run.objects.get(continued_from=old)
    assert first["Location"] == again["Location"] == f"/runs/{new.pk}/"
    assert Run.objects.count() == 2
    assert f"is continued as run {new.pk} already" in signed_in.get(again["Location"]).content.decode()


def test_a_budget_exhausted_run_has_no_form_and_a_post_says_resume(signed_in, instance, start_run):
    old = ended(start_run(instance), "budget_exhausted")
    assert FORM.format(old.pk) not in signed_in.get(f"/runs/{old.pk}/").content.decode()
    answer = signed_in.post(f"/runs/{old.pk}/continue", {"max_iterations": "3"})
    assert answer.status_code == 409 and "use resume" in answer.content.decode()
    assert Run.objects.count() == 1


@pytest.mark.parametrize(
    "outcome, verified",
    [("escalated", None), ("crashed", None), ("credential_error", None), ("provider_error", None), ("done", True),
     ("cancelled", None), ("failed", None), ("max_iterations", None), ("no_progress", None), ("timed_out", None),
     ("done", False)],
)
def test_every_finished_run_but_one_out_of_budget_has_the_form(signed_in, instance, start_run, outcome, verified):
    old = ended(start_run(instance), outcome, verified)
    html = signed_in.get(f"/runs/{old.pk}/").content.decode()
    assert FORM.format(old.pk) in html and "Continue as a new run" in html
    assert ("the new run&#x27;s objective" in html) == bool(verified)  # a verified done is followed up


def test_a_verified_done_is_followed_up_with_the_message_as_its_objective(signed_in, instance, start_run):
    old = ended(start_run(instance), "done", verified=True)
    empty = signed_in.post(f"/runs/{old.pk}/continue", {"max_iterations": "3"})
    assert empty.status_code == 400 and "This field is required." in empty.content.decode()
    answer = signed_in.post(f"/runs/{old.pk}/continue", {"max_iterations": "3", "message": "Now add a README"})
    new = Run.objects.get(continued_from=old)
    assert answer.status_code == 302 and new.objective == "Now add a README"
    assert not Interjection.objects.filter(run=new).exists()  # the objective itself, not a message


def test_an_unverified_done_has_the_form(signed_in, instance, start_run):
    old = ended(start_run(instance), "done", verified=False)
    assert FORM.format(old.pk) in signed_in.get(f"/runs/{old.pk}/").content.decode()


def test_a_running_run_has_no_form_and_a_post_is_refused(signed_in, instance, start_run):
    old = start_run(instance)
    assert FORM.format(old.pk) not in signed_in.get(f"/runs/{old.pk}/").content.decode()
    answer = signed_in.post(f"/runs/{old.pk}/continue", {"max_iterations": "3"})
    assert answer.status_code == 409 and "is still queued" in answer.content.decode()


def test_bad_limits_are_shown_on_the_form(signed_in, instance, start_run):
    old = ended(start_run(instance), "failed")
    answer = signed_in.post(f"/runs/{old.pk}/continue", {"max_iterations": "0", "max_cost_usd": "abc"})
    html = answer.content.decode()
    assert answer.status_code == 400
    assert "Max iterations must be at least 1." in html and "The cost cap must be an amount of dollars" in html
    assert Run.objects.count() == 1


def test_signed_out_and_another_users_run_are_refused(client, other_user, instance, start_run):
    old = ended(start_run(instance), "failed")
    anonymous = client.post(f"/runs/{old.pk}/continue", {"max_iterations": "3"})
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/?next=")
    client.force_login(other_user)
    assert client.post(f"/runs/{old.pk}/continue", {"max_iterations": "3"}).status_code == 404
    assert client.get(f"/runs/{old.pk}/continue").status_code == 405
    assert Run.objects.count() == 1


def test_stopping_from_the_page_offers_to_continue(signed_in, instance, start_run):
    old = start_run(instance)
    answer = signed_in.post(f"/runs/{old.pk}/stop", headers={"HX-Request": "true"})
    assert answer.status_code == 200 and FORM.format(old.pk) in answer.content.decode()
