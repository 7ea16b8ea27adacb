"""Delegation: a Claude agent hands sub-objectives to child runs with budgets carved from its own.

The parent is a Claude-brain run (the local Messages server scripts it); the children are
scripted command agents (an instance the owner has, and a template the operator made). Each
run is driven in this thread in turn, as workers would pick them up.
"""

import pytest

from budgets import selectors
from budgets.models import Pool, Reservation
from instances.models import AgentTemplate, Credential
from loops import delegation, services
from loops.models import Event, Run
from tests.fakes.messages_server import MessagesServer, text, tool_use, tool_uses
from tests.loops.conftest import drive_in_thread
from web import ops

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-ant-api03-DELEGATIONTESTKEY-0123456789abcdefQRST"
HELPER = "pathlib.Path('helped.txt').write_text('helped ' + sys.stdin.read()[:40])\nprint('I helped with it')\n"
FIXER = "pathlib.Path('fixed.txt').write_text('fixed')\nprint('fixed it in my copy')\n"
CHECK_OWN = "sys.exit(0 if pathlib.Path('helped.txt').exists() else 1)\n"
CHECK_COPY = "sys.exit(0 if pathlib.Path('fixed.txt').exists() and pathlib.Path('base.txt').exists() else 1)\n"
CHECK_REPORT = "sys.exit(0 if 'fixed' in pathlib.Path('REPORT.md').read_text() else 1)\n"


@pytest.fixture
def server():
    with MessagesServer(api_key=KEY) as running:
        yield running


@pytest.fixture
def family(user, make_instance, script, server, price):
    """A lead (Claude, may delegate), a helper instance it owns, and a `fixer` template."""
    credential = Credential.create_for(user, label="k", secret=KEY)
    lead = make_instance(
        user, name="lead", brain="anthropic", decider="checks", base_url=server.url, credential=credential,
        model="claude-test-1", tools=["write_file", "delegate"], command=[],
        checks=[{"name": "report", "command": script(CHECK_REPORT)}], max_iterations=4,
    )
    lead.workspace_path().mkdir(parents=True, exist_ok=True)
    (lead.workspace_path() / "base.txt").write_text("the lead's work\n")
    make_instance(user, name="helper", command=script(HELPER), checks=[{"name": "own", "command": script(CHECK_OWN)}])
    AgentTemplate.objects.create(
        name="fixer", description="fixes things", brain="command", command=script(FIXER), decider="checks",
        checks=[{"name": "copy", "command": script(CHECK_COPY)}], max_iterations=2,
    )
    return lead


def delegate(to, objective, cost, workspace="own", **extra):
    return ("delegate", {"to": to, "objective": objective, "max_cost_usd": cost, "workspace": workspace, **extra})


def children_of(run):
    return list(Run.objects.filter(parent=run).order_by("pk"))


def test_a_parent_fans_out_waits_without_a_worker_and_resumes_with_the_results(user, family, server):
    server.enqueue(
        tool_uses([delegate("helper", "help with the report", 0.20),
                   delegate("fixer", "fix it in a copy", 0.30, workspace="copy")], say="Delegating."),
        tool_use("write_file", {"path": "REPORT.md", "content": "helper helped; fixer fixed"}),
        text("The report is written."),
    )
    run = drive_in_thread(services.run_start(instance=family, user=user, objective="write the report",
                                             max_cost_usd="1.00"))
    # Parked on its children: no lease, no worker.
    assert run.status == "waiting" and run.lease_token is None and run.delegation["state"] == "waiting"
    kids = children_of(run)
    assert len(kids) == 2 and all(k.depth == 1 and k.status == "queued" for k in kids), [(k.depth, k.status, k.outcome, k.outcome_detail) for k in kids]
    helper, fixer = kids
    assert helper.instance.name == "helper" and fixer.instance.template.name == "fixer"
    # The copy child starts from a copy of the lead's workspace.
    assert (fixer.instance.workspace_path() / "base.txt").read_text() == "the lead's work\n"
    # Carved: each child's pool nests under the parent's run pool.
    parent_pool = Pool.objects.get(kind="run", run=run)
    for kid in kids:
        assert Pool.objects.get(kind="run", run=kid).parent_id == parent_pool.pk
    assert drive_in_thread(helper).outcome == "done"
    assert Run.objects.get(pk=run.pk).status == "waiting"  # one child still running
    assert drive_in_thread(fixer).outcome == "done"
    run.refresh_from_db()
    assert run.status == "queued"  # resumed by the last child's finish
    assert f"run {helper.pk} on helper: done (verified)" in run.next_instruction
    assert "fixed.txt" in run.next_instruction  # the copy child's patch
    run = drive_in_thread(run)
    assert (run.outcome, run.verified) == ("done", True), run.outcome_detail
    tree = [run, *kids]
    assert sum(r.spent_micros for r in tree) <= 1_000_000
    assert selectors.audit_pools() == []
    assert not Reservation.objects.filter(status="held").exists()
    assert Event.objects.filter(run=run, kind="run.delegated").exists()


