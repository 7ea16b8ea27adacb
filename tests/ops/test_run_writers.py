"""Run has the writers its docstring names: every module that writes a run's row, and no other."""

import ast
import re
from pathlib import Path

from loops.models import Run

ROOT = Path(__file__).resolve().parents[2]
APPS = ("audit", "budgets", "instances", "loops", "reviews", "tether", "triggers", "web")
WRITES = {"update", "create", "bulk_create", "bulk_update", "delete", "get_or_create", "update_or_create"}


def _root_name(node):
    while isinstance(node, ast.Call | ast.Attribute | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def writes_runs(source):
    """Whether `source` writes runs: a write on a `Run.objects` queryset, or raw SQL updating Run's table."""
    tree = ast.parse(source)
    querysets = set()  # names bound to a `Run.objects…` queryset (`mine = Run.objects.filter(...)`)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _root_name(node.value) == "Run" and "objects" in ast.unparse(node.value):
            querysets.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES:
            receiver = node.func.value
            if _root_name(receiver) == "Run" and "objects" in ast.unparse(receiver):
                return True
            if isinstance(receiver, ast.Name) and receiver.id in querysets:
                return True
    return bool(re.search(r"UPDATE \{Run\._meta\.db_table\}", source))


def written_by():
    found = set()
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts or "tests" in path.parts:
                continue
            if writes_runs(path.read_text()):
                found.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


def named_writers():
    return set(re.findall(r"`((?:" + "|".join(APPS) + r")\.\w+)`", Run.__doc__ or ""))


def test_the_run_docstring_names_exactly_the_modules_that_write_runs():
    assert named_writers() == written_by()


def test_the_scan_sees_each_way_a_module_writes_runs():
    assert writes_runs("Run.objects.filter(pk=1).update(status='x')")
    assert writes_runs("Run.objects.create(objective='o')")
    assert writes_runs("mine = Run.objects.filter(pk=1)\nmine.update(attempt=0)")
    assert writes_runs('SQL = f"UPDATE {Run._meta.db_table} SET last_seq = 1"')
    assert not writes_runs("Run.objects.filter(pk=1).first()")
    assert not writes_runs("Interjection.objects.filter(run=run).update(consumed_in_iteration=1)")
