"""One owner for every input limit: `tether.limits` states each bound, and every surface keeps it.

For each limit, read from `tether.limits`, the REST API, MCP for people (`start_run`,
`continue_run`, `interject`) and the console's forms (start, continue, interject, resume) accept
the limit and refuse one step past it with a 4xx, never a 5xx. And the source tree states each
bound once: its literal appears nowhere else in the app code (migrations and tests aside).
"""

import io
import json
import re
import tokenize
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest
from django.test import Client as DjangoClient
from mcp import Client

from loops import services
from loops.models import Interjection, Run
from tether import limits
from web.auth import make_token
from web.console.forms import ResumeRunForm
from web.mcp_server import build_server, stdio_caller

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
APPS = ("web", "triggers", "loops", "instances", "budgets", "reviews", "audit", "tether")
CENT = Decimal("0.01")

# (field, the limit, one step past it): every run-starting surface must accept the first and refuse the second.
START_LIMITS = [
    ("max_iterations", limits.MAX_ITERATIONS, limits.MAX_ITERATIONS + 1),
    ("max_iterations", 1, 0),
    ("max_minutes", limits.MAX_MINUTES, limits.MAX_MINUTES + 1),
    ("max_minutes", 1, 0),
    ("max_cost_usd", str(limits.CAP_MAX_USD), str(limits.CAP_MAX_USD + CENT)),
    ("max_cost_usd", limits.CAP_MIN_USD, str(Decimal(limits.CAP_MIN_USD) - Decimal("0.001"))),
    ("objective", "o" * limits.OBJECTIVE_MAX_CHARS, "o" * (limits.OBJECTIVE_MAX_CHARS + 1)),
]
CONTINUE_LIMITS = [row for row in START_LIMITS if row[0] in ("max_iterations", "max_cost_usd")] + [
    ("message", "m" * limits.MESSAGE_MAX_CHARS, "m" * (limits.MESSAGE_MAX_CHARS + 1)),
]


@pytest.fixture
def instance(user, make_instance):
    # The highest objective cap an instance may have: the bound under test is the schema's, not the instance's.
    return make_instance(user, name="limits", objective_max_chars=limits.OBJECTIVE_MAX_CHARS)


@pytest.fixture
def console(user):
    client = DjangoClient()
    client.force_login(user)
    return client


def rest(user, path, body):
    answer = DjangoClient().post(
        f"/v1{path}", data=json.dumps(body), content_type="application/json",
        headers={"Authorization": f"Bearer {make_token(user)}"},
    )
    return answer.status_code, answer.json()


def mcp(user, tool, arguments):
    async def go():
        async with Client(build_server(stdio_caller(user.pk))) as client:
            result = await client.call_tool(tool, arguments)
            return result.is_error, result.content[0].text if result.content else ""

    return anyio.run(go)


def start_body(field, value):
    return {"objective": "o", field: value} if field != "objective" else {"objective": value}


def finished(user, instance):
    return services.run_cancel(run=services.run_start(instance=instance, user=user, objective="o"), user=user)


@pytest.mark.parametrize(("field", "limit", "past"), START_LIMITS, ids=lambda v: repr(v)[:16])
def test_every_start_surface_accepts_the_limit_and_refuses_past_it(user, instance, console, field, limit, past):
    status, answer = rest(user, f"/instances/{instance.pk}/loop", start_body(field, past))
    assert status == 400 and answer["field"] == field, answer
    refused, said = mcp(user, "start_run", {"instance": instance.pk, **start_body(field, past)})
    assert refused and said == answer["error"]
    page = console.post(f"/instances/{instance.pk}/start", {"max_iterations": 3, **start_body(field, past)})
    assert page.status_code == 400 and 'role="alert"' in page.content.decode()
    assert not Run.objects.exists()

    status, answer = rest(user, f"/instances/{instance.pk}/loop", start_body(field, limit))
    assert status == 201, answer
    refused, said = mcp(user, "start_run", {"instance": instance.pk, **start_body(field, limit)})
    assert not refused, said
    form = {"max_iterations": 3, **start_body(field, limit)}
    form["objective"] = form["objective"].replace("o", "p")  # not a repeat of the runs just started
    page = console.post(f"/instances/{instance.pk}/start", form)
    assert page.status_code == 302, page.content.decode()[-2000:]
    assert Run.objects.count() == 3


