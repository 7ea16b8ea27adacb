"""Structured logs: one JSON object per line, with run and iteration ids."""

import json
import logging
import os
import subprocess
import sys

import pytest
from django.conf import settings

from tether import jsonlog
from tether.jsonlog import JsonFormatter


@pytest.fixture(autouse=True)
def nothing_bound():
    # Tests elsewhere call the runner's steps directly in this thread, outside `runner.drive`.
    jsonlog.unbind()
    yield
    jsonlog.unbind()


def record(message="run %s: lease lost", args=(7,), exc_info=None, **extra):
    logger = logging.getLogger("loops.runner")
    rec = logger.makeRecord(
        "loops.runner", logging.WARNING, __file__, 1, message, args, exc_info, extra=extra
    )
    return rec


def test_a_line_carries_level_logger_message_and_the_ids_from_extra():
    line = JsonFormatter().format(record(run_id=7, iteration=3, worker="host:12"))
    assert "\n" not in line
    data = json.loads(line)
    assert data["level"] == "WARNING"
    assert data["logger"] == "loops.runner"
    assert data["message"] == "run 7: lease lost"
    assert (data["run_id"], data["iteration"], data["worker"]) == (7, 3, "host:12")
    assert data["ts"].endswith("+00:00")


def test_ids_are_left_out_when_the_call_did_not_give_them():
    data = json.loads(JsonFormatter().format(record(message="reaper re-scheduled %s run(s)", args=(2,))))
    assert "run_id" not in data and "iteration" not in data
    assert data["message"] == "reaper re-scheduled 2 run(s)"


def test_an_exception_stays_on_one_line():
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        rec = record(exc_info=sys.exc_info(), run_id=1)
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    data = json.loads(line)
    assert "ValueError: boom" in data["exc"] and "Traceback" in data["exc"]


def test_values_json_cannot_encode_are_written_as_text():
    data = json.loads(JsonFormatter().format(record(message="%s", args=(object(),), run_id={1, 2}.__len__())))
    assert data["run_id"] == 2 and data["message"].startswith("<object object")


def test_tether_log_format_json_selects_the_formatter():
    env = {k: v for k, v in os.environ.items() if k != "TETHER_LOG_FORMAT"}
    env.update(TETHER_LOG_FORMAT="json", DJANGO_SETTINGS_MODULE="tether.settings")
    code = (
        "import django, logging; django.setup(); "
        "logging.getLogger('loops.driver').warning('run %s: driver failed', 9, extra={'run_id': 9, 'iteration': 4})"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    assert lines, out.stderr
    assert lines[-1]["message"] == "run 9: driver failed"
    assert (lines[-1]["run_id"], lines[-1]["iteration"], lines[-1]["logger"]) == (9, 4, "loops.driver")


def test_plain_format_is_the_default():
    env = {k: v for k, v in os.environ.items() if k != "TETHER_LOG_FORMAT"}
    env["DJANGO_SETTINGS_MODULE"] = "tether.settings"
    code = "import django, logging; django.setup(); logging.getLogger('loops').warning('hello')"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "WARNING loops hello" in out.stderr and not out.stderr.lstrip().startswith("{")


def test_ids_bound_by_the_thread_appear_on_its_lines():
    import threading

    lines = {}

    def drive(run_id):
        jsonlog.bind(run_id=run_id, worker="host:1")
        jsonlog.bind(iteration=2)
        lines[run_id] = json.loads(JsonFormatter().format(record(message="acting", args=())))

    threads = [threading.Thread(target=drive, args=(n,)) for n in (41, 42)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {n: (line["run_id"], line["iteration"], line["worker"]) for n, line in lines.items()} == {
        41: (41, 2, "host:1"),
        42: (42, 2, "host:1"),
    }
    # This thread bound nothing: its lines carry no ids.
    assert "run_id" not in json.loads(JsonFormatter().format(record(message="idle", args=())))


def test_extra_wins_over_what_was_bound_and_unbind_forgets():
    jsonlog.bind(run_id=1, iteration=1)
    try:
        assert json.loads(JsonFormatter().format(record(run_id=9)))["run_id"] == 9
        assert json.loads(JsonFormatter().format(record()))["iteration"] == 1
    finally:
        jsonlog.unbind()
    assert "iteration" not in json.loads(JsonFormatter().format(record()))


def test_bind_refuses_an_unknown_field():
    with pytest.raises(ValueError, match="secret"):
        jsonlog.bind(secret="sk-1")


def test_restore_puts_back_what_was_bound_before():
    outer = jsonlog.bind(worker="host:1")
    inner = jsonlog.bind(run_id=5)
    jsonlog.bind(iteration=3)
    jsonlog.restore(inner)
    assert jsonlog.bound() == {"worker": "host:1"}
    jsonlog.restore(outer)
    assert jsonlog.bound() == {}


def test_driving_a_run_in_this_thread_leaves_no_ids_behind(user, make_instance, db):
    from loops import leases, runner, services

    instance = make_instance(user, command=["sh", "-c", "echo done"])
    run = services.run_start(instance=instance, user=user, objective="once", via="api")
    runner.drive(leases.claim(run.pk, 1, "log-test"), slice_seconds=60)
    assert jsonlog.bound() == {}
