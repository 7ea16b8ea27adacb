"""The shipped example and the console-less CLI."""

import io
import subprocess
import sys

import pytest
from django.conf import settings
from django.core.management import call_command

from instances.models import Instance
from loops.models import Run
from tests.support.cluster import Cluster, worker_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_superuser("admin", email="")


def test_example_instances_end_as_the_readme_promises(admin, start, drive, tmp_path, settings):
    settings.TETHER_WORKSPACES = tmp_path / "ws"
    call_command("example", stdout=io.StringIO())
    fixable = drive(start(Instance.objects.get(name="lint-fixable"), objective="make lint and tests pass"))
    assert (fixable.outcome, fixable.verified) == ("done", True)
    mixed = drive(start(Instance.objects.get(name="lint-mixed"), objective="make lint and tests pass"))
    assert mixed.outcome == "no_progress"
    first = mixed.iterations.get(number=1)
    assert "F821" in first.checks[0]["output"]  # backpressure: the unfixable errors are fed back
    assert "F821" in mixed.iterations.get(number=2).instruction


def test_cli_start_watch_and_cancel(admin, make_instance, script, tmp_path):
    agent = script("p = pathlib.Path('n'); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n)); print(n)\n")
    check = script("n = int(pathlib.Path('n').read_text()); print('n', n); sys.exit(0 if n >= 2 else 1)\n")
    inst = make_instance(admin, command=agent, checks=[{"name": "two", "command": check}])
    objective = tmp_path / "objective.txt"
    objective.write_text("count to two")
    cluster = Cluster("cli", tmp_path)
    try:
        done = subprocess.run(
            [sys.executable, "manage.py", "loop", "start", "--instance", str(inst.pk), "--objective-file", str(objective), "--watch"],
            cwd=settings.BASE_DIR,
            env=worker_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        cluster.stop()
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:], cluster.tail())
    assert "checks.finished" in done.stdout and "run.finished" in done.stdout
    assert "done (verified)" in done.stdout
    run = Run.objects.get()
    assert run.outcome == "done"
    # Cancel on a finished run is refused with a message, and changes nothing.
    refused = subprocess.run(
        [sys.executable, "manage.py", "loop", "cancel", str(run.pk)],
        cwd=settings.BASE_DIR, env=worker_env(), capture_output=True, text=True, timeout=120,
    )
    assert refused.returncode != 0 and "already finished" in refused.stderr
    run.refresh_from_db()
    assert run.outcome == "done"


def test_cli_refuses_bad_input(admin, make_instance, tmp_path):
    from django.core.management.base import CommandError

    inst = make_instance(admin, objective_max_chars=10)
    long = tmp_path / "long.txt"
    long.write_text("x" * 50)
    with pytest.raises(CommandError, match="50 characters.*at most 10"):
        call_command("loop", "start", "--instance", str(inst.pk), "--objective-file", str(long))
    with pytest.raises(CommandError, match="cannot read the objective file"):
        call_command("loop", "start", "--instance", str(inst.pk), "--objective-file", str(tmp_path / "missing"))
    with pytest.raises(CommandError, match="no instance 999"):
        call_command("loop", "start", "--instance", "999", "--objective-file", str(long))
    assert Run.objects.count() == 0
