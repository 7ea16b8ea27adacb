"""The README and docs/ stand alone: no reference outside the repository, and what they name exists."""

import re
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(settings.BASE_DIR)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A file path in backquotes: `loops/runner.py`, `instances/agent_templates/*.json`, `tests/security/`.
PATH = re.compile(r"`((?:[a-z_]+/)+(?:[A-Za-z_*.\-]+\.(?:py|json|md|html|sh))?)`")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_nothing_outside_the_repository_is_referenced(doc):
    text = doc.read_text()
    for outside in ("../shared", "DESIGN.md", "shared/", "/work/"):
        assert outside not in text, f"{doc.name} refers to {outside!r}, outside the repository"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve_inside_the_repository(doc):
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT), f"{doc.name} links outside the repository: {target}"
        assert path.exists(), f"{doc.name} links to a missing file: {target}"


def test_the_readme_links_the_architecture():
    assert "](docs/architecture.md)" in (ROOT / "README.md").read_text()


def test_the_architecture_names_only_files_that_exist():
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = set(PATH.findall(text))
    assert len(named) > 20
    # A path in an app's row is relative to that app (`brains/` in the instances row).
    missing = sorted(p for p in named if not (list(ROOT.glob(p.rstrip("/"))) or list(ROOT.glob("*/" + p.rstrip("/")))))
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"