SPENDER = "json.dump({'cost_usd': 0.03}, open(os.environ['TETHER_USAGE_FILE'], 'w'))\n" + HELPER


def test_carves_are_held_until_the_children_finish_and_what_they_leave_goes_back(user, family, script):
    from budgets import booking, ledger

    family.__class__.objects.filter(owner=user, name="helper").update(command=script(SPENDER))
    parent = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    results = delegation.start_children(parent, 1, [
        {"id": "a", "input": {"to": "helper", "objective": "the first half", "max_cost_usd": 0.40}},
        {"id": "b", "input": {"to": "helper", "objective": "the second half", "max_cost_usd": 0.60}},
        {"id": "c", "input": {"to": "helper", "objective": "one more", "max_cost_usd": 0.01}},
    ])
    assert [sorted(r) for r in results] == [["child", "id", "to"], ["child", "id", "to"], ["error", "id", "to"]]
    assert results[2]["error"] == "a $0.01 budget does not fit: $0.00 of yours is left to carve"
    a, b = children_of(parent)
    # The two carves are held: the parent's whole headroom, which it cannot spend itself meanwhile.
    parent_pool = Pool.objects.get(kind="run", run=parent)
    assert (parent_pool.reserved, selectors.headroom_for_run(parent).remaining) == (1_000_000, 0)
    with pytest.raises(booking.BudgetRefused, match="has \\$0.00 left"):
        ledger.hold(run=parent, iteration=1, amount=1)
    # Each child spends in its own pool only: its carve.
    for kid, cap in ((a, 400_000), (b, 600_000)):
        (own,) = selectors.run_chain(kid)
        assert (own.run_id, own.limit, own.parent_id) == (kid.pk, cap, parent_pool.pk)
    assert drive_in_thread(a).outcome == "done"
    parent_pool.refresh_from_db()
    assert (parent_pool.spent, parent_pool.reserved) == (a.spent_micros, 600_000) and a.spent_micros > 0
    assert drive_in_thread(b).outcome == "done"
    parent_pool.refresh_from_db()
    spent = a.spent_micros + b.spent_micros
    assert (parent_pool.spent, parent_pool.reserved) == (spent, 0)
    assert selectors.headroom_for_run(parent).remaining == 1_000_000 - spent
    ledger.hold(run=parent, iteration=1, amount=1_000_000 - spent)  # the unspent part is the parent's again
    assert Run.objects.get(pk=parent.pk).spent_micros == 0  # a run's own spend; the tree's adds its children's
    assert selectors.audit_pools() == []
    # The metrics count the children's spend once (their calls), not again as the settled carves.
    (total,) = [line.split()[-1] for line in ops.collect().splitlines() if line.startswith("tether_spent_usd_total ")]
    assert float(total) == pytest.approx(spent / 1_000_000)


def test_a_child_on_another_instance_is_held_to_that_instances_pool_too(user, family, script):
    """Delegation is no way around the target instance's own limit (or its period)."""
    from budgets import limits
    from budgets.services import instance_pool

    helper = family.__class__.objects.get(owner=user, name="helper")
    helper.command = script(SPENDER)
    helper.save(update_fields=["command"])
    pool = instance_pool(helper)
    limits.set_limit(pool, 500_000, "operator")
    parent = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    (refused,) = delegation.start_children(parent, 1, [{"id": "a", "input": {"to": "helper", "objective": "x", "max_cost_usd": 0.60}}])
    assert "does not fit" in refused["error"] and "helper" in refused["error"] and children_of(parent) == []
    (started,) = delegation.start_children(parent, 1, [{"id": "b", "input": {"to": "helper", "objective": "x", "max_cost_usd": 0.40}}])
    (kid,) = children_of(parent)
    pool.refresh_from_db()
    assert pool.reserved == 400_000 and started["child"] == kid.pk  # held in the helper's pool while it runs
    assert drive_in_thread(kid).outcome == "done"
    pool.refresh_from_db()
    assert (pool.spent, pool.reserved) == (kid.spent_micros, 0) and kid.spent_micros > 0
    assert selectors.audit_pools() == []


