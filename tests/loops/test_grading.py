"""A proposed done's graders are an explicit registry, asked in a declared order (not signal receivers)."""

import pytest

from instances.brains.base import Usage
from loops import delegation, grading
from loops.policy import Assessment
from reviews import graders


class Said:
    def __init__(self, name, heard):
        self.name, self.heard = name, heard

    def __call__(self, **asked):
        self.heard.append((self.name, asked["final"].number))
        return self.name


def test_graders_are_asked_in_their_declared_order_whatever_order_they_registered_in():
    heard = []
    registry = grading.Registry()
    registry.register("late", Said("late", heard), order=300)
    registry.register("early", Said("early", heard), order=100)
    registry.register("middle", Said("middle", heard), order=200)

    reports = registry.grade(run=object(), final=grading.FinalAct(4, "done"), checks=[])

    assert heard == [("early", 4), ("middle", 4), ("late", 4)]
    assert reports == ["early", "middle", "late"]


def test_a_grader_with_nothing_to_say_makes_no_report():
    registry = grading.Registry()
    registry.register("quiet", lambda **asked: None, order=1)
    registry.register("loud", lambda **asked: "report", order=2)
    assert registry.grade(run=object(), final=grading.FinalAct(1, ""), checks=[]) == ["report"]


def test_a_name_or_an_order_already_taken_is_refused():
    registry = grading.Registry()
    registry.register("one", lambda **asked: None, order=10)
    with pytest.raises(grading.AlreadyRegistered, match="'one' is already registered"):
        registry.register("one", lambda **asked: None, order=20)
    with pytest.raises(grading.AlreadyRegistered, match="order 10 is already 'one'"):
        registry.register("two", lambda **asked: None, order=10)
    assert [entry.name for entry in registry.graders()] == ["one"]


def test_the_apps_register_the_role_check_then_the_configured_graders():
    entries = grading.graders()
    assert [(e.name, e.grader, e.order) for e in entries] == [
        ("composition-role", delegation.role_check, grading.ROLE),
        ("configured", graders.on_done_proposed, grading.CONFIGURED),
    ]
    with pytest.raises(grading.AlreadyRegistered):  # an app's ready run twice does not grade twice
        grading.register("configured", graders.on_done_proposed, order=grading.CONFIGURED + 1)


class Vouch:
    """A grader that vouches for the done, naming itself on the timeline."""

    def __init__(self, name, heard):
        self.name, self.heard = name, heard

    def __call__(self, *, run, final, checks, stop, meter):
        self.heard.append(self.name)
        return self

    @property
    def assessment(self):
        return Assessment(outcome="done", verified=True, evidence=f"{self.name} vouched")

    @property
    def usage(self):
        return Usage()

    def as_event(self, iteration):
        return ("grade.role", {"iteration": iteration, "passed": True, "reason": self.name})


@pytest.mark.django_db(transaction=True)
def test_the_runner_asks_the_registry_and_records_its_reports_in_the_declared_order(
    user, make_instance, script, start, drive, monkeypatch
):
    heard = []
    registry = grading.Registry()
    registry.register("second", Vouch("second", heard), order=2)
    registry.register("first", Vouch("first", heard), order=1)
    monkeypatch.setattr(grading, "grade", registry.grade)
    inst = make_instance(user, command=script("print('did it')\n"))  # no checks: the graders' evidence verifies

    run = drive(start(inst, objective="do it"))

    assert heard == ["first", "second"]
    told = [e.data["reason"] for e in run.events.filter(kind="grade.role").order_by("seq")]
    assert told == ["first", "second"]
    assert (run.outcome, run.verified) == ("done", True)
    assert "verified: first vouched; second vouched" in run.outcome_detail
