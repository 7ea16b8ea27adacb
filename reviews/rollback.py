"""Roll a run's workspace back to one of its snapshots; a person's action, never an agent's.

A run's points to go back to (`points(run)`): the workspace before the run (`start`), as each
iteration left it (`iteration-N`), the last verified state (`verified`: the newest iteration, of
this run or another on the same workspace, after which every required check passed, or
the end of a verified done), and the state each earlier rollback replaced (`rollback-K`, so a
rollback can itself be undone). All of them are trees in the runs' shadow git directories
(`reviews.snapshots`).

`rollback(run=, user=, to=)` refuses while any run on that workspace is not finished (naming it;
a run made live while the restore writes waits for it before it acts: `wait_for_rollback`),
snapshots the workspace as it is first (kept as `rollback-K` in the run's shadow directory; a
workspace that cannot be snapshot is not rolled back, since that could not be undone), then makes
the workspace hold what the chosen tree holds. Only what the snapshot of the current state holds
is changed or removed: what the snapshots do not keep — a repository's own `.git`, the skipped
directories (`node_modules`, `.venv`, caches), what `.gitignore` hides past its limits, FIFOs and
sockets — is left as it is and named in the answer (`kept`), and a path the restore could not
write without touching such an entry is named too (`not_restored`). `plan(run, to)` answers the
same without changing anything, for the confirmation a person sees first.

`rewind(run=, token=, to=)` is the one narrow way a live run is rolled back: by the run itself,
when its stall handling reaches the rewind its instance asked for (`rewind_on_stall`, see
`loops.policy`), to the state one of its own iterations left the workspace in, under the lease
`token` its driver holds — never by an agent's tool call, never to a point the agent names, and
refused, as any rollback is, while any other run on the workspace is live. The loop asks for it
through `loops.signals.rewind_requested` (it does not import this app); everything else — the undo
point, the writes, the record — is the rollback's own.

Writes go through the workspace held open (`instances.pinned`): each entry is written under a
fresh name in its directory, opened one component at a time without following a link, and
renamed over the old one; removals unlink the entry itself. A symlink the agent left (to
`TETHER_HOME`, `/etc`, another directory) is replaced or removed, never followed, and a hardlink's
other names keep their content. No git command runs in the workspace.

The rollback is audited (`workspace.rollback`) and appended to the run's events
(`workspace.rolled_back`) in one short transaction after the files are written; no transaction
is held while they are.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pygit2
from django.db import transaction
from pygit2.enums import FileMode

from audit import trail
from instances import pinned, sandbox
from instances.models import Instance
from loops import checks as checks_mod
from loops import events, outcomes
from loops.models import Run
from loops.schemas import ROLLBACK_POINT, ROLLBACK_POINT_HELP
from loops.services import Refused
from reviews import snapshots, watch
from reviews.models import WorkspaceSnapshot

log = logging.getLogger(__name__)

POINT = re.compile(ROLLBACK_POINT)
NAMED = 200  # paths an answer names; the rest are counted
ROLLBACK_LOCK_SECONDS = 10  # a rollback waits this long for an iteration beginning (or another rollback)
ITERATION_WAIT_SECONDS = 600  # an iteration waits at most this long for a rollback to finish writing
LOCK_POLL_SECONDS = 0.05
EARLIER_RUNS = 50  # runs on the same workspace searched for the last verified state
BOUND_OR_STOP = outcomes.BOUND_OR_STOP  # its page offers the last verified state first


@dataclass(frozen=True)
class Point:
    """A state the workspace can go back to: its name, a sentence for a person, and where its tree is."""

    to: str
    label: str
    run_id: int  # whose shadow directory holds the tree
    tree: str

    def as_json(self) -> dict[str, Any]:
        return {"to": self.to, "label": self.label, "run": self.run_id, "tree": self.tree}


@dataclass
class Outcome:
    """What a rollback did (or, for a plan, would do)."""

    point: Point
    added: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # in the workspace, not in its snapshot: left as they are
    not_restored: list[str] = field(default_factory=list)  # "path: why"
    undo: str = ""  # the point that returns to the state before this rollback
    exact: bool | None = None  # after a rollback: the workspace's snapshot is now the chosen tree
    done: bool = False

    def as_json(self) -> dict[str, Any]:
        def named(paths: list[str]) -> dict[str, Any]:
            return {"paths": paths[:NAMED], "more": max(len(paths) - NAMED, 0)}

        return {
            "to": self.point.to,
            "label": self.point.label,
            "tree": self.point.tree,
            "rolled_back": self.done,
            "undo": self.undo or None,
            "exact": self.exact,
            "added": named(self.added),
            "modified": named(self.modified),
            "deleted": named(self.deleted),
            "kept": named(self.kept),
            "not_restored": named(self.not_restored),
        }


# --- where a run's workspace can go back to ------------------------------------------------


def _repo(run_id: int) -> pygit2.Repository | None:
    return snapshots.repository(run_id)


def _stored(run_id: int) -> pygit2.Repository:
    """The shadow directory of run `run_id`; Refused (409) when it is gone."""
    found = snapshots.repository(run_id)
    if found is None:
        raise Refused(f"the snapshots of run {run_id} are gone", 409)
    return found


def _ref(repo: pygit2.Repository, name: str) -> str:
    found = repo.references.get(f"refs/tether/{name}")
    return str(found.target) if found is not None else ""


def _numbered(repo: pygit2.Repository, prefix: str) -> list[int]:
    numbers = []
    for name in repo.references:
        tail = name.removeprefix(f"refs/tether/{prefix}-")
        if tail != name and tail.isdigit():
            numbers.append(int(tail))
    return sorted(numbers)


def _after_iteration(
    run: Run, number: int, repo: pygit2.Repository, snapshot: WorkspaceSnapshot | None
) -> str:
    """The tree of the workspace as iteration `number` left it ("" when it was not kept)."""
    if tree := _ref(repo, f"iteration-{number + 1}"):
        return tree
    last = run.iterations.order_by("-number").values_list("number", flat=True).first()
    if number == last and run.status != Run.Status.RUNNING and snapshot is not None:
        return str(snapshot.end_tree)
    return ""


def _passed(checks: Any) -> bool:
    required = [c for c in checks or [] if isinstance(c, dict) and c.get("required")]
    return bool(required) and all(c.get("passed") is True for c in required)


def same_workspace(run: Run) -> list[int]:
    """The ids of the owner's instances whose workspace is this run's (delegation may share one)."""
    mine = os.path.realpath(run.instance.workspace_path())
    return [
        instance.pk
        for instance in Instance.objects.filter(owner_id=run.instance.owner_id)
        if os.path.realpath(instance.workspace_path()) == mine
    ]


def live_run(run: Run, *, besides: int | None = None) -> Run | None:
    """A run on this run's workspace that has not finished (the oldest, other than run `besides`), or None."""
    found = Run.objects.filter(instance_id__in=same_workspace(run)).exclude(status=Run.Status.FINISHED)
    if besides is not None:
        found = found.exclude(pk=besides)
    oldest: Run | None = found.select_related("instance").order_by("pk").first()
    return oldest


