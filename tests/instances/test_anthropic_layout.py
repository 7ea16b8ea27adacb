"""Where the Claude brain's code may live: the SDK behind one module, and no import hidden in a function.

`instances/brains/anthropic/session.py` is the only module of Tether's apps that imports the
`anthropic` SDK (the act, the decider, the judge and the key check all go through its `Session`
or `check_key`). An import inside a function of the brains or the tools says why it is there
(`# lazy: <reason>`): a cycle, or a heavy SDK only some acts need.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = ("tether", "audit", "budgets", "instances", "loops", "reviews", "triggers", "web")


def imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def sources(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts)


def test_only_the_session_module_imports_the_anthropic_sdk():
    importers = {
        str(path.relative_to(ROOT))
        for path in sources(*APPS)
        for node in ast.walk(ast.parse(path.read_text()))
        if any(name == "anthropic" or name.startswith("anthropic.") for name in imported(node))
    }
    assert importers == {"instances/brains/anthropic/session.py"}


def test_every_import_inside_a_function_of_the_brains_and_tools_says_why():
    unexplained = []
    for path in sources("instances/brains", "instances/tools"):
        text = path.read_text()
        lines = text.splitlines()
        for function in ast.walk(ast.parse(text)):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom) and "# lazy: " not in lines[node.lineno - 1]:
                    unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert unexplained == []
