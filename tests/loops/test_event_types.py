"""Every event kind the code writes has a payload model, and the one writer holds each payload to it."""

import ast
import re
from pathlib import Path

import pytest
from django.db import transaction

from loops import event_kinds, event_types, events
from loops.event_types import PAYLOADS, InvalidEvent
from loops.models import Event, Run

ROOT = Path(__file__).resolve().parents[2]
APPS = ["loops", "reviews", "instances", "budgets", "audit", "triggers", "web", "tether"]

# The writers of `loops.events`, and where the kind is among their arguments (None: in their items).
WRITERS = {"append": 1, "append_to_each": 0, "append_many": None, "update_and_append": None, "update_and_append_if": None}
# Functions that hand the kind they were given on to a writer, with where they take it.
PASSERS = {"_reschedule": 1}
# The writers' own calls that pass a kind through a parameter (every other call names its kind).
THROUGH = {("loops/services.py", "_reschedule")}
KIND = re.compile(r"^[a-z_]+\.[a-z_]+$")


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's `NAME = "text"` constants (a kind may be named through one)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return found


def _called(node: ast.Call) -> str:
    if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) and node.func.value.id == "events":
        return node.func.attr if node.func.attr in WRITERS else ""
    if isinstance(node.func, ast.Name) and (node.func.id in WRITERS or node.func.id in PASSERS):
        return node.func.id
    return ""


class _Scan(ast.NodeVisitor):
    """Collects the kinds a module writes, and where a writer call's kind is no literal."""

    def __init__(self, where: str, constants: dict[str, str]) -> None:
        self.where, self.constants = where, constants
        self.function = ""
        self.kinds: set[str] = set()
        self.through: set[tuple[str, str]] = set()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        name = _called(node)
        at = WRITERS.get(name, PASSERS.get(name)) if name else None
        if at is not None and len(node.args) > at:
            arg = node.args[at]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                self.kinds.add(arg.value)
            elif isinstance(arg, ast.Name) and arg.id in self.constants:
                self.kinds.add(self.constants[arg.id])
            else:
                self.through.add((self.where, self.function))
        self.generic_visit(node)

    def visit_Tuple(self, node: ast.Tuple) -> None:
        if len(node.elts) == 2:
            first, second = node.elts
            if (
                isinstance(first, ast.Constant) and isinstance(first.value, str) and KIND.match(first.value)
                and isinstance(second, ast.Dict | ast.Call | ast.Name)
            ):
                self.kinds.add(first.value)
        self.generic_visit(node)


def written_kinds() -> tuple[set[str], set[tuple[str, str]]]:
    """Every kind the code writes, and the (file, function) of each writer call whose kind is no literal.

    A kind is written by a call of a writer (`events.append(run, "kind", …)`, `append_to_each`) or
    of a function that passes its kind on (`_reschedule`), literally or through a module constant,
    or as an item `("kind", {…})` / `("kind", data)` handed to one (`as_event`, the runner's lists).
    """
    kinds: set[str] = set()
    through: set[tuple[str, str]] = set()
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text(), str(path))
            scan = _Scan(str(path.relative_to(ROOT)), _constants(tree))
            scan.visit(tree)
            kinds |= scan.kinds
            through |= scan.through
    return kinds, through


def test_every_kind_written_has_a_model_and_every_model_is_written():
    kinds, through = written_kinds()
    assert {"run.started", "run.claimed", "grade.finished", "grade.role", "protected.changed", "run.resumed",
            "workspace.rolled_back", "iteration.started"} <= kinds  # the scan finds calls, items and as_event
    assert kinds - set(PAYLOADS) == set(), "declare these kinds' payloads in loops/event_types.py"
    assert set(PAYLOADS) - kinds == set(), "models of kinds nothing writes"
    assert through == THROUGH, "a writer call passes its kind through a variable: teach this scan where it comes from"


def test_the_payload_models_and_the_timeline_registry_name_the_same_kinds():
    assert set(PAYLOADS) == set(event_kinds.KINDS)


