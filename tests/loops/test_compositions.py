"""Compositions: a lead delegates to named roles, and its done is verified only with QA's pass.

The lead is Claude (the local Messages server scripts it); the planner, builder and QA roles are
scripted command agents working in the lead's workspace (`shared`), so the whole loop —
plan, build, QA fails, build again, QA passes — runs through the real runner.
"""

import pytest

from instances.models import AgentTemplate, Credential
from instances.templates_loader import create_instance
from loops import services
from loops.models import Run
from tests.fakes.messages_server import MessagesServer, text, tool_use
from tests.loops.conftest import drive_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-ant-api03-COMPOSITIONTESTKEY-0123456789abcdefQRST"
BUGGY = "def add(a, b):\n    return a - b\n"
TEST = "from app import add\n\nassert add(2, 3) == 5\n"
PLANNER = "pathlib.Path('PLAN.md').write_text('1. fix add\\n\\n## Acceptance checks\\n- test_app.py passes\\n')\n"
HONEST_BUILDER = """
count = pathlib.Path('.builds'); n = int(count.read_text()) + 1 if count.exists() else 1; count.write_text(str(n))
if n >= 2:
    pathlib.Path('app.py').write_text('def add(a, b):\\n    return a + b\\n')
print('built, pass', n)
"""
LAZY_BUILDER = "print('All done, it works!')\n"
QA_CHECK = "sys.path.insert(0, os.getcwd())\nimport runpy\nrunpy.run_path('test_app.py')\n"


@pytest.fixture
def lead(user, make_instance, script, price, tmp_path):
    def build(builder_body):
        for name, body, checks in (
            ("t-planner", PLANNER, [{"name": "plan", "command": ["test", "-s", "PLAN.md"]}]),
            ("t-builder", builder_body, []),
            ("t-qa", "print('checking')\n", [{"name": "acceptance", "command": script(QA_CHECK)}]),
        ):
            AgentTemplate.objects.create(name=name, description=name, brain="command", command=script(body),
                                         decider="checks", checks=checks, max_iterations=1)
        AgentTemplate.objects.create(
            name="t-pbq", description="plan, build, qa", brain="anthropic", model="claude-test-1", decider="checks",
            tools=["read_file", "delegate"], max_iterations=8,
            checks=[{"name": "plan", "command": ["test", "-s", "PLAN.md"]}],
            roles={"planner": "t-planner", "builder": "t-builder", "qa": "t-qa"}, verify_with_role="qa",
        )
        server = MessagesServer(api_key=KEY).start()
        credential = Credential.create_for(user, label="k", secret=KEY)
        inst = create_instance(owner=user, template="t-pbq", name="lead", overrides={
            "credential_id": credential.pk, "base_url": server.url, "workspace": str(tmp_path / "lead"),
        })
        inst.workspace_path().mkdir(parents=True, exist_ok=True)
        (inst.workspace_path() / "app.py").write_text(BUGGY)
        (inst.workspace_path() / "test_app.py").write_text(TEST)
        return inst, server

    made = []

    def wrapped(body):
        inst, server = build(body)
        made.append(server)
        return inst, server

    yield wrapped
    for server in made:
        server.stop()


def role(to, objective):
    return tool_use("delegate", {"to": to, "objective": objective, "max_cost_usd": 0.05, "workspace": "shared"})


def drive_tree(run):
    """Drive the lead and, whenever it waits, its children, until it finishes."""
    for _ in range(20):
        run = drive_in_thread(Run.objects.get(pk=run.pk))
        if run.status == "finished":
            return run
        for child in Run.objects.filter(parent=run).exclude(status="finished"):
            drive_in_thread(child)
    raise AssertionError("the tree did not finish")


def test_qa_fails_the_first_build_the_builder_fixes_qa_passes_and_the_lead_is_verified(user, lead):
    inst, server = lead(HONEST_BUILDER)
    server.enqueue(
        role("planner", "plan the fix of add"),
        role("builder", "implement PLAN.md"),
        role("qa", "check the acceptance criteria in PLAN.md"),
        role("builder", "QA failed: test_app.py still fails; fix add"),
        role("qa", "check the acceptance criteria in PLAN.md"),
        text("QA passed; the objective is done."),
    )
    run = drive_tree(services.run_start(instance=inst, user=user, objective="fix add", max_cost_usd="1.00"))
    qa_runs = list(Run.objects.filter(parent=run, instance__template__name="t-qa").order_by("pk"))
    assert [r.outcome == "done" for r in qa_runs] == [False, True]  # QA failed the first build
    assert (run.outcome, run.verified) == ("done", True), run.outcome_detail
    assert (inst.workspace_path() / "app.py").read_text().endswith("a + b\n")


def test_a_builder_that_claims_done_without_fixing_never_makes_the_lead_verified(user, lead):
    inst, server = lead(LAZY_BUILDER)
    server.enqueue(
        role("planner", "plan the fix of add"),
        role("builder", "implement PLAN.md"),
        role("qa", "check the acceptance criteria in PLAN.md"),
        text("The builder says it works; done."),
    )
    run = drive_tree(services.run_start(instance=inst, user=user, objective="fix add", max_cost_usd="1.00"))
    assert run.outcome == "done" and run.verified is False
    assert "the qa's last run" in run.outcome_detail or "qa" in run.outcome_detail.lower()


def test_a_qa_pass_from_before_the_builders_last_change_does_not_verify_the_lead(user, lead):
    inst, server = lead(HONEST_BUILDER)
    server.enqueue(
        role("planner", "plan the fix of add"),
        role("builder", "implement PLAN.md"),
        role("qa", "check the acceptance criteria in PLAN.md"),
        role("builder", "QA failed: fix add"),
        role("qa", "check the acceptance criteria in PLAN.md"),
        role("builder", "one more change after QA passed"),
        text("QA passed earlier; done."),
    )
    run = drive_tree(services.run_start(instance=inst, user=user, objective="fix add", max_cost_usd="1.00"))
    assert Run.objects.filter(parent=run, instance__template__name="t-qa", outcome="done").exists()  # it did pass
    assert (run.outcome, run.verified) == ("done", False), run.outcome_detail
    assert "is older than run" in run.outcome_detail
