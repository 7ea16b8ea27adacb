"""Builders for budget tests: runs on instances, pools with limits."""

import pytest


@pytest.fixture
def make_run(user, make_instance):
    from loops.models import Run

    def build(instance=None, **fields):
        instance = instance or make_instance(user, name=f"inst-{Run.objects.count()}")
        fields.setdefault("objective", "make the tests pass")
        fields.setdefault("max_iterations", 10)
        return Run.objects.create(instance=instance, owner=instance.owner, **fields)

    return build
