"""`python manage.py example` — create the example instances (no API key needed).

A real tool is the actor: `ruff check --fix --unsafe-fixes` edits a small workspace
with lint errors; `ruff check .` and the workspace's unit tests are the checks.
- `lint-fixable`: every error is fixable: the run ends `done (verified)`.
- `lint-mixed`: two errors are not: the run shows backpressure, then the
  no-progress guard stops it (`no_progress`).
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


class Command(BaseCommand):
    help = "Create (or reset) the example instances lint-fixable and lint-mixed; print how to run them."

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
        objective = settings.BASE_DIR / "examples" / "objective.txt"
        for name, instance in made.items():
            self.stdout.write(f"instance {instance.pk}: {name} (workspace {instance.workspace})")
        self.stdout.write("\nRun them with:")
        for instance in made.values():
            self.stdout.write(
                f"    python manage.py loop start --instance {instance.pk} --objective-file {objective} --watch"
            )
