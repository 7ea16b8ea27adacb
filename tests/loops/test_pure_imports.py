"""The loop's pure modules stay pure: no Django, no I/O, no clock."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = ["loops.policy", "loops.decision", "loops.memory", "loops.progress", "loops.outcomes"]
# What the pure modules may import: computation only.
ALLOWED = {
    "__future__",
    "collections",
    "collections.abc",
    "dataclasses",
    "enum",
    "hashlib",
    "json",
    "re",
    "typing",
    "unicodedata",
    "loops.decision",
    "loops.memory",
    "loops.outcomes",
    "loops.policy",
    "loops.progress",
    "tether.storable",  # pure: text the records can hold (no NUL)
}
FORBIDDEN_AT_RUNTIME = ("django", "datetime", "socket", "subprocess", "sqlite3", "random")

PROBE = """
import json, sys
before = set(sys.modules)
import loops.policy, loops.decision, loops.memory, loops.progress
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_importing_pure_modules_pulls_in_no_django():
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded = json.loads(result.stdout)
    assert "loops.policy" in loaded and "loops.decision" in loaded
    offenders = [m for m in loaded if m.split(".")[0] in FORBIDDEN_AT_RUNTIME]
    assert offenders == []
    assert [m for m in loaded if m.startswith("loops.")] == sorted(PURE)


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_only_computation(module):
    source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert imported <= ALLOWED, f"{module} imports {sorted(imported - ALLOWED)}"