def _verified(run: Run) -> Point | None:
    runs = Run.objects.filter(instance_id__in=same_workspace(run), status=Run.Status.FINISHED).order_by(
        "-pk"
    )[:EARLIER_RUNS]
    for earlier in runs:
        repo = _repo(earlier.pk)
        if repo is None:
            continue
        snapshot = WorkspaceSnapshot.objects.filter(run_id=earlier.pk).first()
        whose = "this run" if earlier.pk == run.pk else f"run {earlier.pk}"
        if (
            earlier.outcome == Run.Outcome.DONE
            and earlier.verified
            and snapshot is not None
            and snapshot.end_tree
        ):
            return Point(
                "verified",
                f"the last verified state: the end of {whose} (done, verified)",
                earlier.pk,
                snapshot.end_tree,
            )
        for number, checks in earlier.iterations.order_by("-number").values_list("number", "checks"):
            if _passed(checks) and (tree := _after_iteration(earlier, number, repo, snapshot)):
                return Point(
                    "verified",
                    f"the last verified state: as iteration {number} of {whose} left it, "
                    "every required check passing",
                    earlier.pk,
                    tree,
                )
    return None


def points(run: Run) -> list[Point]:
    """Every state this run's workspace can go back to, the last verified state first when there is one."""
    repo = _repo(run.pk)
    if repo is None:
        return []
    snapshot = WorkspaceSnapshot.objects.filter(run_id=run.pk).first()
    found: list[Point] = []
    if (verified := _verified(run)) is not None:
        found.append(verified)
    if snapshot is not None and snapshot.start_tree:
        found.append(Point("start", "the workspace before this run", run.pk, snapshot.start_tree))
    for number in run.iterations.order_by("number").values_list("number", flat=True):
        if tree := _after_iteration(run, number, repo, snapshot):
            found.append(Point(f"iteration-{number}", f"as iteration {number} left it", run.pk, tree))
    said = {
        data.get("undo"): data
        for data in run.events.filter(kind="workspace.rolled_back").values_list("data", flat=True)
    }
    for number in _numbered(repo, "rollback"):
        to = f"rollback-{number}"
        back = said.get(to) or {}
        label = f"as it was before rollback {number}"
        if back.get("to"):
            label += f" (to {back['to']}, by {back.get('by') or 'a person'})"
        found.append(Point(to, label, run.pk, _ref(repo, to)))
    return found


