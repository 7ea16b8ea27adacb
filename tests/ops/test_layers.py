"""The app layers (docs/architecture.md, "Layers"): `lint-imports` keeps them and breaks on an import up them."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each case runs lint-imports over a copy of the code (seconds)

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("tether", "audit", "budgets", "instances", "loops", "reviews", "triggers", "web")


def lint_imports(where: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=where, capture_output=True, text=True, timeout=600, check=False
    )


def test_the_apps_keep_their_layers():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 2 kept, 0 broken." in done.stdout


# One import each of the cycles the layers removed, and one of the engine reaching a surface.
PLANTED = [
    (
        "budgets/metering.py",
        "from instances.brains.base import Usage",
        "budgets is not allowed to import instances",
    ),
    ("budgets/apps.py", "from loops.models import Run", "budgets is not allowed to import loops"),
    ("tether/jsonlog.py", "from instances import credentials", "tether is not allowed to import instances"),
    ("instances/services.py", "from reviews import selectors", "instances is not allowed to import reviews"),
    ("instances/services.py", "from loops.models import Run", "instances is not allowed to import loops"),
    ("loops/services.py", "from reviews import selectors", "loops is not allowed to import reviews"),
    ("audit/trail.py", "from budgets.models import Pool", "audit is not allowed to import budgets"),
    ("reviews/rollback.py", "from triggers import services", "reviews is not allowed to import triggers"),
    ("loops/services.py", "from triggers import services", "loops is not allowed to import triggers"),
    ("loops/runner.py", "from web import api", "loops is not allowed to import web"),
]


@pytest.mark.parametrize(("module", "planted", "broken"), PLANTED, ids=[p[0] + ": " + p[1] for p in PLANTED])
def test_an_import_up_the_layers_breaks_the_contract(tmp_path, module, planted, broken):
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{planted}\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout
    assert broken in done.stdout, done.stdout
