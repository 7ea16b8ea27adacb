from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from web.auth import make_token


class Command(BaseCommand):
    help = "Print a new API token for USERNAME (shown once; only its digest is stored)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--create-user", action="store_true", help="create the user if it does not exist")

    def handle(self, username, create_user, **options):
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            if not create_user:
                raise CommandError(f"no user named {username!r}; add --create-user to create one")
            user = User.objects.create_user(username)
            user.set_unusable_password()
            user.save()
        self.stdout.write(make_token(user))