def offer(run: Run, found: list[Point] | None = None) -> Point | None:
    """The last verified state, when the run ended by a bound or a stop and one is kept; else None."""
    if run.status != Run.Status.FINISHED or run.outcome not in BOUND_OR_STOP:
        return None
    return next((p for p in (points(run) if found is None else found) if p.to == "verified"), None)


def listing(run: Run) -> dict[str, Any]:
    """The run's rollback points as the API and MCP answer them."""
    found = points(run)
    live = live_run(run)
    offered = offer(run, found)
    return {
        "run": run.pk,
        "points": [p.as_json() for p in found],
        "live_run": live.pk if live is not None else None,
        "offer": offered.to if offered is not None else None,
    }


def resolve(run: Run, to: Any) -> Point:
    """The point named `to`; Refused (400) for a name that is none, (409) for one this run does not have."""
    if not isinstance(to, str) or not POINT.fullmatch(to):
        raise Refused(f"to must be {ROLLBACK_POINT_HELP}; got {to!r}")
    for point in points(run):
        if point.to == to:
            return point
    if _repo(run.pk) is None:
        note = WorkspaceSnapshot.objects.filter(run_id=run.pk).values_list("note", flat=True).first()
        raise Refused(
            f"run {run.pk} has no snapshots of its workspace to go back to{f' ({note})' if note else ''}", 409
        )
    if to == "verified":
        raise Refused(
            f"no verified state of run {run.pk}'s workspace is kept: no iteration on it passed every "
            "required check",
            409,
        )
    raise Refused(f"run {run.pk} has no snapshot {to!r}; GET its rollback points to see which it has", 409)


# --- trees, and the workspace against them ------------------------------------------------


Entries = dict[str, tuple[int, pygit2.Oid]]  # path → (git file mode, blob)


def _flatten(repo: pygit2.Repository, tree: str) -> Entries:
    found: Entries = {}

    def walk(node: pygit2.Tree, base: str) -> None:
        for entry in node:
            path = f"{base}{entry.name}"
            if entry.filemode == FileMode.TREE:
                walk(repo[entry.id].peel(pygit2.Tree), f"{path}/")
            elif entry.filemode in (FileMode.BLOB, FileMode.BLOB_EXECUTABLE, FileMode.LINK):
                found[path] = (int(entry.filemode), entry.id)

    walk(repo[tree].peel(pygit2.Tree), "")
    return found