# One payload of each kind as its writer builds it (every field a writer may put in).
SAMPLES = {
    "run.started": {
        "objective": "make the tests pass", "instance": 3, "max_iterations": 10, "max_cost_usd": "2.000000",
        "by": "ada", "via": "api", "origin": {"kind": "trigger", "trigger": 4, "delivery": "72d3"},
        "continued_from": 5, "parent": 6,
    },
    "run.claimed": {"iteration": 1, "worker": "host:12:ab", "attempt": 1},
    "iteration.started": {"iteration": 2, "instruction": "fix the failing test", "interjections": 1, "attempt": 2},
    "act.started": {"iteration": 2},
    "act.finished": {
        "iteration": 2, "ok": True, "detail": "", "response": "done",
        "tool_calls": [{"name": "write_file", "input": {"path": "a.py"}, "is_error": False, "result": "ok"}],
        "usage": {"model": "claude", "input_tokens": 120, "output_tokens": 30, "cache_write_tokens": 0,
                  "cache_read_tokens": 0, "cost_micros": 900, "calls": 1, "metered_micros": 900},
    },
    "checks.finished": {
        "iteration": 2,
        "checks": [{"name": "tests", "required": True, "passed": False, "output": "1 failed", "evidence": "report",
                    "evidence_detail": "3 of 3 tests ran", "progress": 1}],
    },
    "protected.changed": {"iteration": 2, "modified": ["tests/test_a.py"], "added": [], "deleted": [],
                          "paths": ["tests/test_a.py"]},
    "grade.finished": {
        "iteration": 2, "verified": False, "outcome": "retry", "review": False, "reasons": ["the answer is no JSON"],
        "response_check": {"passed": False, "detail": "no JSON", "misconfigured": False},
        "judge": {"verdict": "fail", "reasons": ["wrong"], "error": None, "score": 20}, "unchanged_workspace": False,
    },
    "grade.role": {"iteration": 2, "passed": True, "reason": "the reviewer's last run (run 9) passed"},
    "decision.made": {"iteration": 2, "verdict": "continue", "reason": "a test still fails"},
    "iteration.finished": {"iteration": 2, "cost_usd": "0.001200", "duration_ms": 1530, "act_ok": True},
    "run.delegating": {"iteration": 2, "calls": 2},
    "run.delegated": {"iteration": 2, "children": [7], "refused": [{"to": "x", "error": "too deep"}]},
    "run.child_started": {"child": 7, "instance": "coder"},
    "run.child_finished": {"child": 7, "instance": "coder", "outcome": "done", "verified": None, "spent_usd": "0.010000"},
    "run.child_waiting": {"child": 7, "instance": "coder", "question": "which file?"},
    "run.child_continued": {"child": 7, "as": 8, "by": "ada"},
    "interjection.queued": {"id": 4, "text": "use the other file", "by": "ada", "via": "console"},
    "run.stop_requested": {"by": "ada", "via": "console"},
    "run.waiting": {"iteration": 2, "question": "which file?"},
    "run.resumed": {"by": "ada", "via": "api", "reason": "answered"},
    "attempt.lost": {
        "iteration": 2, "attempt": 1, "worker": "host:12:ab", "began_at": "2026-01-01T00:00:00+00:00",
        "lost_at": "2026-01-01T00:01:00+00:00", "reservations": [11], "closed_usd": "0.050000",
        "changed": [{"path": "a.py", "change": "modified"}], "more": 0,
        "tool_calls": [{"name": "shell", "key": "k1", "state": "started", "is_error": False, "attempt": 1}],
    },
    "run.reaped": {"iteration": 2, "previous_worker": "host:12:ab"},
    "run.released": {"iteration": 2, "previous_worker": "host:12:ab", "reason": "its worker stopped"},
    "run.finished": {"outcome": "done", "detail": "the checks pass", "verified": True, "iterations": 2,
                     "spent_usd": "0.012000"},
    "workspace.rolled_back": {
        "to": "verified", "label": "the verified end of run 3", "by": "ada", "via": "api", "undo": "rollback-1",
        "exact": True, "added": 1, "modified": 2, "deleted": 0, "kept": ["notes.txt"], "kept_more": 0,
        "not_restored": [],
    },
    "stall.rewound": {
        "iteration": 6, "to": 3, "label": "after iteration 3", "undo": "rollback-2", "exact": True, "added": 0,
        "modified": 1, "deleted": 0, "not_restored": [],
    },
}


def test_every_model_has_a_sample():
    assert set(SAMPLES) == set(PAYLOADS)


@pytest.fixture
def run(user, make_instance):
    from loops import services

    return services.run_start(instance=make_instance(user), user=user, objective="x", via="api")


def stored(run):
    return {e.kind: e.data for e in Event.objects.filter(run=run)}


@pytest.mark.django_db
@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_a_payload_round_trips_through_its_model_and_the_writer(kind, run):
    data = SAMPLES[kind]
    model = PAYLOADS[kind]
    assert model.model_validate(data).model_dump(mode="json", by_alias=True, exclude_unset=True) == data
    with transaction.atomic():
        events.append(run.pk, kind, data)
    assert stored(run)[kind] == data  # stored as the writer built it


