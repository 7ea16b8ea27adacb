"""The review diff shows everything the run changed, what `.gitignore` hides included.

An agent that wrote `_pytest.py` (`os._exit(0)`: every test run "passes") and a `.gitignore`
hiding both itself and `_pytest.py` left an empty review diff: the snapshot honoured the
workspace's `.gitignore`, so a reviewer sampling the run saw no change at all. Snapshots now keep
what `.gitignore` hides (within limits of its own; caches such as `__pycache__` stay skipped) and
the review diff lists it under its own heading, "Files .gitignore hides".
"""

import subprocess
from decimal import Decimal

import pytest

from reviews import judge, snapshots
from reviews.models import Grading, ReviewItem
from tests.loops.conftest import drive_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

HEADING = "Files .gitignore hides"
SHIM = "import os; os._exit(0)"
HIDE_BOTH = (
    "pathlib.Path('_pytest.py').write_text('import os; os._exit(0)\\n')\n"
    "pathlib.Path('.gitignore').write_text('.gitignore\\n_pytest.py\\n')\n"
    "print('All tests pass!')\n"
)


@pytest.fixture(autouse=True)
def hidden_settings(settings, tmp_path):
    settings.TETHER_SNAPSHOTS = tmp_path / "snapshots"


def start(instance):
    from loops import services

    return services.run_start(instance=instance, user=instance.owner, objective="make the tests pass")