def test_a_child_that_does_not_fit_beside_a_held_carve_is_refused_and_no_run_is_made(user, family):
    parent = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    helper = family.__class__.objects.get(owner=user, name="helper")
    services.run_start(instance=helper, user=user, objective="a", max_cost_usd="0.60", via="system", parent=parent)
    runs = Run.objects.count()
    with pytest.raises(services.Refused) as refused:
        services.run_start(instance=helper, user=user, objective="b", max_cost_usd="0.60", via="system", parent=parent)
    assert str(refused.value) == (
        f"a budget of $0.60 does not fit: pool 'run {parent.pk}' has $0.40 left of its $1.00 limit "
        "(spent $0.00, reserved $0.60); the child run's budget needs up to $0.60"
    )
    assert Run.objects.count() == runs and Reservation.objects.filter(carved__isnull=False).count() == 1


def test_a_finished_child_is_not_resumed_past_its_carve(user, family):
    parent = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    helper = family.__class__.objects.get(owner=user, name="helper")
    child = services.run_start(instance=helper, user=user, objective="a", max_cost_usd="0.10", via="system",
                               parent=parent)
    Run.objects.filter(pk=child.pk).update(status="finished", outcome="budget_exhausted")
    with pytest.raises(services.Refused, match=f"delegated by run {parent.pk}"):
        services.run_resume(run=child, user=user, max_cost_usd="0.50")


def tool_results(request):
    """{tool_use_id: (is_error, text)} of the tool_result blocks a request to the model carries last."""
    last = request.body["messages"][-1]["content"]
    return {b["tool_use_id"]: (bool(b.get("is_error")), b["content"]) for b in last if b.get("type") == "tool_result"}


def test_refusals_are_tool_errors_the_model_reads_and_no_run_is_made(user, family, server, settings):
    settings.TETHER_DELEGATION_MAX_CHILDREN = 1
    server.enqueue(
        tool_uses([("delegate", {"to": "helper", "objective": "too big", "max_cost_usd": 5.00}, "big"),
                   ("delegate", {"to": "nobody", "objective": "who?", "max_cost_usd": 0.10}, "nobody"),
                   ("delegate", {"to": "helper", "objective": "first", "max_cost_usd": 0.10}, "first"),
                   ("delegate", {"to": "helper", "objective": "second", "max_cost_usd": 0.10}, "second")]),
        text("I will wait for the one that was accepted."),
    )
    run = drive_in_thread(services.run_start(instance=family, user=user, objective="write the report",
                                             max_cost_usd="1.00"))
    # Each refusal is the tool_result of its own call, in the same turn; the accepted call is told so.
    said = tool_results(server.requests[1])
    assert said["big"][0] and "does not fit" in said["big"][1]
    assert said["nobody"][0] and "no instance or template named 'nobody'" in said["nobody"][1]
    assert said["second"][0] and "at most 1 children per act" in said["second"][1]
    assert not said["first"][0] and said["first"][1].startswith("accepted")
    (child,) = children_of(run)  # no run for any refused call
    assert child.objective == "first" and run.status == "waiting"