def _skipped(name: str) -> bool:
    return name.lower() == ".git" or name in checks_mod.SKIP_DIRS


def _kept(ws: pinned.Pinned, current: Entries, left_out: list[str]) -> list[str]:
    """What the workspace holds that its snapshot does not: the rollback leaves these as they are."""
    groups = {g.rstrip("/") for g in left_out}
    kept: list[str] = []
    skip = frozenset(name for name in os.listdir(ws.fd) if _skipped(name)) | checks_mod.SKIP_DIRS
    for entry in ws.walk(skip=skip):
        parts = entry.path.split("/")
        if any(_skipped(part) for part in parts[:-1]):
            continue  # inside a directory named already
        if any("/".join(parts[:n]) in groups for n in range(1, len(parts))):
            continue  # inside a left-out group, named already
        if entry.path in groups:
            kept.append(f"{entry.path}/" if entry.kind == "dir" else entry.path)
            continue
        if _skipped(entry.name):
            kept.append(f"{entry.path}/" if entry.kind == "dir" else entry.path)
        elif entry.kind == "other" or (entry.kind in ("file", "link") and entry.path not in current):
            kept.append(entry.path)
    return kept


def _lock(workspace: Path, kind: int, seconds: float) -> int | None:
    """Take the workspace's rollback lock (`fcntl.LOCK_EX` or `LOCK_SH`) within `seconds`; its fd, or None.

    One lock file per workspace (its real path), beside the shadow directories: a rollback holds
    it exclusively while it checks that no run is live and writes; an iteration about to act takes
    it shared for a moment (`wait_for_rollback`), so a run made live meanwhile waits for the restore.
    """
    root = snapshots.git_dir(0).parent
    root.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(os.fsencode(os.path.realpath(workspace))).hexdigest()[:32]
    fd = os.open(root / f"rollback-{key}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    ends = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= ends:
                os.close(fd)
                return None
            time.sleep(LOCK_POLL_SECONDS)


@contextmanager
def _exclusive(workspace: Path) -> Iterator[None]:
    """One rollback of a workspace at a time (this machine's processes); Refused (409) while another runs."""
    fd = _lock(workspace, fcntl.LOCK_EX, ROLLBACK_LOCK_SECONDS)
    if fd is None:
        raise Refused("another rollback of this workspace is under way; try again when it has finished", 409)
    try:
        yield
    finally:
        os.close(fd)


def wait_for_rollback(run: Run) -> None:
    """Return once no rollback of the run's workspace is writing (bounded): called before an iteration acts."""
    fd = _lock(Path(run.instance.workspace_path()), fcntl.LOCK_SH, ITERATION_WAIT_SECONDS)
    if fd is None:
        log.warning(
            "run %s: a rollback of its workspace held it for %s s; the iteration goes on",
            run.pk,
            ITERATION_WAIT_SECONDS,
        )
        return
    os.close(fd)


def _refuse_if_live(run: Run, token: str | None = None) -> None:
    """Refused (409) while a run on the workspace is live.

    With `token` (a rewind), `run` must be running under that lease this moment, and is itself not counted.
    """
    if token is not None:
        if not token or not Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING, lease_token=token).exists():
            raise Refused(f"run {run.pk} is not running under that lease: only a run's own driver rewinds it", 409)
    found = live_run(run, besides=run.pk if token is not None else None)
    if found is not None:
        which = "this run" if found.pk == run.pk else f"run {found.pk}"
        raise Refused(
            f"{which} ({found.instance.name}) is {found.status} on this workspace; a workspace is rolled back only "
            f"while no run on it is live: stop run {found.pk} or wait for it to finish",
            409,
        )


