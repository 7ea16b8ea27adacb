"""schemathesis against a real server: /v1/openapi.json and the API it describes agree.

A daphne process on the test database answers `schemathesis run` (every check) with a
bounded number of unique examples (TETHER_SCHEMATHESIS_EXAMPLES, 10), two workers and a fixed
seed; the run fails on any 5xx, any response that does not match its documented schema
(status, content type, body, `Allow` on a 405), any 4xx that is not the documented JSON
error, any schema-invalid request it accepts, and (`positive_data_acceptance`) any
schema-valid request it answers 400: a refusal that depends on state (a credential that is
not yours, an instance without a usable key) is a 404 or a 409, and what is data (template
names, priced models) is written into the document when it is served.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

from instances import services as instance_services
from instances.models import Instance
from loops import services
from loops.models import Run
from tests.support.cluster import worker_env
from web.auth import make_token

EXAMPLES = int(os.environ.get("TETHER_SCHEMATHESIS_EXAMPLES", "10"))
SEED = os.environ.get("TETHER_SCHEMATHESIS_SEED", "1")
WORKERS = os.environ.get("TETHER_SCHEMATHESIS_WORKERS", "2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def model_endpoint():
    """The operator's model endpoint: a local Messages API whose decider answers "continue".

    An instance the fuzzer creates asks it through `loop-decide`; with no endpoint reachable the
    API rightly answers 502 (the provider failed), which is the provider's fault, not the API's.
    """
    from tests.fakes.messages_server import MessagesServer, text

    with MessagesServer() as server:
        server.responder = lambda body: text('{"verdict": "continue", "reason": "fuzzed", "next_instruction": "go on"}')
        yield server


@pytest.fixture
def live_api(tmp_path, model_endpoint):
    """`daphne tether.asgi:application` on a free loopback port, on the test database."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "daphne.log"
    env = worker_env(ANTHROPIC_BASE_URL=model_endpoint.url, ANTHROPIC_API_KEY="sk-ant-fuzz-" + "k" * 24)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "tether.asgi:application"],
            cwd=settings.BASE_DIR, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        ends = time.monotonic() + 30
        while True:
            if proc.poll() is not None or time.monotonic() > ends:
                raise AssertionError(f"daphne did not start: {log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2):
                    break
            except OSError:
                time.sleep(0.1)
        yield url, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.schemathesis
@pytest.mark.django_db(transaction=True)
def test_schemathesis_finds_nothing(live_api, django_user_model, tmp_path, shipped_prices):
    url, log = live_api
    user = django_user_model.objects.create_user("fuzz")
    token = make_token(user, name="schemathesis")
    instance = Instance.objects.create(owner=user, name="fuzzed", command=["true"], workspace=str(tmp_path / "ws"))
    # A run to act on, and a finished one to continue, so that ids 1 and 2 reach past the 404s.
    services.run_start(instance=instance, user=user, objective="be fuzzed")
    finished = services.run_start(instance=instance, user=user, objective="be continued")
    Run.objects.filter(pk=finished.pk).update(status=Run.Status.FINISHED, outcome=Run.Outcome.MAX_ITERATIONS)
    # Instance 2, from a template, is what PATCH changes (the safe fields: 200) and DELETE archives;
    # instance 1, made by hand, refuses this user's changes (403) and is archived only once its runs end.
    instance_services.instance_create(user=user, values={"name": "edited"}, template="coder")
    binary = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert binary, "schemathesis is not installed: `make install` installs the test extra"
    # Every check is on (the default; `--checks all` on the command line would outrank the file).
    # The coverage phase can pair a positive path parameter with a negative body and still call
    # the case schema-valid (schemathesis 4.32: mode positive, body mode negative), so the
    # positive-data check runs in the fuzzing and stateful phases, which generate whole cases.
    # In the stateful phase a schema-valid body can meet a limit the fuzzer itself set a step
    # before (it PATCHes an instance's objective cap to 1, then starts a run with a longer
    # objective): that 400 names the instance's cap and is right, so 400 is expected there too.
    # The coverage phase runs first and changes state too (its PATCH leaves instance 2's objective
    # cap at 1), so in the fuzzing phase the operations that check a body against the instance's own
    # caps (starting and continuing a run) expect that 400 as well; every other operation keeps the
    # strict statuses there.
    # DELETE /v1/instances/{id} archives (documented; tests/instances/test_api_edit.py): the instance
    # and everything under it stay readable, changeable and restorable, so a read after it is 200 by
    # design, which ST301 (use_after_free, "a deleted resource answers 404") calls a failure whenever
    # the stateful phase happens to pair the two: off, for this reason only.
    (tmp_path / "schemathesis.toml").write_text(
        "[checks.use_after_free]\nenabled = false\n"
        "[phases.fuzzing.error-feedback]\nenabled = false\n"
        "[phases.coverage.checks.positive_data_acceptance]\nenabled = false\n"
        "[phases.stateful.checks.positive_data_acceptance]\n"
        'expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"]\n'
        "[[operations]]\n"
        'include-path-regex = "^/v1/instances/\\\\{instance_id\\\\}/loop(-decide|/\\\\{run_id\\\\}/continue)?$"\n'
        'include-method = "POST"\n'
        "[operations.checks.positive_data_acceptance]\n"
        'expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"]\n'
        # A schedule's timing is checked beyond its schema (a cron expression croniter reads, an IANA time
        # zone, either cron or an interval, an end after the start): a schema-valid body can be a 400.
        "[[operations]]\n"
        'include-path-regex = "^/v1/instances/\\\\{instance_id\\\\}/schedules"\n'
        "[operations.checks.positive_data_acceptance]\n"
        'expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"]\n'
    )
    result = subprocess.run(
        [
            binary, "run", f"{url}/v1/openapi.json", "--url", url,
            "-H", f"Authorization: Bearer {token}",
            "--max-examples", str(EXAMPLES),
            "--seed", SEED, "--workers", WORKERS, "--no-shrink", "--generation-unique-inputs", "--request-timeout", "20",
            "--report", "json", "--report-dir", str(tmp_path / "report"),
        ],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    print(output[-4000:])  # the phases, their times and counts: shown with -s, or beside a failure
    server_errors = [line for line in log.read_text(errors="replace").splitlines() if "Internal Server Error" in line]
    assert result.returncode == 0 and not server_errors, (
        f"schemathesis failed (exit {result.returncode}):\n{output[-12000:]}\n"
        f"--- server errors ---\n" + "\n".join(server_errors[:20])
    )