def test_a_delegate_cannot_reach_more_than_its_parent(user, family, server, make_instance, script):
    """No network egress or MCP server by handing the work to an instance (or template) that has it."""
    make_instance(user, name="online", command=script(HELPER), network=True)
    make_instance(user, name="connected", command=script(HELPER), mcp_servers=["files"])
    AgentTemplate.objects.create(name="surfer", brain="command", command=script(FIXER), mcp_servers=["web"])
    server.enqueue(
        tool_uses([delegate("online", "fetch it", 0.10), delegate("connected", "look", 0.10),
                   delegate("surfer", "browse", 0.10, workspace="copy")]),
        text("ok"),
    )
    run = drive_in_thread(services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00"))
    run.refresh_from_db()
    assert children_of(run) == []
    said = " ".join(text for _, text in tool_results(server.requests[1]).values())
    assert "online has network egress and you do not" in said
    assert "connected uses MCP servers you do not (files)" in said
    assert "template surfer uses MCP servers you do not (web)" in said


def test_a_delegation_gated_behind_approval_starts_once_a_person_approves(user, family, server):
    family.approval_tools = ["delegate"]
    family.save(update_fields=["approval_tools"])
    server.enqueue(
        tool_uses([delegate("helper", "help with the report", 0.20)]),
        tool_use("write_file", {"path": "REPORT.md", "content": "helper helped; fixed"}),
        text("The report is written."),
    )
    run = drive_in_thread(services.run_start(instance=family, user=user, objective="write the report",
                                             max_cost_usd="1.00"))
    assert run.status == "waiting" and children_of(run) == []  # parked for a person, nothing started
    services.run_interject(run=run, user=user, text="go ahead", approve=True)
    run = drive_in_thread(Run.objects.get(pk=run.pk))
    assert len(server.requests) == 1  # the approved call is started by the loop, not asked of the model again
    (helper,) = children_of(run)
    assert run.status == "waiting" and run.delegation["state"] == "waiting"
    assert drive_in_thread(helper).outcome == "done"
    run = drive_in_thread(Run.objects.get(pk=run.pk))
    assert (run.outcome, run.verified) == ("done", True), run.outcome_detail


def test_depth_and_tree_limits_refuse(user, family, server, settings):
    settings.TETHER_DELEGATION_MAX_DEPTH = 0
    server.enqueue(tool_uses([delegate("helper", "x", 0.10)]), text("ok"))
    run = drive_in_thread(services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00"))
    run.refresh_from_db()
    said = " ".join(text for r in server.requests for _, text in tool_results(r).values())
    assert children_of(run) == [] and "levels deep, past the limit of 0" in said
    settings.TETHER_DELEGATION_MAX_DEPTH = 3
    settings.TETHER_DELEGATION_MAX_RUNS = 1
    server.enqueue(tool_uses([delegate("helper", "x", 0.10)]), text("ok"))
    second = drive_in_thread(services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00"))
    second.refresh_from_db()
    said = " ".join(text for r in server.requests for _, text in tool_results(r).values())
    assert children_of(second) == [] and "already has 1, the limit" in said


def test_cancelling_the_parent_cancels_its_live_children(user, family, server):
    server.enqueue(tool_uses([delegate("helper", "a", 0.10), delegate("fixer", "b", 0.10, workspace="copy")]))
    run = drive_in_thread(services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00"))
    assert run.status == "waiting" and len(children_of(run)) == 2
    services.run_cancel(run=run, user=user)
    run.refresh_from_db()
    assert run.outcome == "cancelled" and "while its children ran" in run.outcome_detail
    assert all(k.outcome == "cancelled" for k in children_of(run))
    assert not Reservation.objects.filter(status="held").exists()  # the children's carves went back
    assert Pool.objects.get(kind="run", run=run).reserved == 0
    assert selectors.audit_pools() == []


def test_a_person_stopping_one_child_resumes_the_parent_with_that_outcome(user, family, server):
    server.enqueue(tool_uses([delegate("helper", "a", 0.10)]),
                   tool_use("write_file", {"path": "REPORT.md", "content": "fixed anyway"}), text("ok"))
    run = drive_in_thread(services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00"))
    (child,) = children_of(run)
    services.run_cancel(run=child, user=user)
    run.refresh_from_db()
    assert run.status == "queued" and f"run {child.pk} on helper: cancelled" in run.next_instruction


def test_an_answer_to_a_parent_waiting_for_children_does_not_resume_it(user, family, server):
    server.enqueue(tool_uses([delegate("helper", "a", 0.10)]))
    run = drive_in_thread(services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00"))
    services.run_interject(run=run, user=user, text="hurry up")
    run.refresh_from_db()
    assert run.status == "waiting" and delegation.waiting_for_children(run)
    with pytest.raises(services.Refused, match="waiting for its children"):
        services.run_close(run=run, user=user)


def test_the_reaper_starts_children_a_dead_worker_left_unstarted(user, family, server):
    from loops import driver

    server.enqueue(tool_uses([delegate("helper", "a", 0.10)]))
    run = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    # As if the worker died right after recording the parked iteration: no children started yet.
    Run.objects.filter(pk=run.pk).update(status="waiting", delegation={
        "state": "starting", "iteration": 1, "instruction": "o",
        "calls": [{"name": "delegate", "id": "toolu_1", "input": {"to": "helper", "objective": "a",
                                                                  "max_cost_usd": 0.1}}],
        "children": [], "refused": [],
    })
    driver.reap()
    driver.reap()  # idempotent: the call already started is not started twice
    assert len(children_of(run)) == 1





SLOW_HELPER = "time.sleep(1.5)\n" + HELPER


@pytest.mark.slow
def test_a_tree_survives_a_sigkilled_worker_and_a_cancel_reaches_every_descendant(
    user, family, server, script, clusters
):
    from loops.models import Iteration
    from tests.support.cluster import wait_for

    Instance = family.__class__
    Instance.objects.filter(owner=user, name="helper").update(command=script(SLOW_HELPER))
    server.enqueue(
        tool_uses([delegate("helper", "a", 0.20), delegate("fixer", "b", 0.20, workspace="copy")]),
        tool_use("write_file", {"path": "REPORT.md", "content": "fixed"}),
        text("done"),
    )
    run = services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00")
    first = clusters("first")
    wait_for(lambda: Event.objects.filter(run__parent=run, kind="act.started").exists(), 60, "a child's act")
    first.kill()  # mid-act of a child
    # The survivor holds longer leases than the killed cluster: the kill is taken over after 2 s, and
    # a loaded machine never expires a lease it keeps (a scripted reply asked twice runs out).
    clusters("second", TETHER_LEASE_SECONDS="10")
    run = wait_for(lambda: Run.objects.filter(pk=run.pk, status="finished").first(), 90, "the tree to finish")
    assert (run.outcome, run.verified) == ("done", True), run.outcome_detail
    for member in [run, *children_of(run)]:
        numbers = list(Iteration.objects.filter(run=member).values_list("number", flat=True))
        assert len(numbers) == len(set(numbers)), f"run {member.pk} recorded an iteration twice"
        assert member.status == "finished"
    assert not Reservation.objects.filter(status="held").exists()
    assert selectors.audit_pools() == []

    # A cancel reaches every live descendant.
    server.enqueue(tool_uses([delegate("helper", "again", 0.20)]))
    second = services.run_start(instance=family, user=user, objective="again", max_cost_usd="1.00")
    wait_for(lambda: Event.objects.filter(run__parent=second, kind="act.started").exists(), 60, "the child's act")
    import time

    asked = time.monotonic()
    services.run_cancel(run=second, user=user)
    (child,) = children_of(second)
    child = wait_for(lambda: Run.objects.filter(pk=child.pk, status="finished").first(), 10, "the child to stop")
    print(f"the child stopped {time.monotonic() - asked:.2f}s after its parent's cancel")
    assert child.outcome == "cancelled"  # not done: the cancel cut its act short


def test_the_parents_receipt_names_each_childs_receipt(user, family, server):
    from reviews import receipts

    server.enqueue(
        tool_uses([delegate("helper", "a", 0.10)]),
        tool_use("write_file", {"path": "REPORT.md", "content": "fixed"}),
        text("done"),
    )
    run = drive_in_thread(services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00"))
    (child,) = children_of(run)
    drive_in_thread(child)
    run = drive_in_thread(Run.objects.get(pk=run.pk))
    envelope = receipts.for_run(run)
    assert receipts.verify(envelope).ok
    (named,) = envelope["receipt"]["children"]
    child_envelope = receipts.for_run(child)
    assert named == {"run": child.pk, "receipt_sha256": receipts._digest(child_envelope["signature"]["fields"])}
    assert receipts.verify(child_envelope).ok and child_envelope["receipt"]["parent"] == run.pk


def test_a_parent_waiting_for_children_does_not_need_a_person(user, family, server):
    from loops import selectors as loop_selectors

    server.enqueue(tool_uses([delegate("helper", "a", 0.10)]))
    run = drive_in_thread(services.run_start(instance=family, user=user, objective="o", max_cost_usd="1.00"))
    assert run.status == "waiting"
    assert run not in loop_selectors.needs_you(user).waiting
