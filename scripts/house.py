"""The house's figures (issue #28): how the app code is laid out, measured the same way every time.

Run: python scripts/house.py   (or `make house`)

App code is every `.py` file of the apps, migrations aside (tests and benchmarks are not app code).
Prints modules over 700 lines, functions over 80 lines, functions over complexity 20 (ruff's
mccabe), function-level imports, the import contract (lint-imports) and the README's length.
Duplicate pairs come from the `duplicates` command where it is installed.
`tests/ops/test_house.py` holds the tree to these bounds.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ["tether", "audit", "budgets", "instances", "loops", "reviews", "triggers", "web"]
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80
MAX_COMPLEXITY = 20


def app_files(root: Path = ROOT) -> list[Path]:
    """Every app module, migrations aside."""
    return sorted(p for app in APPS for p in (root / app).rglob("*.py") if "migrations" not in p.parts)


def functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def function_imports(path: Path, root: Path = ROOT) -> list[str]:
    """Each function-level import of `path` (once per line, however deep the functions nest)."""
    lines = path.read_text().splitlines()
    found = set()
    for function in functions(path):
        found |= {n.lineno for n in ast.walk(function) if isinstance(n, ast.Import | ast.ImportFrom)}
    return [f"{path.relative_to(root)}:{n}: {lines[n - 1].strip()}" for n in sorted(found)]


def long_functions(path: Path, root: Path = ROOT, bound: int = MAX_FUNCTION_LINES) -> list[str]:
    """Each function of `path` longer than `bound` lines, with its length."""
    return [
        f"{path.relative_to(root)}:{f.lineno} {f.name} ({length} lines)"
        for f in functions(path)
        if (length := (f.end_lineno or f.lineno) - f.lineno + 1) > bound
    ]


def long_modules(files: list[Path], root: Path = ROOT, bound: int = MAX_MODULE_LINES) -> list[str]:
    sized = ((p, len(p.read_text().splitlines())) for p in files)
    return [f"{p.relative_to(root)} ({n} lines)" for p, n in sized if n > bound]


def complex_functions(files: list[Path], bound: int = MAX_COMPLEXITY) -> list[str]:
    """Each function over mccabe complexity `bound`, as ruff reports it."""
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run(
        [str(ruff), "check", "--isolated", "--select", "C901", "--config", f"lint.mccabe.max-complexity={bound}",
         "--output-format", "concise", *map(str, files)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    return [line for line in done.stdout.splitlines() if "C901" in line]


def duplicates(files: list[Path]) -> str:
    """The `duplicates` command's first line over a copy of the app code, or why there is none."""
    if not shutil.which("duplicates"):
        return "n/a (the `duplicates` command is not installed)"
    with tempfile.TemporaryDirectory() as copy:
        for path in files:
            target = Path(copy) / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
        done = subprocess.run(["duplicates", "--repo", copy, "--seconds", "120"], capture_output=True, text=True,
                              check=False)
    return done.stdout.splitlines()[0] if done.stdout else done.stderr.strip()


def main() -> None:
    files = app_files()
    contract = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=ROOT,
                              capture_output=True, text=True, check=False)
    rows = [
        ("app code", f"{len(files)} modules, {sum(len(p.read_text().splitlines()) for p in files):,} lines"),
        ("import contract (lint-imports)", "kept" if contract.returncode == 0 else "BROKEN"),
        ("function-level imports", len([i for p in files for i in function_imports(p)])),
        (f"modules over {MAX_MODULE_LINES} lines", long_modules(files)),
        (f"functions over {MAX_FUNCTION_LINES} lines", [f for p in files for f in long_functions(p)]),
        (f"functions over complexity {MAX_COMPLEXITY}", complex_functions(files)),
        ("README lines", len((ROOT / "README.md").read_text().splitlines())),
        ("duplicate pairs", duplicates(files)),
    ]
    for label, value in rows:
        if isinstance(value, list):
            print(f"{label:36} {len(value)}")
            for item in value:
                print(f"{'':38}{item}")
        else:
            print(f"{label:36} {value}")


if __name__ == "__main__":
    main()
