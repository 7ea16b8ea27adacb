"""An import inside a function says why it is not at the top of its module (`# lazy: <reason>`).

Module level is the rule; a function-level import is kept only for a real cycle or a real
laziness (an SDK only some agents load, the app registry before `ready()`), and says which.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTANCES = ["models", "schemas", "validation", "capabilities", "templates_loader", "credentials", "apps", "prices",
             "services"]
COVERED = [
    *(ROOT / "instances" / f"{name}.py" for name in INSTANCES),
    *(p for p in (ROOT / "tether").glob("*.py") if p.name != "tracing.py"),
    *(ROOT / "audit").glob("*.py"),
]


def untagged(path: Path, root: Path = ROOT) -> list[str]:
    """Each function-level import of `path` whose lines carry no `# lazy:` comment."""
    lines = path.read_text().splitlines()
    found = []
    for function in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import | ast.ImportFrom):
                said = lines[node.lineno - 1 : (node.end_lineno or node.lineno)]
                if not any("# lazy: " in line for line in said):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_every_function_level_import_says_why_it_is_lazy():
    assert len(COVERED) > 20
    assert [line for path in COVERED for line in untagged(path)] == []


def test_the_scan_sees_an_untagged_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    import json  # lazy: a reason\n    import os\n    return json, os\n")
    assert untagged(sample, tmp_path) == ["sample.py:3: import os"]
