"""A live run's page hears from the server even when no event comes: its summary is re-sent, so a
worker gone quiet shows ("waiting for a worker to pick it up") without a reload."""

import asyncio
from datetime import timedelta

import pytest
from django.utils import timezone

from loops.models import Run
from tests.console.conftest import ONE_ITERATION, record
from tests.console.test_consumers import session_cookie, socket

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_quiet_live_run_gets_its_summary_again_and_a_finished_one_does_not(settings, user, instance, start_run):
    settings.TETHER_CONSOLE_REFRESH_SECONDS = 0.3
    settings.TETHER_LEASE_SECONDS = 300  # a lease with under 99 s left was not renewed: its worker is quiet
    live_run = start_run(instance)
    record(live_run, ONE_ITERATION[:3])
    Run.objects.filter(pk=live_run.pk).update(
        status="running", lease_token="t", lease_expires_at=timezone.now() + timedelta(seconds=60)
    )
    done = start_run(instance, objective="finished one")
    Run.objects.filter(pk=done.pk).update(status="finished", outcome="done", verified=True, finished_at=timezone.now())
    live_run.refresh_from_db()
    done.refresh_from_db()
    cookie = session_cookie(user)

    async def go():
        ws = socket(f"/ws/runs/{live_run.pk}/?after={live_run.last_seq}", cookie)
        assert (await ws.connect())[0]
        summary = await ws.receive_from(timeout=3)
        await ws.disconnect()
        quiet = socket(f"/ws/runs/{done.pk}/?after={done.last_seq}", cookie)
        assert (await quiet.connect())[0]
        nothing = await quiet.receive_nothing(timeout=1.0)
        await quiet.disconnect()
        return summary, nothing

    summary, nothing = asyncio.run(go())
    assert summary.lstrip().startswith(f'<section id="run-{live_run.pk}-summary"') and 'hx-swap-oob="true"' in summary
    assert "waiting for a worker to pick it up (lease expires in" in summary
    assert nothing
