"""`python manage.py rotate_keys [--finish]` — rotate the secret key Tether derives its keys from.

Stored credentials (Fernet, HKDF of the secret key), receipt signatures, sessions and sign-in
links all derive from `SECRET_KEY`; every earlier key in `SECRET_KEY_FALLBACKS` is still accepted.

`rotate_keys`: write a new secret key to `$TETHER_HOME/secret_key`, after appending the current one
to `$TETHER_HOME/secret_key.fallbacks` (both 0600; the fallback first, so stopping midway loses
nothing), and re-encrypt every stored credential under the new key. Then restart every Tether process.

`rotate_keys --finish`, once every process runs on the new key: re-encrypt what a process still on
the old key stored meanwhile, re-sign under the new key every receipt that verifies under an old
one (a receipt that does not verify keeps its signature: it still shows it was altered), and
remove the fallbacks file. Restart again: sessions signed with the old key end.

With `TETHER_SECRET_KEY` in the environment the key is the operator's to change: set it to a new
value and `TETHER_SECRET_KEY_FALLBACKS` to the old one, restart, run `rotate_keys --finish`, then
unset `TETHER_SECRET_KEY_FALLBACKS` and restart.
"""

import os
import secrets

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from instances import credentials
from instances.models import Credential
from reviews import receipts

PRIVATE = 0o600


class Command(BaseCommand):
    help = "Rotate the secret key: a new key now (old one kept as a fallback); --finish drops the old one."

    def add_arguments(self, parser):
        parser.add_argument(
            "--finish", action="store_true", help="after every process restarted: re-encrypt, re-sign, drop old keys"
        )

    def handle(self, *args, finish=False, **options):
        home = settings.TETHER_HOME
        from_environment = bool(os.environ.get("TETHER_SECRET_KEY"))
        if finish:
            self._finish(home, from_environment)
        elif from_environment:
            raise CommandError(
                "TETHER_SECRET_KEY is set in the environment, so the secret key is yours to change: set "
                "TETHER_SECRET_KEY to a new value and TETHER_SECRET_KEY_FALLBACKS to the old one, restart every "
                "Tether process, then run `manage.py rotate_keys --finish`."
            )
        else:
            self._start(home)

    def _start(self, home):
        old, new = settings.SECRET_KEY, secrets.token_urlsafe(50)
        fallbacks = [old, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
        fd = os.open(home / "secret_key.fallbacks", os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE)
        with os.fdopen(fd, "a") as fh:
            fh.write(old + "\n")
        staged = home / "secret_key.new"
        staged.unlink(missing_ok=True)
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE)
        with os.fdopen(fd, "w") as fh:
            fh.write(new)
        os.replace(staged, home / "secret_key")
        count = credentials.rotate(new, fallbacks)
        self.stdout.write(
            f"a new secret key is in {home / 'secret_key'}; the old one is kept as a fallback; "
            f"{count} stored credential(s) re-encrypted.\n"
            "Next: restart every Tether process (web and workers), then run `manage.py rotate_keys --finish`."
        )

    def _finish(self, home, from_environment):
        count = credentials.rotate()
        unreadable = Credential.objects.count() - count
        resigned, refused = receipts.resign_stored()
        (home / "secret_key.fallbacks").unlink(missing_ok=True)
        self.stdout.write(
            f"{count} stored credential(s) re-encrypted under the current key; {resigned} receipt(s) re-signed."
        )
        if unreadable:
            self.stdout.write(f"{unreadable} credential(s) no configured key opens: their owners must enter them again.")
        if refused:
            self.stdout.write(f"{refused} receipt(s) do not verify and keep their old signature (they were altered).")
        if from_environment and os.environ.get("TETHER_SECRET_KEY_FALLBACKS"):
            self.stdout.write("Next: unset TETHER_SECRET_KEY_FALLBACKS and restart every Tether process.")
        else:
            self.stdout.write("Next: restart every Tether process; sessions signed with the old key end.")
