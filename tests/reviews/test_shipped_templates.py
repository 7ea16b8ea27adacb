"""Every shipped template, run end to end as a person without the capability makes it, against the local Messages server.

Claude is played by a responder that knows each shipped role by its system prompt (the lead of
plan-build-qa and its planner, builder and QA; the lead of research-write-check and its researcher,
writer and fact-checker; coder, pilot, triage) and plays it well or confidently wrong. The runs go
through the real runner (the compositions' children too, driven in this thread), with the
templates' own checks, deciders, roles and grading. A good answer ends done and verified; a
confidently wrong one (claims done, skips its QA or fact-check, answers off the schema, or
triages wrongly) never ends verified.
"""

import json
import re

import pytest
from django.contrib.auth.models import Permission

from instances import services as instance_services
from instances.models import Credential
from loops import services
from tests.fakes.messages_server import text, tool_use
from tests.loops.test_one_door import drive_tree
from tests.mcp.test_self_serve import shipped_prices  # noqa: F401 (fixture)
from tests.reviews.conftest import KEY, is_judge_call

pytestmark = pytest.mark.django_db(transaction=True)

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST = "from app import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
REPORTS = {
    "r1.txt": "The app deletes all my saved files when I press sync. Data is gone.",
    "r2.txt": "The logo on the about page is two pixels off.",
    "r3.txt": "Pressing sync wiped every saved file of mine.",
}
RIGHT_TRIAGE = [
    {
        "report": "r1.txt",
        "category": "sync",
        "severity": "critical",
        "duplicate_of": None,
        "summary": "Sync deletes saved files.",
    },
    {
        "report": "r2.txt",
        "category": "ui",
        "severity": "low",
        "duplicate_of": None,
        "summary": "The about page logo is misplaced.",
    },
    {
        "report": "r3.txt",
        "category": "sync",
        "severity": "critical",
        "duplicate_of": "r1.txt",
        "summary": "Sync wiped saved files.",
    },
]
ROLES = {
    "You lead a small team": "pbq-lead",
    "You plan; you do not implement": "planner",
    "You implement the plan": "builder",
    "You are QA with fresh eyes": "qa",
    "You lead a research-and-writing team": "rwc-lead",
    "Read every file under sources/": "researcher",
    "Write REPORT.md for the objective": "writer",
    "You check facts with fresh eyes": "checker",
    "You are a careful software engineer": "coder",
    "You are a software engineer working unattended": "pilot",
    "You triage reports": "triage",
}


def role_of(body):
    system = json.dumps(body.get("system"))
    return next((role for opening, role in ROLES.items() if opening in system), None)


def turns(body):
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def instruction(body):
    first = body["messages"][0]["content"]
    return first if isinstance(first, str) else json.dumps(first, ensure_ascii=False)


def delegate(to, objective):
    return tool_use(
        "delegate", {"to": to, "objective": objective, "workspace": "shared", "max_cost_usd": 0.5}
    )