def _pin(run: Run) -> pinned.Pinned:
    try:
        return pinned.Pinned(sandbox.checked_workspace(run.instance.workspace_path()))
    except sandbox.WorkspaceRefused as exc:
        raise Refused(str(exc), 409) from None
    except OSError as exc:
        raise Refused(f"the workspace could not be opened: {exc}", 409) from None


def _current(run: Run) -> str:
    """Snapshot the workspace as it is now into the run's shadow directory; Refused (409) when it cannot be."""
    tree, note = snapshots.capture(run)
    if not tree:
        raise Refused(
            f"the workspace as it is now could not be snapshot ({note}); a rollback could not be undone, "
            "so none is made",
            409,
        )
    return tree


def _repositories(point: Point, run: Run) -> tuple[pygit2.Repository, pygit2.Repository]:
    """The run's shadow directory, and the one that holds `point`'s tree (the same, or an earlier run's)."""
    ours = _stored(run.pk)
    return ours, ours if point.run_id == run.pk else _stored(point.run_id)


def _compare(point: Point, current_tree: str, run: Run) -> tuple[Entries, Entries, Outcome]:
    ours, theirs = _repositories(point, run)
    current, target = _flatten(ours, current_tree), _flatten(theirs, point.tree)
    outcome = Outcome(point)
    for path, entry in target.items():
        if path not in current:
            outcome.added.append(path)
        elif current[path] != entry:
            outcome.modified.append(path)
    outcome.deleted = [path for path in current if path not in target]
    return current, target, outcome


def plan(*, run: Run, to: Any) -> Outcome:
    """What rolling back to `to` would change and leave as it is; nothing is changed (the current
    state is stored as a tree, as any snapshot is)."""
    point = resolve(run, to)
    current_tree = _current(run)
    current, _, outcome = _compare(point, current_tree, run)
    left_out = snapshots.left_out_paths(run.pk, current_tree)
    with _pin(run) as ws:
        outcome.kept = _kept(ws, current, left_out)
    return outcome


def rollback(*, run: Run, user: Any, to: Any, via: str = "api", request: Any = None) -> Outcome:
    """Restore the run's workspace to the point `to`, after snapshotting it as it is (the undo point)."""
    return _restore(run, resolve(run, to), user=user, by=user.get_username(), via=via, request=request)


def rewind(*, run: Run, token: str, to: int, stall: int) -> Outcome:
    """Restore the workspace of `run`, live under lease `token`, to the state its iteration `to` left it in.

    Asked by the run itself when its stall handling in iteration `stall` rewinds (see the module's
    doc); as a rollback does, it snapshots the workspace first (the undo point) and refuses
    (`Refused`, 409) while another run on the workspace is live — and unless `run` is running under
    `token` this very moment.
    """
    if not isinstance(to, int) or isinstance(to, bool) or not 0 < to < stall:
        raise Refused(f"a stalled run rewinds to one of its earlier iterations, not {to!r}")
    point = resolve(run, f"iteration-{to}")
    if point.run_id != run.pk:
        raise Refused(f"a stalled run rewinds to a snapshot of its own, not run {point.run_id}'s", 409)
    return _restore(
        run, point, user=None, by=f"run {run.pk} itself, stalled in iteration {stall}", via="system", token=token
    )


def _restore(
    run: Run, point: Point, *, user: Any, by: str, via: str, request: Any = None, token: str | None = None
) -> Outcome:
    """What `rollback` and `rewind` do: refuse while a run is live, snapshot the workspace, restore `point`, record it."""
    with _exclusive(Path(run.instance.workspace_path())):
        _refuse_if_live(run, token)
        current_tree = _current(run)
        current, target, outcome = _compare(point, current_tree, run)
        ours, theirs = _repositories(point, run)
        number = max(_numbered(ours, "rollback"), default=0) + 1
        outcome.undo = f"rollback-{number}"
        ours.references.create(f"refs/tether/{outcome.undo}", pygit2.Oid(hex=current_tree), force=True)
        left_out = snapshots.left_out_paths(run.pk, current_tree)
        with _pin(run) as ws:
            outcome.kept = _kept(ws, current, left_out)
            _apply(ws, theirs, current, target, outcome)
            uid = os.fstat(ws.fd).st_uid
            if os.geteuid() == 0 and uid != 0:
                pinned.chown_tree(ws.fd, uid)  # directories the restore made
        after, _ = snapshots.capture(run)
        outcome.exact = after == point.tree  # a tree's id is its content's, in any run's shadow directory
        outcome.done = True
        _record(run, user, by, outcome, via, request)
    return outcome


