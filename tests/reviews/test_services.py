"""After a run stops: the review queue, receipts and notifications; a reviewer's verdict."""

from decimal import Decimal

import pytest

from audit.models import AuditEntry
from loops.models import Run
from loops.services import Refused
from reviews import services, snapshots
from reviews.models import Delivery, GradeRecord, Grading, NotificationTarget, Receipt, ReviewItem

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def verified_done(user, make_instance, script, start, drive):
    def build(sample_percent=None):
        agent = script("pathlib.Path('answer.txt').write_text('42')\n")
        check = script("sys.exit(0 if pathlib.Path('answer.txt').read_text() == '42' else 1)\n")
        inst = make_instance(user, command=agent, checks=[{"name": "answer", "command": check, "required": True}])
        if sample_percent is not None:
            Grading.objects.create(instance=inst, sample_percent=Decimal(sample_percent))
        run = start(inst)
        snapshots.take(run)
        run = drive(run)
        assert (run.outcome, run.verified) == ("done", True)
        return run

    return build


def items(run):
    return sorted(ReviewItem.objects.filter(run=run).values_list("reason", "status"))


def test_an_unverified_done_enters_the_queue_with_its_receipt(user, make_instance, script, start, drive):
    run = drive(start(make_instance(user, command=script("print('all done')\n"))))
    assert (run.outcome, run.verified) == ("done", False)
    services.on_run_finished(run)
    services.on_run_finished(run.pk)  # twice: nothing new
    assert items(run) == [("unverified", "pending")]
    assert Receipt.objects.get(run=run).envelope["receipt"]["verified"] is False


@pytest.mark.parametrize(("percent", "expected"), [(100, [("sampled", "pending")]), (0, [])])
def test_a_verified_done_is_sampled_at_its_rate(verified_done, percent, expected):
    run = verified_done(sample_percent=percent)
    services.on_run_finished(run)
    assert items(run) == expected
    assert Receipt.objects.filter(run=run).exists()


def test_the_sample_follows_the_seed(verified_done, settings):
    from reviews import sampling

    run = verified_done()  # the default 10 %
    services.on_run_finished(run)
    expected = sampling.is_sampled(run.pk, Decimal(10), b"tests")
    assert bool(items(run)) == expected


def test_the_judges_call_for_a_person_wins_over_unverified(verified_done):
    run = verified_done(sample_percent=0)
    Run.objects.filter(pk=run.pk).update(verified=False)
    GradeRecord.objects.update_or_create(  # as the judge would have graded it
        run=run, iteration=1, defaults={"verified": False, "review": True, "outcome": "done", "judge": {"verdict": "needs-human", "reasons": ["taste"]}}
    )
    services.on_run_finished(run)
    [item] = ReviewItem.objects.filter(run=run)
    assert item.reason == "needs_human" and "taste" in item.detail


def test_a_failed_run_is_queued_and_notified(user, make_instance, script, start, drive):
    NotificationTarget.objects.create(owner=user, kind="email", address="ada@example.com")
    inst = make_instance(user, command=script("sys.exit(0)\n"), checks=[{"name": "t", "command": script("sys.exit(1)\n")}])
    run = drive(start(inst, max_iterations=1))
    services.on_run_finished(run)
    assert items(run) == [("failed", "pending")]
    [delivery] = Delivery.objects.filter(run=run)
    assert delivery.event == "run.failed"


def test_an_escalation_is_queued_while_it_waits_and_resolved_once_answered(user, make_instance, start):
    run = start(make_instance(user))
    Run.objects.filter(pk=run.pk).update(status="waiting", outcome_detail="which database?", next_iteration=2)
    services.on_run_finished(run)
    assert items(run) == [("escalated", "pending")]
    with pytest.raises(Refused, match="waits for an answer"):
        services.review_decide(item=ReviewItem.objects.get(run=run), user=user, verdict="accept")

    from django.utils import timezone

    Run.objects.filter(pk=run.pk).update(status="finished", outcome="done", verified=False, finished_at=timezone.now())
    services.on_run_finished(run)
    assert items(run) == [("escalated", "resolved"), ("unverified", "pending")]


def test_a_cancelled_run_needs_nobody(user, make_instance, start):
    from loops import services as loop_services

    run = loop_services.run_cancel(run=start(make_instance(user)), user=user)
    services.on_run_finished(run)
    assert items(run) == []
    assert Receipt.objects.filter(run=run).exists()


def test_a_live_run_is_left_alone(user, make_instance, start):
    run = start(make_instance(user))
    services.on_run_finished(run)
    assert not ReviewItem.objects.exists() and not Receipt.objects.exists()


def test_a_verdict_is_recorded_audited_and_signed(verified_done, user, other_user, rf):
    run = verified_done(sample_percent=100)
    services.on_run_finished(run)
    item = ReviewItem.objects.get(run=run)
    with pytest.raises(Refused) as refused:
        services.review_decide(item=item, user=other_user, verdict="accept")
    assert refused.value.status == 404
    with pytest.raises(Refused, match="say why"):
        services.review_decide(item=item, user=user, verdict="reject")
    with pytest.raises(Refused, match="'accept' or 'reject'"):
        services.review_decide(item=item, user=user, verdict="maybe")

    request = rf.post("/", HTTP_USER_AGENT="Firefox/140")
    item = services.review_decide(item=item, user=user, verdict="reject", note="the answer is hard-coded", request=request)
    assert (item.status, item.note, item.decided_by) == ("rejected", "the answer is hard-coded", user)
    entry = AuditEntry.objects.get(action="review.reject")
    assert (entry.run_id, entry.user_agent, entry.via, entry.detail["note"]) == (run.pk, "Firefox/140", "console", "the answer is hard-coded")
    assert Receipt.objects.get(run=run).envelope["receipt"]["review"]["verdict"] == "rejected"
    with pytest.raises(Refused) as refused:
        services.review_decide(item=item, user=user, verdict="accept")
    assert refused.value.status == 409