class Claude:
    """Plays every shipped role; `wrong` makes the agent under test confidently wrong."""

    def __init__(self, wrong=False):
        self.wrong = wrong
        self.judged = 0

    def __call__(self, body):
        names = [t.get("name") for t in body.get("tools") or []]
        if is_judge_call(body):
            self.judged += 1
            return self.judge(body)
        if names == [
            "record_decision"
        ]:  # an llm decider that believes whatever it is told: the graders must not
            return tool_use("record_decision", {"verdict": "done", "reason": "the agent says it is done"})
        role = role_of(body)
        play = getattr(self, role.replace("-", "_"), None) if role else None
        assert play is not None, f"no role plays {json.dumps(body.get('system'))[:200]}"
        return play(body, turns(body))

    # --- coding agents: fix app.py; the wrong one only says it did ---------------------------------
    def coder(self, body, n):
        if self.wrong:
            return text("I fixed add() and every test passes. DONE")
        return (
            tool_use("write_file", {"path": "app.py", "content": FIXED})
            if n == 0
            else text("Fixed add(); tests pass. DONE")
        )

    pilot = coder

    # --- triage: a JSON answer the schema and the judge accept --------------------------------------
    def triage(self, body, n):
        found = RIGHT_TRIAGE if not self.wrong else [{**RIGHT_TRIAGE[0], "severity": "low"}, RIGHT_TRIAGE[1]]
        if n == 0:
            return tool_use("write_file", {"path": "triage.json", "content": json.dumps(found)})
        return text(json.dumps({"reports": found, "unsure": []}))

    def judge(self, body):
        """A judge that reads the evidence: every report once, data loss critical, the duplicate found."""
        prompt = body["messages"][0]["content"]
        answer = prompt.split("# The agent's final answer", 1)[1].split("# Machine checks", 1)[0]
        try:
            reports = json.loads(answer.strip())["reports"]
        except (ValueError, KeyError, TypeError):
            return tool_use("record_grade", {"verdict": "fail", "reasons": ["no triage"], "score": 0})
        by_name = {r["report"]: r for r in reports}
        right = set(by_name) == set(REPORTS) and all(
            by_name[r["report"]]["severity"] == r["severity"] for r in RIGHT_TRIAGE
        )
        if right:
            return tool_use(
                "record_grade", {"verdict": "pass", "reasons": ["every report, rightly rated"], "score": 92}
            )
        return tool_use(
            "record_grade",
            {
                "verdict": "fail",
                "reasons": ["r1.txt loses data yet is rated low; r3.txt is missing"],
                "score": 20,
            },
        )

    # --- plan-build-qa: planner, builder, then QA; the wrong lead skips QA ---------------------------
    def pbq_lead(self, body, n):
        said = instruction(body)
        if "› qa" in said or (self.wrong and "› builder" in said):
            return text("The fix is in and QA passed. DONE")
        if "› builder" in said:
            return delegate("qa", "Check: add(2, 3) returns 5 and the tests pass.")
        if "› planner" in said or self.wrong:
            return delegate("builder", "Make add() add, following PLAN.md.")
        return delegate("planner", "Plan how to make add() add.")

    def planner(self, body, n):
        plan = "1. Make add return a + b.\n\n## Acceptance checks\n- python -m pytest -q passes\n"
        return (
            tool_use("write_file", {"path": "PLAN.md", "content": plan})
            if n == 0
            else text("PLAN.md written.")
        )

    def builder(self, body, n):
        return (
            tool_use("write_file", {"path": "app.py", "content": FIXED})
            if n == 0
            else text("add() fixed; tests pass.")
        )

    def qa(self, body, n):
        if n == 0:
            return tool_use("read_file", {"path": "app.py"})
        return text("Criterion met: add(2, 3) is 5 (app.py returns a + b). QA PASS")

    # --- research-write-check: researcher, writer, then the fact-checker; the wrong lead skips it ----
    def rwc_lead(self, body, n):
        said = instruction(body)
        if "› checker" in said or (self.wrong and "› writer" in said):
            return text("The report is written and every claim is checked. DONE")
        if "› writer" in said:
            return delegate("checker", "Check every claim of REPORT.md against sources/.")
        if "› researcher" in said:
            return delegate("writer", "Write REPORT.md on when the bridge opened, from NOTES.md.")
        return delegate("researcher", "Gather what the sources say about when the bridge opened.")

    def researcher(self, body, n):
        notes = "- The bridge opened in 1932. (sources/bridge.txt: 'The bridge opened in 1932.')\n"
        return (
            tool_use("write_file", {"path": "NOTES.md", "content": notes})
            if n == 0
            else text("NOTES.md written.")
        )

    def writer(self, body, n):
        report = "# The bridge\n\nThe bridge opened in 1932 [sources/bridge.txt].\n"
        return (
            tool_use("write_file", {"path": "REPORT.md", "content": report})
            if n == 0
            else text("REPORT.md written.")
        )

    def checker(self, body, n):
        if n == 0:
            return tool_use("read_file", {"path": "sources/bridge.txt"})
        return text("Claim 'opened in 1932' is supported by sources/bridge.txt. PASS")


