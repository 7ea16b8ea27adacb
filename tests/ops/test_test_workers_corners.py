"""Each pytest-xdist worker talks to a Redis database of its own, counted from the run's own: two runs
given different databases (two checkouts on one machine, CI beside a developer's run) never share one."""

import pytest

from tests.support.parallel import worker_redis_url


def test_a_workers_redis_database_follows_the_runs_own():
    assert worker_redis_url("redis://127.0.0.1:6379/0", 0) == "redis://127.0.0.1:6379/1"
    assert worker_redis_url("redis://127.0.0.1:6379", 3) == "redis://127.0.0.1:6379/4"
    # A run on database 8 and a run on database 12, two workers each: four databases, none shared.
    first = {worker_redis_url("redis://127.0.0.1:6379/8", i) for i in range(2)}
    second = {worker_redis_url("redis://127.0.0.1:6379/12", i) for i in range(2)}
    assert first == {"redis://127.0.0.1:6379/9", "redis://127.0.0.1:6379/10"}
    assert second == {"redis://127.0.0.1:6379/13", "redis://127.0.0.1:6379/14"}


def test_more_workers_than_databases_left_is_said_plainly():
    with pytest.raises(RuntimeError, match="database 12 leaves Redis databases for 3 test workers"):
        worker_redis_url("redis://127.0.0.1:6379/12", 3)
    with pytest.raises(RuntimeError, match="by number"):
        worker_redis_url("redis://127.0.0.1:6379/x", 0)
