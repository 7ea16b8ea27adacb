"""One owner per fact: a source scan fails when a copy of something owned elsewhere comes back.

Each test names the owner; the app code (migrations aside) must reach the fact through it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = ("tether", "audit", "budgets", "instances", "loops", "reviews", "triggers", "web")


def app_sources(suffix: str = ".py"):
    for app in APPS:
        for path in sorted((ROOT / app).rglob(f"*{suffix}")):
            if "migrations" not in path.parts and "__pycache__" not in path.parts:
                yield path


def where(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_htmx_requests_are_recognised_by_django_htmx_only():
    """`request.htmx` (django_htmx's middleware) says whether htmx sent a request: no view reads the header."""
    from django.conf import settings

    assert "django_htmx.middleware.HtmxMiddleware" in settings.MIDDLEWARE
    copies = [where(path) for path in app_sources() if "HX-Request" in path.read_text()]
    assert not copies, "read request.htmx instead of the HX-Request header:\n" + "\n".join(copies)


# --- settings: declared once, in tether/settings.py -------------------------------------------------


def _is_settings(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.endswith("settings")


def call_site_defaults(source: str) -> list[tuple[int, str]]:
    """Return (line, what) of each `getattr(settings, NAME, default)` whose NAME is a TETHER_ setting or
    is computed (a helper taking the name and its default hides a call-site default too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"):
            continue
        if len(node.args) != 3 or not _is_settings(node.args[0]):
            continue
        name = node.args[1]
        if not isinstance(name, ast.Constant):
            found.append((node.lineno, f"getattr(settings, {ast.unparse(name)}, ...)"))
        elif str(name.value).startswith("TETHER_"):
            found.append((node.lineno, f"getattr(settings, {name.value!r}, {ast.unparse(node.args[2])})"))
    return found


def declared_settings() -> set[str]:
    tree = ast.parse((ROOT / "tether" / "settings.py").read_text())
    names = set()
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_the_scan_finds_a_call_site_default():
    assert call_site_defaults('x = getattr(settings, "TETHER_X", 3)\n') == [
        (1, "getattr(settings, 'TETHER_X', 3)")
    ]
    assert call_site_defaults("x = getattr(django_settings, name, 3)\n") == [
        (1, "getattr(settings, name, ...)")
    ]
    assert call_site_defaults('x = getattr(settings, "SECRET_KEY_FALLBACKS", [])\n') == []
    assert call_site_defaults("x = settings.TETHER_X\n") == []


def test_no_call_site_gives_a_tether_setting_a_default():
    found = [
        f"{where(path)}:{line}: {what}"
        for path in app_sources()
        for line, what in call_site_defaults(path.read_text())
    ]
    assert not found, "declare the default in tether/settings.py and read settings.TETHER_X:\n" + "\n".join(
        found
    )


def test_every_tether_setting_the_apps_read_is_declared_in_the_settings_module():
    declared = declared_settings()
    read = {
        (where(path), node.attr)
        for path in app_sources()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr.startswith("TETHER_") and _is_settings(node.value)
    }
    missing = sorted(f"{file}: settings.{name}" for file, name in read if name not in declared)
    assert not missing, "declare these in tether/settings.py, with their default and meaning:\n" + "\n".join(
        missing
    )


# --- the ways a run can end: loops/outcomes.py ---------------------------------------------------------


def outcome_lists(source: str, names: set[str]) -> list[tuple[int, str]]:
    """Return (line, text) of each list, tuple, set or dict literal naming three or more outcomes, as text
    or as `…Outcome.X` (two are a comparison's business: a decider's verdicts share `done` and `failed`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [key for key in node.keys if key is not None]
        else:
            continue
        named = [
            item
            for item in items
            if (isinstance(item, ast.Constant) and item.value in names)
            or (
                isinstance(item, ast.Attribute)
                and isinstance(item.value, ast.Attribute)
                and item.value.attr == "Outcome"
            )
        ]
        if len(named) >= 3:
            found.append((node.lineno, ast.unparse(node)[:100]))
    return found


def test_the_scan_finds_a_list_of_outcomes():
    names = {"done", "failed", "cancelled"}
    assert outcome_lists('X = ("done", "failed", "cancelled")\n', names)
    assert outcome_lists(
        "X = {Run.Outcome.DONE: 1, Run.Outcome.FAILED: 2, Run.Outcome.CANCELLED: 3}\n", names
    )
    assert not outcome_lists('X = ("continue", "done", "escalate", "failed")\n', names)


def test_outcomes_are_listed_only_in_the_outcomes_module():
    from loops.outcomes import Outcome

    names = {o.value for o in Outcome}
    found = [
        f"{where(path)}:{line}: {text}"
        for path in app_sources()
        if path != ROOT / "loops" / "outcomes.py"
        for line, text in outcome_lists(path.read_text(), names)
    ]
    assert not found, "name these through loops/outcomes.py (add a set there):\n" + "\n".join(found)


def test_every_outcome_is_a_runs_outcome_with_a_label():
    from loops import event_kinds, outcomes, policy
    from loops.continuation import CONTINUABLE
    from loops.models import Run

    assert list(Run.Outcome.values) == [o.value for o in outcomes.Outcome]
    assert set(outcomes.LABELS) == set(outcomes.Outcome)
    assert event_kinds.OUTCOME_LABELS is outcomes.LABELS
    assert policy.OUTCOMES is outcomes.DECIDED and CONTINUABLE is outcomes.CONTINUABLE


# --- small shared shapes ---------------------------------------------------------------------------------


def test_what_no_column_stores_is_defined_once_in_the_schema_module():
    copies = [
        where(path)
        for path in app_sources()
        if path != ROOT / "tether" / "schema.py" and "\\ud800-\\udfff" in path.read_text()
    ]
    assert not copies, "use tether.schema.UNSTORABLE:\n" + "\n".join(copies)


def test_every_services_refusal_has_the_one_shape():
    from instances.services import InstanceRefused
    from loops.services import Refused
    from tether.refusals import Refused as Base
    from triggers.services import TriggerRefused

    for refusal in (Refused, InstanceRefused, TriggerRefused):
        assert issubclass(refusal, Base) and "__init__" not in vars(refusal), refusal
        refused = refusal("no", 409, "name")
        assert (refused.message, refused.status, refused.field, str(refused)) == ("no", 409, "name", "no")
    assert Refused("no").status == 400 and Refused("no").field is None
