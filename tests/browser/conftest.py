"""Real browsers against a real server: Debian's chromium (Playwright), daphne and a qcluster worker.

The server and the worker are subprocesses on the test database (see tests/support/cluster.py),
so every browser test is `django_db(transaction=True)`.
"""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connections

from tests.support.cluster import Cluster, worker_env

CHROMIUM = Path(os.environ.get("TETHER_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
]
ARTIFACTS = Path(settings.BASE_DIR) / "test-artifacts"
PHONE = {
    "viewport": {"width": 390, "height": 844},
    "device_scale_factor": 2,
    "is_mobile": True,
    "has_touch": True,
    "timezone_id": "America/New_York",
}
LAPTOP = {"viewport": {"width": 1366, "height": 850}, "timezone_id": "America/New_York"}
DEVICES = {"phone": PHONE, "laptop": LAPTOP}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`daphne tether.asgi:application` on 127.0.0.1, as `python manage.py serve` runs it.

    `env` sets the server's own settings (e.g. TETHER_CONSOLE_TIMEOUT_SECONDS="1").
    """

    def __init__(self, log_dir: Path, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_dir / "daphne.log", "wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "tether.asgi:application",
            ],
            cwd=settings.BASE_DIR,
            env=worker_env(**env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.log_path = log_dir / "daphne.log"
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30) -> None:
        ends = time.monotonic() + timeout
        while time.monotonic() < ends:
            if self.proc.poll() is not None:
                raise AssertionError(f"daphne exited: {self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"daphne did not answer within {timeout}s: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


# One server per test process, shared by its browser tests: each test isolates itself by its own user,
# instances and runs (the database is emptied between tests; ids are never reused), not by a server of
# its own. A test that needs other settings starts its own `Server(tmp_path, **env)`. The worker stays
# the test's own: a test without one counts on its runs staying queued.


@pytest.fixture(scope="session")
def _shared_server(django_db_setup, tmp_path_factory):
    started = Server(tmp_path_factory.mktemp("server"))
    yield started
    started.stop()


@pytest.fixture
def server(_shared_server, transactional_db):
    if _shared_server.proc.poll() is not None:
        pytest.fail(f"the shared server has exited: {log_tail(_shared_server.log_path)}")
    yield _shared_server
    print(f"--- daphne log (tail) ---\n{log_tail(_shared_server.log_path)}")  # shown when the test fails


@pytest.fixture(params=list(DEVICES))
def device(request):
    """A test that takes this runs on a phone and on a laptop: (its name, its browser context's options)."""
    return request.param, DEVICES[request.param]


@pytest.fixture
def worker(tmp_path):
    cluster = Cluster("console-worker", tmp_path)
    yield cluster
    # A driver mid-slice keeps a SIGTERMed worker busy for its slice; the test is over: a second is enough.
    cluster.stop(grace=1)
    print(
        f"--- worker log (tail) ---\n{log_tail(tmp_path / 'console-worker.log')}"
    )  # shown when the test fails


@pytest.fixture
def browser(_orm_beside_playwright):
    if not CHROMIUM.exists():
        pytest.fail(
            f"Browser tests need Debian's chromium at {CHROMIUM}: install it with "
            "`apt-get install -y chromium` (.ci/run does), or point TETHER_CHROMIUM at a Chromium binary."
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield launched
        # While Playwright's loop runs, Django keeps this thread's connections per async context;
        # close them here, in that context, or they outlive the test (and block dropping the test DB).
        connections.close_all()
        launched.close()


@pytest.fixture
def artifacts():
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture
def _orm_beside_playwright(monkeypatch):
    # Playwright's sync API keeps an event loop in this thread; the test's own ORM calls are
    # still plain blocking calls between browser steps, which is what this flag allows.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")




PAGE_LIVE_JS = """() => {
    const bar = document.querySelector('.live-bar');
    const socket = bar && bar.tetherSocket;
    return {state: bar && bar.getAttribute('data-state'), text: bar && bar.innerText, lastSeq: bar && bar.getAttribute('data-last-seq'),
            socket: socket ? socket.readyState : null, htmx: typeof htmx, ws: !!(bar && bar['htmx-internal-data']),
            box: bar && JSON.stringify(bar.getBoundingClientRect()), display: bar && getComputedStyle(bar).display,
            visibility: bar && getComputedStyle(bar).visibility, scrollY: window.scrollY};
}"""


def wait_live(page, errors: list[str], within: float = 30) -> None:
    """Wait for the page's live bar to say "live"; if it does not, say what the page shows instead."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector('.live-bar[data-state="live"]', timeout=within * 1000)
    except PlaywrightTimeout:
        raise AssertionError(
            f"the page's live bar did not say live within {within:g} s: {page.evaluate(PAGE_LIVE_JS)}, "
            f"script errors {errors}"
        ) from None


def wait_until_shown_finished(page, run_id: int, errors: list[str], ended_within: float = 60,
                              shown_within: float = 15) -> None:
    """Wait for run `run_id` to end (in the database), then for the page to show it ended.

    The two waits are apart: a busy machine may take long to end a run, which is not the page's
    fault; the page must then be told within `shown_within` seconds. If it is not, the failure says
    where the news stopped: the events recorded and when, what the page last applied, whether its
    socket is open, and any script error.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    from loops.models import Run
    from tests.support.cluster import wait_for

    wait_for(lambda: Run.objects.get(pk=run_id).status == Run.Status.FINISHED, ended_within, "the run to end")
    try:
        page.wait_for_selector(f'#run-{run_id}-summary[data-status="finished"]', timeout=shown_within * 1000)
    except PlaywrightTimeout:
        run = Run.objects.get(pk=run_id)
        recent = [(e.seq, e.kind, e.created_at.strftime("%H:%M:%S.%f")[:-3])
                  for e in run.events.order_by("-seq")[:6]]
        seen = page.evaluate(PAGE_LIVE_JS)
        seen["summary"] = page.get_attribute(f"#run-{run_id}-summary", "data-status")
        raise AssertionError(
            f"run {run_id} ended ({run.outcome}, last seq {run.last_seq}, finished "
            f"{run.finished_at:%H:%M:%S.%f}) but the page was not told within {shown_within:g} s: page {seen}, "
            f"script errors {errors}, recent events {recent}"
        ) from None