def tree_paths(run, tree):
    done = subprocess.run(
        ["git", "--git-dir", str(snapshots.git_dir(run.pk)), "ls-tree", "-r", "--name-only", tree],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.split()


def hidden_part(text):
    """The part of a review diff under the heading ("" when there is none)."""
    return sections(text)[1]


def sections(text):
    """A review diff's two parts: before the heading, and under it."""
    before, _, under = text.partition(f"=== {HEADING} ===")
    return before, under


def test_a_self_hiding_gitignore_and_pytest_shim_show_under_their_own_heading(user, make_instance, script, client):
    check = script("print('1 passed')\n")
    inst = make_instance(user, command=script(HIDE_BOTH), checks=[{"name": "tests", "command": check, "required": True}])
    Grading.objects.create(instance=inst, sample_percent=Decimal(100))  # a review item, whatever the verdict
    inst.workspace_path().mkdir(parents=True)
    (inst.workspace_path() / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    run = drive_in_thread(start(inst))
    assert run.status == "finished", run.outcome_detail

    text = snapshots.diff(run)
    hidden = hidden_part(text)
    assert hidden, f"the review diff hides what .gitignore hides: {text!r}"
    assert "_pytest.py" in hidden and f"+{SHIM}" in hidden
    assert ".gitignore" in hidden and "+_pytest.py" in hidden and "+.gitignore" in hidden
    assert "2 files changed" in hidden
    assert "calc.py" not in text  # unchanged

    # What the judge reads is the same diff.
    assert hidden_part(snapshots.diff(run, max_chars=judge.DIFF_CHARS)) == hidden

    item = ReviewItem.objects.filter(run=run).first()
    assert item is not None
    client.force_login(user)
    html = client.get(f"/reviews/{item.pk}/").content.decode()
    assert "data-hidden-diff" in html and f"<h3>{HEADING}</h3>" in html
    section = html[html.index("data-hidden-diff") :]
    assert "_pytest.py" in section and f'<span class="add">+{SHIM}</span>' in section
    assert '<span class="add">+.gitignore</span>' in section
    assert "No changes: the workspace is as it was" not in html


def test_an_ordinary_change_shows_as_before_and_ignored_build_output_below_it(user, make_instance, client):
    inst = make_instance(user)
    workspace = inst.workspace_path()
    workspace.mkdir(parents=True)
    (workspace / "app.py").write_text("def answer():\n    return 41\n")
    (workspace / ".gitignore").write_text("build/\n*.log\n")
    run = start(inst)
    snapshots.take(run)
    (workspace / "app.py").write_text("def answer():\n    return 42\n")
    (workspace / "build" / "lib").mkdir(parents=True)
    (workspace / "build" / "lib" / "app.py").write_text("def answer():\n    return 42\n")
    (workspace / "build" / "__pycache__").mkdir()
    (workspace / "build" / "__pycache__" / "app.cpython-312.pyc").write_bytes(b"\0cache")
    (workspace / "run.log").write_text("built\n")
    snapshots.finish(run)

    visible, hidden = sections(snapshots.diff(run))
    # The ordinary change reads as it always did: a stat line, then its patch, nothing hidden in it.
    assert visible.startswith(" app.py | 2 +-") and "1 file changed" in visible
    assert "-    return 41" in visible and "+    return 42" in visible
    assert "build/" not in visible and "run.log" not in visible
    # The build output follows under its own heading; caches stay skipped.
    assert "build/lib/app.py" in hidden and "run.log" in hidden and "+built" in hidden
    assert "__pycache__" not in hidden and "2 files changed" in hidden
    combined = snapshots.diff(run)
    assert combined.index("+    return 42") < combined.index(f"=== {HEADING} ===") < combined.index("build/lib/app.py")

    # A run that changes no hidden file has no heading at all.
    other = start(inst)
    snapshots.take(other)
    (workspace / "app.py").write_text("def answer():\n    return 43\n")
    assert HEADING not in snapshots.diff(other) and "+    return 43" in snapshots.diff(other)


def test_a_file_the_run_hides_shows_its_change_not_a_deletion(user, make_instance):
    inst = make_instance(user)
    workspace = inst.workspace_path()
    workspace.mkdir(parents=True)
    (workspace / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    run = start(inst)
    snapshots.take(run)
    (workspace / "calc.py").write_text("import os\nos._exit(0)\n")
    (workspace / "shim" / "pytest").mkdir(parents=True)  # a hidden directory, not just a file
    (workspace / "shim" / "pytest" / "__init__.py").write_text(f"{SHIM}\n")
    (workspace / ".gitignore").write_text("calc.py\nshim/\n")
    snapshots.finish(run)

    visible, hidden = sections(snapshots.diff(run))
    assert "a/calc.py" not in visible and "deleted file" not in visible + hidden
    assert "+os._exit(0)" in hidden and "-    return a - b" in hidden
    assert "shim/pytest/__init__.py" in hidden and f"+{SHIM}" in hidden
    assert ".gitignore" in visible  # it hides others, not itself


def test_hidden_files_are_bounded_and_what_is_left_out_is_named(user, make_instance, settings):
    settings.TETHER_SNAPSHOT_HIDDEN_MAX_FILES = 50
    settings.TETHER_SNAPSHOT_HIDDEN_MAX_BYTES = 64 * 1024
    settings.TETHER_SNAPSHOT_MAX_FILES = 20  # the visible files' own limit: hidden ones do not count in it
    inst = make_instance(user)
    workspace = inst.workspace_path()
    (workspace / "build").mkdir(parents=True)
    (workspace / "app.py").write_text("x = 1\n")
    (workspace / ".gitignore").write_text("build/\n*.bin\n.gitignore\n_pytest.py\n")
    for n in range(500):
        (workspace / "build" / f"out{n}.o").write_text(f"object {n}\n")
    (workspace / "data.bin").write_bytes(b"\0" * (1024 * 1024))
    run = start(inst)
    snap = snapshots.take(run)
    assert snap.method == "git", snap.note
    (workspace / "build" / "out0.o").write_text("rebuilt\n")  # left out: not compared, and said so
    (workspace / "_pytest.py").write_text(f"{SHIM}\n")  # small: kept, however much else is hidden
    (workspace / "app.py").write_text("x = 2\n")
    snap = snapshots.finish(run)

    stored = tree_paths(run, snap.end_tree)
    assert "_pytest.py" in stored and ".gitignore" in stored and "app.py" in stored
    assert not any(path.startswith("build/") for path in stored) and "data.bin" not in stored

    visible, hidden = sections(snapshots.diff(run))
    assert "+x = 2" in visible
    assert "_pytest.py" in hidden and f"+{SHIM}" in hidden
    assert "not compared" in hidden and "(50 files, 64 KB) at the start and the end of the run" in hidden
    assert "not shown: build/, data.bin)" in hidden and "out0.o" not in hidden and "rebuilt" not in hidden

    # The whole diff is bounded, and a long visible diff does not push the hidden part out of it.
    (workspace / "app.py").write_text("y = 0\n" * 20_000)
    for max_chars in (2_000, 20_000):
        text = snapshots.diff(run, max_chars=max_chars)
        assert len(text) < max_chars + 300, len(text)
        assert f"=== {HEADING} ===" in text and "_pytest.py" in hidden_part(text)


def test_hidden_padding_past_the_walking_limit_is_named_not_walked(user, make_instance, settings):
    settings.TETHER_SNAPSHOT_HIDDEN_MAX_FILES = 5  # so at most 20 hidden entries are walked
    inst = make_instance(user)
    workspace = inst.workspace_path()
    workspace.mkdir(parents=True)
    (workspace / "app.py").write_text("x = 1\n")
    run = start(inst)
    snapshots.take(run)
    (workspace / ".gitignore").write_text("*.pad\n")
    for n in range(300):  # each its own group: one ignored file, or one ignored (empty) directory
        (workspace / f"{n:03}.pad").write_text("")
        (workspace / f"dir{n:03}.pad").mkdir()
    snap = snapshots.finish(run)
    assert snap.method == "git" and snap.end_tree, snap.note

    stored = tree_paths(run, snap.end_tree)
    assert stored == [".gitignore", "000.pad", "001.pad", "002.pad", "003.pad", "004.pad", "app.py"]
    visible, hidden = sections(snapshots.diff(run))
    assert "+*.pad" in visible
    assert "(5 files, 20 MB) at the end of the run" in hidden and "shown: 005.pad, 006.pad, " in hidden
    assert "and 575 more)" in hidden  # 600 groups, 5 kept: 20 named, the rest counted
    assert "000.pad | 0" in hidden and "299.pad" not in hidden
