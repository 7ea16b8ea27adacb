"""`make test` keeps its data apart from `make run` in the same checkout.

The Makefile is driven for real; only the programs it starts are stand-ins (a venv whose
python, ruff, mypy and lint-imports print the TETHER_HOME they were given), so nothing is installed or run.
"""

import os
import stat
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

REPORTER = '#!/bin/sh\necho "$(basename "$0") TETHER_HOME=$TETHER_HOME"\n'


@pytest.fixture
def fake_venv(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for name in ("python", "ruff", "mypy", "lint-imports"):
        program = venv / "bin" / name
        program.write_text(REPORTER)
        program.chmod(program.stat().st_mode | stat.S_IEXEC)
    (venv / ".installed").touch()  # newer than what it depends on: nothing to install
    return venv


def homes(target, venv, **env):
    """Run `make TARGET` with the stand-in venv; return {program: TETHER_HOME it saw}."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TETHER_HOME", "TETHER_TEST_HOME", "MAKEFLAGS")}
    environ.update(env)
    done = subprocess.run(
        ["make", "--no-print-directory", target, f"VENV={venv}"],
        cwd=settings.BASE_DIR,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = {}
    for line in done.stdout.splitlines():
        name, _, value = line.partition(" TETHER_HOME=")
        if value:
            seen.setdefault(name.rsplit("/", 1)[-1], set()).add(value)
    return seen


def test_make_test_gets_a_home_of_its_own(fake_venv):
    run = homes("run", fake_venv)
    test = homes("test", fake_venv)
    root = Path(settings.BASE_DIR)
    assert run["python"] == {str(root / "var")}
    assert test["python"] == {str(root / "var" / "test")}
    assert test["ruff"] == test["mypy"] == test["lint-imports"] == test["python"]  # lint too (mypy's Django plugin loads settings)


def test_an_exported_home_still_keeps_the_suite_apart(fake_venv, tmp_path):
    # CI exports TETHER_HOME=$PWD/var/ci for `make test` and `make chaos-ci` alike.
    home = tmp_path / "ci"
    assert homes("run", fake_venv, TETHER_HOME=str(home))["python"] == {str(home)}
    assert homes("test", fake_venv, TETHER_HOME=str(home))["python"] == {str(home / "test")}
    chosen = tmp_path / "suite"
    assert homes("test", fake_venv, TETHER_TEST_HOME=str(chosen))["python"] == {str(chosen)}
