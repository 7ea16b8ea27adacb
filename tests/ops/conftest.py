"""Builders for operations tests."""

import re

import pytest

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.e+-]+|\+Inf|NaN)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> dict[tuple[str, frozenset], float]:
    """Parse Prometheus text format strictly enough to catch a malformed line; return {(name, labels): value}."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    samples: dict[tuple[str, frozenset], float] = {}
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in {"counter", "gauge", "histogram", "summary", "untyped"}, line
            assert name not in typed, f"{name} typed twice"
            typed.add(name)
            continue
        match = SAMPLE.match(line)
        assert match, f"malformed sample line: {line!r}"
        name, labels, value = match.groups()
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or family in typed, f"{name} has no TYPE line before it"
        key = (name, frozenset(LABEL.findall(labels or "")))
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = float(value.replace("+Inf", "inf"))
    return samples


@pytest.fixture
def metrics_token(settings):
    settings.TETHER_METRICS_TOKEN = "scrape-me-0123456789"
    return settings.TETHER_METRICS_TOKEN


@pytest.fixture
def start(user, make_instance):
    from loops import services

    def build(instance=None, objective="tidy the docs", **kw):
        instance = instance or make_instance(user)
        return services.run_start(instance=instance, user=instance.owner, objective=objective, **kw)

    return build