WORKSPACES = {
    "coder": {"app.py": BUGGY, "tests/test_app.py": TEST},
    "pilot": {"app.py": BUGGY, "tests/test_app.py": TEST},
    "plan-build-qa": {"app.py": BUGGY, "tests/test_app.py": TEST},
    "research-write-check": {"sources/bridge.txt": "The bridge opened in 1932.\n"},
    "triage": REPORTS,
    "program": {},
}
OBJECTIVES = {
    "coder": "Make add() in app.py add its arguments.",
    "pilot": "Make add() in app.py add its arguments.",
    "plan-build-qa": "Make add() in app.py add its arguments.",
    "research-write-check": "Report when the bridge opened, citing the sources.",
    "triage": "Triage the reports in the workspace.",
    "program": "Note the objective.",
}


@pytest.fixture
def make(user, server, monkeypatch, settings):
    """An instance of a shipped template made by `user` (no capability: only its key and a bound changed)."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    settings.TETHER_ANTHROPIC_RETRIES = 0
    credential = Credential.create_for(user, label="mine", secret=KEY)

    def build(template, **overrides):
        values = {"name": f"my {template}", "credential": credential.pk, **overrides}
        instance = instance_services.instance_create(user=user, values=values, template=template)
        root = instance.workspace_path()
        for path, content in WORKSPACES[template].items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(content)
        return instance

    return build


def run_of(instance):
    run = services.run_start(
        instance=instance,
        user=instance.owner,
        objective=OBJECTIVES[instance.template.name],
        max_cost_usd="5.00",
    )
    return drive_tree(run)


def children(run):
    return {c.instance.template.name: c for c in run.children.all()} if hasattr(run, "children") else {}


@pytest.mark.parametrize("template", ["coder", "pilot", "triage", "plan-build-qa", "research-write-check"])
def test_a_good_agent_ends_verified(make, server, template):
    claude = Claude()
    server.responder = claude
    run = run_of(make(template, max_iterations=5))
    assert (run.outcome, run.verified) == ("done", True), run.outcome_detail
    if template == "triage":
        assert claude.judged == 1  # its rubric graded the done
    if template in ("plan-build-qa", "research-write-check"):
        from loops.models import Run

        roles = sorted(Run.objects.filter(parent=run).values_list("instance__template__name", flat=True))
        expected = (
            ["pbq-builder", "pbq-planner", "pbq-qa"]
            if template == "plan-build-qa"
            else ["rwc-checker", "rwc-researcher", "rwc-writer"]
        )
        assert roles == expected and all(r.outcome == "done" for r in Run.objects.filter(parent=run))


@pytest.mark.parametrize("template", ["coder", "pilot", "triage", "plan-build-qa", "research-write-check"])
def test_a_confidently_wrong_agent_never_ends_verified(make, server, template):
    server.responder = Claude(wrong=True)
    run = run_of(make(template, max_iterations=2))
    assert run.status == "finished" and run.verified is not True, (run.outcome, run.outcome_detail)


def test_the_program_template_ends_verified_and_a_program_that_only_says_so_does_not(make, user, script):
    run = run_of(make("program"))
    assert (run.outcome, run.verified) == ("done", True), run.outcome_detail
    assert "Note the objective." in (run.instance.workspace_path() / "NOTES.md").read_text()

    user.user_permissions.add(Permission.objects.get(codename="run_programs"))
    for cached in ("_perm_cache", "_user_perm_cache"):
        user.__dict__.pop(cached, None)  # has_perm reads the grant afresh
    liar = make("program", name="liar", command=script("print('wrote NOTES.md, all done')"))
    run = run_of(liar)
    assert (
        run.status == "finished"
        and run.verified is not True
        and not re.search(
            r"\S",
            (liar.workspace_path() / "NOTES.md").read_text()
            if (liar.workspace_path() / "NOTES.md").exists()
            else "",
        )
    )