@pytest.mark.parametrize(("field", "limit", "past"), CONTINUE_LIMITS, ids=lambda v: repr(v)[:16])
def test_every_continue_surface_accepts_the_limit_and_refuses_past_it(user, instance, console, field, limit, past):
    old = finished(user, instance)
    status, answer = rest(user, f"/instances/{instance.pk}/loop/{old.pk}/continue", {field: past})
    assert status == 400 and answer["field"] == field, answer
    refused, said = mcp(user, "continue_run", {"run_id": old.pk, field: past})
    assert refused and said == answer["error"]
    page = console.post(f"/runs/{old.pk}/continue", {"max_iterations": 3, field: past})
    assert page.status_code == 400 and 'role="alert"' in page.content.decode()
    assert Run.objects.count() == 1

    for continue_by in ("rest", "mcp", "console"):
        old = finished(user, instance)
        if continue_by == "rest":
            status, answer = rest(user, f"/instances/{instance.pk}/loop/{old.pk}/continue", {field: limit})
            assert status == 201, answer
        elif continue_by == "mcp":
            refused, said = mcp(user, "continue_run", {"run_id": old.pk, field: limit})
            assert not refused, said
        else:
            page = console.post(f"/runs/{old.pk}/continue", {"max_iterations": 3, field: limit})
            assert page.status_code == 302, page.content.decode()[-2000:]
        assert Run.objects.filter(continued_from=old).exists(), continue_by


def test_every_interject_surface_accepts_the_longest_message_and_refuses_a_longer_one(user, instance, console):
    run = services.run_start(instance=instance, user=user, objective="o")
    longest = limits.MESSAGE_MAX_CHARS
    status, answer = rest(user, f"/instances/{instance.pk}/loop/{run.pk}/interject", {"message": "a" * (longest + 1)})
    assert status == 400 and answer["field"] == "message", answer
    refused, said = mcp(user, "interject", {"run_id": run.pk, "message": "a" * (longest + 1)})
    assert refused and said == answer["error"]
    page = console.post(f"/runs/{run.pk}/interject", {"text": "a" * (longest + 1)})
    assert page.status_code == 400 and f"at most {longest:,} are accepted" in page.content.decode()
    assert not Interjection.objects.exists()

    status, answer = rest(user, f"/instances/{instance.pk}/loop/{run.pk}/interject", {"message": "b" * longest})
    assert status == 202, answer
    refused, said = mcp(user, "interject", {"run_id": run.pk, "message": "c" * longest})
    assert not refused, said
    page = console.post(f"/runs/{run.pk}/interject", {"text": "d" * longest})
    assert page.status_code < 400
    assert Interjection.objects.count() == 3


@pytest.mark.parametrize(
    ("cap", "accepted"),
    [
        (str(limits.CAP_MAX_USD), True), (str(limits.CAP_MAX_USD + CENT), False),
        (limits.CAP_MIN_USD, True), (str(Decimal(limits.CAP_MIN_USD) - Decimal("0.001")), False),
    ],
)
def test_the_resume_form_keeps_the_cap_bounds(user, instance, cap, accepted):
    run = services.run_start(instance=instance, user=user, objective="o")
    offer = SimpleNamespace(suggested=None, cap=None, refusal=lambda micros: None)  # any cap the pools allow
    form = ResumeRunForm({"max_cost_usd": cap}, run=run, offer=offer)
    assert form.is_valid() is accepted, form.errors


def test_the_console_words_a_bound_for_a_person(user, instance, console):
    page = console.post(
        f"/instances/{instance.pk}/start", {"objective": "o", "max_iterations": limits.MAX_ITERATIONS + 1}
    )
    assert f"Max iterations can be at most {limits.MAX_ITERATIONS:,}." in page.content.decode()


# --- one statement of each bound ----------------------------------------------------------------

# The literal of a bound, and the files where the same number means something else (with why).
LITERALS = {
    limits.MAX_ITERATIONS: {
        "reviews/sampling.py": "a percentage with two decimals, as an integer",
        "instances/tools/workspace.py": "the characters of a line a search reads",
    },
    limits.MAX_MINUTES: {},
    limits.MESSAGE_MAX_CHARS: {
        "loops/decision.py": "the longest instruction a decider may write",
        "reviews/services.py": "how much of a review's detail is kept",
        "instances/models.py": "an instance's default objective cap (its migration states it)",
    },
}
ARITHMETIC = {limits.MAX_MINUTES: "366 * 24 * 60"}


def numbers(path: Path) -> list[tuple[int, int]]:
    """Return (value, line) of every integer literal in the Python file at `path`."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type == tokenize.NUMBER and re.fullmatch(r"[0-9_]+", token.string):
            found.append((int(token.string.replace("_", "")), token.start[0]))
    return found


def app_sources():
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" not in path.parts and path != ROOT / "tether" / "limits.py":
                yield path


def test_each_bound_is_written_once_in_the_limits_module():
    stray = []
    for path in app_sources():
        where = str(path.relative_to(ROOT))
        for value, line in numbers(path):
            if value in LITERALS and where not in LITERALS[value]:
                stray.append(f"{where}:{line}: {value}")
        text = path.read_text()
        stray += [f"{where}: {expr}" for expr in ARITHMETIC.values() if expr in text]
    assert not stray, "a bound restated outside tether/limits.py (import it from there):\n" + "\n".join(stray)


def test_the_limits_module_is_a_leaf():
    source = (ROOT / "tether" / "limits.py").read_text()
    imports = [line for line in source.splitlines() if re.match(r"\s*(from|import)\s", line)]
    assert imports == ["from __future__ import annotations"], imports
