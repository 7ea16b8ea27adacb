import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from loops.accounts import login_link


class Command(BaseCommand):
    help = "Print a one-time sign-in link for USERNAME."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--base-url", default=f"http://127.0.0.1:{os.environ.get('PORT', '8000')}")

    def handle(self, username, base_url, **options):
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user named {username!r}")
        self.stdout.write(login_link(user, base_url))
