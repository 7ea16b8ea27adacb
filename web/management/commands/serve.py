"""`python manage.py serve` — the web server (daphne) and the worker cluster (qcluster).

Both run in the foreground as child processes; Ctrl-C (or SIGTERM) stops both, and
if one dies the other is stopped too. `--web-only` / `--workers-only` run one role,
for deployments that spread them over machines.

On PostgreSQL it first prints the database connections the roles it starts may hold
(`tether.dbpool.budget`: every one from a bounded pool) and refuses to start, naming the
settings, when they do not fit the server's `max_connections` with `TETHER_DB_RESERVE` to spare.
The web server listens with a backlog of LISTEN_BACKLOG: a herd of browsers reconnecting in the
same second is queued by the kernel, not dropped (Twisted's default is 50).
"""

import json
import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, OperationalError, connection, connections, transaction

from instances import sandbox
from tether import addresses, dbpool
from web import accounts

LISTEN_BACKLOG = 1024


def listen_endpoint(host: str, port: int) -> str:
    """daphne's endpoint for `host:port` (as its -b/-p build it), with a listen backlog for a herd."""
    from daphne.endpoints import build_endpoint_description_strings  # lazy: daphne loads only to serve

    return f"{build_endpoint_description_strings(host=host, port=port)[0]}:backlog={LISTEN_BACKLOG}"


def address_file():
    """Where a running `serve` notes the address it listens on, for `loginlink` (in another terminal)."""
    return settings.TETHER_HOME / "serve.json"


def record_address(host: str, port: int) -> None:
    path = address_file()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"host": host, "port": port, "pid": os.getpid()}, fh)


def forget_address() -> None:
    """Remove the note, if it is this process's (another `serve` may have started since)."""
    try:
        if read_address().get("pid") == os.getpid():
            address_file().unlink()
    except OSError:
        pass


def read_address() -> dict:
    """The address a `serve` of this TETHER_HOME that still runs listens on ({} when none does)."""
    try:
        noted = json.loads(address_file().read_text())
        os.kill(int(noted["pid"]), 0)  # still running (a stale note from a killed `serve` is ignored)
        return {"host": str(noted["host"]), "port": int(noted["port"]), "pid": int(noted["pid"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


class Command(BaseCommand):
    help = "Run Tether: web server and worker cluster together (or one of them)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", default=os.environ.get("PORT", "8000"))
        roles = parser.add_mutually_exclusive_group()
        roles.add_argument("--web-only", action="store_true", help="run only the web server")
        roles.add_argument("--workers-only", action="store_true", help="run only the worker cluster")
        parser.add_argument("--no-migrate", action="store_true")

    def handle(self, host, port, web_only, workers_only, no_migrate, **options):
        try:
            port_number = int(port)
            if not 0 < port_number < 65536:
                raise ValueError
        except ValueError:
            raise CommandError(f"PORT must be a TCP port number (1-65535); got {port!r}") from None
        self._check_budget(web=not workers_only, workers=not web_only)
        if not no_migrate:
            call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)

        if warning := sandbox.warning():
            self.stderr.write(f"WARNING: {warning}")
        elif reason := sandbox.problem():
            self.stderr.write(f"WARNING: runs that start programs will be refused: {reason}")
        if not workers_only and not self._first_start(host, port_number):
            if problem := addresses.hint(addresses.reachable_host(host)):
                self.stderr.write(f"WARNING: {problem}")
        connections.close_all()  # this process holds none while its children run (nor counts in the budget)
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        children: list[tuple[str, subprocess.Popen]] = []
        if not workers_only:
            web = [
                sys.executable,
                "-m",
                "daphne",
                "-e",
                listen_endpoint(host, port_number),
                "tether.asgi:application",
            ]
            children.append(("web", subprocess.Popen(web, cwd=settings.BASE_DIR)))
            self.stdout.write(f"Tether web on http://{host}:{port_number}/")
            record_address(host, port_number)
            if addresses.listens_everywhere(host):
                self.stdout.write(f"  from other devices: {addresses.base_url(host, port_number)}/")
        if not web_only:
            children.append(("workers", subprocess.Popen([*manage, "qcluster"], cwd=settings.BASE_DIR)))
            self.stdout.write(
                f"Tether workers: {settings.TETHER_WORKERS} process(es) × {settings.TETHER_RUNS_PER_WORKER} runs"
            )
        stopping = False

        def stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        code = 0
        while not stopping:
            for name, child in children:
                if child.poll() is not None:
                    self.stderr.write(f"{name} exited with status {child.returncode}; stopping Tether")
                    code = child.returncode or 1
                    stopping = True
            time.sleep(0.2)
        for _, child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _, child in children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
        forget_address()
        sys.exit(code)

    def _check_budget(self, *, web: bool, workers: bool) -> None:
        """Print the PostgreSQL connections these roles may hold; refuse to start when they do not fit."""
        if connection.vendor != "postgresql":
            return
        found = dbpool.budget(web=web, workers=workers)
        try:
            fits, said = dbpool.check(found)
        except OperationalError as exc:  # not reachable now: say what was not checked, start as before
            self.stderr.write(
                f"WARNING: Tether could not reach its database to check its connection budget"
                f" ({found.describe()}) against max_connections: {str(exc).strip()[:300]}"
            )
            return
        finally:
            connections.close_all()
        if not fits:
            raise CommandError(said)
        self.stdout.write(f"Tether {said}")

    def _first_start(self, host: str, port: int) -> bool:
        """On the first start, create 'admin' and print a sign-in link; return whether it did."""
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            return False
        try:
            with transaction.atomic():
                admin = User.objects.create_superuser("admin", email="")
                admin.set_unusable_password()
                admin.save()
        except IntegrityError:
            return False  # another process starting at the same moment made it (and printed the link)
        # Listening on every interface (HOST=0.0.0.0): the link names this machine's LAN address.
        link = accounts.login_link(admin, addresses.base_url(host, port))
        self.stdout.write(
            "\nFirst start: created the account 'admin'. Sign in once with this link (it works one time;\n"
            f"`python manage.py loginlink admin` makes another):\n\n    {link}\n"
        )
        if problem := addresses.hint(addresses.reachable_host(host)):
            self.stdout.write(f"The link will not open yet: {problem}\n")
        return True
