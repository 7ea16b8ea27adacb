"""Builders for loop tests: scripted agents and in-thread drivers."""

import os
import threading

import pytest


def drive_in_thread(run, holder="test-driver", slice_seconds=3600.0):
    """Claim and drive `run` in this thread until it stops; return the refreshed run."""
    from loops import leases, runner

    lease = leases.claim(run.pk, run.next_iteration, holder)
    assert lease is not None, "the run could not be claimed"
    runner.drive(lease, slice_seconds=slice_seconds)
    run.refresh_from_db()
    return run


@pytest.fixture
def drive():
    return drive_in_thread


@pytest.fixture
def start(user):
    from loops import services

    def build(instance, objective="make the checks pass", **kw):
        return services.run_start(instance=instance, user=instance.owner, objective=objective, **kw)

    return build


class Background:
    """Drive a run in a background thread (for stop tests)."""

    def __init__(self, run):
        from loops import leases

        self.lease = leases.claim(run.pk, run.next_iteration, "bg-driver")
        assert self.lease is not None
        self.thread = threading.Thread(target=self._go, daemon=True)
        self.error = None

    def _go(self):
        from django.db import connection

        from loops import runner

        try:
            runner.drive(self.lease)
        except Exception as exc:  # surfaced by join()
            self.error = exc
        finally:
            connection.close()

    def start(self):
        self.thread.start()
        return self

    def join(self, timeout):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the driver did not finish in time"
        if self.error:
            raise self.error


@pytest.fixture
def background():
    return lambda run: Background(run).start()


os.environ.setdefault("TETHER_TESTING", "1")