def _missed(run: Run, point: Point) -> None:
    """An accepted review of a run whose work this rollback undid was missed in review (`reviews.watch`)."""
    undone = Run.objects.filter(instance_id__in=same_workspace(run), pk__gte=point.run_id)
    end = WorkspaceSnapshot.objects.filter(run_id=point.run_id).values_list("end_tree", flat=True).first()
    if end and end == point.tree:
        undone = undone.exclude(pk=point.run_id)  # back to that run's end: its own work stays
    for run_id in undone.values_list("pk", flat=True):
        watch.mark_run_missed(run_id, f"its work was rolled back to {point.label or point.to}")


def _apply(
    ws: pinned.Pinned, source: pygit2.Repository, current: Entries, target: Entries, outcome: Outcome
) -> None:
    """Make the workspace hold `target` where it holds `current`: removals first, then the files."""
    gone: set[str] = set()
    for path in outcome.deleted:
        try:
            ws.remove(path)
            gone.add(path)
        except FileNotFoundError:
            gone.add(path)
        except OSError as exc:
            outcome.not_restored.append(f"{path}: not removed: {exc.strerror or exc}")
    needed = {str(parent) for path in target for parent in PurePosixPath(path).parents if str(parent) != "."}
    emptied = {str(parent) for path in gone for parent in PurePosixPath(path).parents if str(parent) != "."}
    for directory in sorted(emptied - needed, key=lambda d: -d.count("/")):
        ws.remove_empty_dir(directory)  # one that still holds what the snapshot keeps not, stays
    failed: set[str] = set()
    for path in [*outcome.added, *outcome.modified]:
        mode, blob = target[path]
        try:
            if path not in current and ws.kind(path) is not None:
                raise pinned.Refused("something the snapshot does not keep is there; it is left as it is")
            data = source[blob].peel(pygit2.Blob).data
            if mode == FileMode.LINK:
                ws.replace(path, link=os.fsdecode(data))
            else:
                ws.replace(path, data=data, mode=0o755 if mode == FileMode.BLOB_EXECUTABLE else 0o644)
        except OSError as exc:
            failed.add(path)
            outcome.not_restored.append(f"{path}: {exc.strerror or exc}")
    outcome.added = [p for p in outcome.added if p not in failed]
    outcome.modified = [p for p in outcome.modified if p not in failed]
    outcome.deleted = [p for p in outcome.deleted if p in gone]


def _record(run: Run, user: Any, by: str, outcome: Outcome, via: str, request: Any) -> None:
    said = outcome.as_json()
    data = {
        "to": outcome.point.to,
        "label": outcome.point.label,
        "by": by,
        "via": via,
        "undo": outcome.undo,
        "exact": outcome.exact,
        "added": len(outcome.added),
        "modified": len(outcome.modified),
        "deleted": len(outcome.deleted),
        "kept": said["kept"]["paths"][:50],
        "kept_more": max(len(outcome.kept) - 50, 0),
        "not_restored": said["not_restored"]["paths"][:50],
    }
    with transaction.atomic():
        events.append(run.pk, "workspace.rolled_back", data)
        trail.record(
            user=user,
            action="workspace.rollback",
            run=run,
            request=request,
            via=via,
            detail={**data, "tree": outcome.point.tree, "from_run": outcome.point.run_id},
        )
        _missed(run, outcome.point)