@pytest.mark.django_db(transaction=True)
def test_the_payloads_of_a_real_run_round_trip(user, make_instance, script, drive):
    from loops import services

    # The check fails until the agent is told which one failed: two iterations, then a verified done.
    agent = script("if 'needs-fix' in sys.stdin.read():\n    pathlib.Path('state').write_text('fixed')\n")
    check = script("print('needs-fix'); sys.exit(0 if pathlib.Path('state').exists() else 1)\n")
    instance = make_instance(user, command=agent, checks=[{"name": "state", "command": check}])
    finished = drive(services.run_start(instance=instance, user=user, objective="x", via="api"))
    assert (finished.status, finished.outcome, finished.iterations_done) == (Run.Status.FINISHED, "done", 2)
    written = list(Event.objects.filter(run=finished).order_by("seq"))
    assert {"run.started", "run.claimed", "iteration.started", "act.finished", "checks.finished", "run.finished"} <= {
        e.kind for e in written
    }
    for event in written:
        model = PAYLOADS[event.kind]
        assert model.model_validate(event.data).model_dump(mode="json", by_alias=True, exclude_unset=True) == event.data


def misspelt(kind):
    data = dict(SAMPLES[kind])
    key = next(iter(data))
    data[key + "s"] = data.pop(key)
    return data


@pytest.mark.django_db
@pytest.mark.parametrize(
    "items",
    [
        [("run.finished", {**SAMPLES["run.finished"], "verfied": True})],  # one field too many
        [("run.finished", misspelt("run.finished"))],  # a misspelt field
        [("run.claimed", {"worker": "w", "attempt": 1})],  # an iteration-level kind without its iteration
        [("decision.made", {**SAMPLES["decision.made"], "iteration": "two"})],  # a field of the wrong type
        [("act.started", {"iteration": 1}), ("run.finishd", SAMPLES["run.finished"])],  # a kind nobody declared
        [("checks.finished", {"iteration": 1, "checks": [{"name": "t", "required": True, "passed": True, "ouput": ""}]})],
    ],
    ids=["extra", "misspelt", "no-iteration", "type", "unknown-kind", "nested-extra"],
)
def test_the_writer_refuses_a_payload_its_model_does_not_declare_and_writes_nothing(items, run):
    before = Run.objects.get(pk=run.pk).last_seq
    with pytest.raises(InvalidEvent), transaction.atomic():
        events.append_many(run.pk, items)
    with pytest.raises(InvalidEvent), transaction.atomic():
        events.update_and_append(Run.objects.filter(pk=run.pk), {"next_instruction": "y"}, items)
    kind, data = items[-1]
    with pytest.raises(InvalidEvent), transaction.atomic():
        events.append_to_each(kind, {run.pk: data})
    assert Run.objects.get(pk=run.pk).last_seq == before
    assert Run.objects.get(pk=run.pk).next_instruction != "y"


@pytest.mark.django_db
def test_a_writer_with_a_misspelt_field_is_refused(run, monkeypatch):
    """A writer in the code that spells a field its own way fails at once, not in a reader months later."""
    from loops import lifecycle

    monkeypatch.setattr(lifecycle, "finished_data", lambda r: {**SAMPLES["run.finished"], "spent": "0.01"})
    with pytest.raises(InvalidEvent, match="spent"), transaction.atomic():
        lifecycle.finish_run(run.pk, None, "done", "all good")
    assert Run.objects.get(pk=run.pk).status != Run.Status.FINISHED


def test_the_refusal_names_the_kind_and_the_field():
    with pytest.raises(InvalidEvent, match=r"run\.reaped.*worker: Extra inputs are not permitted"):
        event_types.check("run.reaped", {"iteration": 1, "worker": "w"})
    with pytest.raises(InvalidEvent, match="no event kind 'run.nothing'"):
        event_types.check("run.nothing", {})


def test_docs_list_every_kind_with_its_fields():
    """docs/api.md's table of events has one row per kind naming every field its model declares."""
    text = (ROOT / "docs" / "api.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z_]+\.[a-z_]+)` \|.*$", text, re.MULTILINE)}
    assert set(rows) == set(PAYLOADS)
    for kind, model in PAYLOADS.items():
        for name, field in model.model_fields.items():
            assert f"`{field.alias or name}`" in rows[kind], f"docs/api.md: {kind} does not name {field.alias or name}"
