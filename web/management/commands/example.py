"""`python manage.py example` — create the example instances (no API key needed).

A real tool is the actor: `ruff check --fix --unsafe-fixes` edits a small workspace
with lint errors; `ruff check .` and the workspace's unit tests are the checks.
- `lint-fixable`: every error is fixable: the run ends `done (verified)`.
- `lint-mixed`: two errors are not: the run shows backpressure, then the
  no-progress guard stops it (`no_progress`).
- `ask-first`: a shell script that asks a person a question before it acts (the
  command-brain protocol's `TETHER_ESCALATE:` line): the run waits (`waiting`) until
  someone answers, then writes the answer and ends `done (verified)`.
"""

import shutil

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from instances.models import Instance

SOURCE = settings.BASE_DIR / "examples" / "lintme"
CHECKS = [
    {"name": "ruff", "command": ["ruff", "check", "--no-cache", "."], "required": True},
    {"name": "tests", "command": ["python", "-m", "unittest", "-q"], "required": True},
]
# The asking agent is a script in its own workspace, run by the system's sh inside the sandbox.
ASK_SOURCE = settings.BASE_DIR / "examples" / "ask"
ASK = {
    "brain": Instance.Brain.COMMAND,
    "command": ["sh", "agent.sh"],
    "checks": [{"name": "greeting", "command": ["test", "-s", "greeting.txt"], "required": True}],
    "decider": Instance.Decider.CHECKS,
    "max_iterations": 3,
}


class Command(BaseCommand):
    help = "Create (or reset) the example instances lint-fixable, lint-mixed and ask-first; print how to run them."

    def add_arguments(self, parser):
        parser.add_argument("--owner", help="username that owns them (default: the first superuser)")

    def handle(self, owner, **options):
        User = get_user_model()
        user = (
            User.objects.filter(username=owner).first()
            if owner
            else User.objects.filter(is_superuser=True).order_by("id").first()
        )
        if user is None:
            raise CommandError("no such user; start Tether once with `make run` (it creates 'admin') or pass --owner")
        made = {}
        for name, skip in [("lint-fixable", {"report.py"}), ("lint-mixed", set())]:
            workspace = settings.TETHER_WORKSPACES / f"example-{name}"
            if workspace.exists():
                shutil.rmtree(workspace)
            shutil.copytree(SOURCE, workspace, ignore=lambda d, names, skip=skip: [n for n in names if n in skip])
            instance, _ = Instance.objects.update_or_create(
                owner=user,
                name=name,
                defaults={
                    "brain": Instance.Brain.COMMAND,
                    "command": ["ruff", "check", "--no-cache", "--fix", "--unsafe-fixes", "--exit-zero", "."],
                    "workspace": str(workspace),
                    "checks": CHECKS,
                    "decider": Instance.Decider.CHECKS,
                    "max_iterations": 5,
                },
            )
            made[name] = instance
        workspace = settings.TETHER_WORKSPACES / "example-ask-first"
        if workspace.exists():
            shutil.rmtree(workspace)
        shutil.copytree(ASK_SOURCE, workspace)
        made["ask-first"], _ = Instance.objects.update_or_create(
            owner=user, name="ask-first", defaults={**ASK, "workspace": str(workspace)}
        )
        objective = settings.BASE_DIR / "examples" / "objective.txt"
        for name, instance in made.items():
            self.stdout.write(f"instance {instance.pk}: {name} (workspace {instance.workspace})")
        self.stdout.write("\nRun them with:")
        for name, instance in made.items():
            goal = settings.BASE_DIR / "examples" / "objective-ask.txt" if name == "ask-first" else objective
            self.stdout.write(f"    python manage.py loop start --instance {instance.pk} --objective-file {goal} --watch")
        asking = made["ask-first"].pk
        self.stdout.write(
            "\nask-first waits for an answer (watch exits 3); answer it with\n"
            '    python manage.py loop interject RUN "Hello from my phone"\n'
            f"or on the run's page in the console (/instances/{asking}/ lists its runs)."
        )
