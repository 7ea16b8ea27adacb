"""`python manage.py loadtemplates [DIR]`: upsert agent templates from their data files."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from instances.templates_loader import TEMPLATES_DIR, TemplateError, load_templates


class Command(BaseCommand):
    help = "Load agent templates (JSON files) into the database, creating or updating them by name."

    def add_arguments(self, parser):
        parser.add_argument("directory", nargs="?", default=str(TEMPLATES_DIR), help="where the *.json files are")

    def handle(self, *args, directory, **options):
        path = Path(directory)
        if not path.is_dir():
            raise CommandError(f"{path} is not a directory")
        try:
            results = load_templates(path, via="cli")
        except TemplateError as exc:
            raise CommandError(str(exc)) from None
        for name, created in results:
            self.stdout.write(f"{'created' if created else 'updated'} template {name}")
        if not results:
            self.stdout.write(f"no templates found in {path}")
