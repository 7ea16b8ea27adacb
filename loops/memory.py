"""A run's rolling memory: what one iteration leaves for the next, as one typed value.

Stored in `Run.history` (JSON); read with `Memory.of(run.history)` and written back with
`as_json()` — nowhere else is that JSON taken apart or put together. It holds:

- `instructions` and `progress`: the last `policy.KEPT` instructions and (workspace
  fingerprint, checks signature) pairs — what the policy's no-progress and repetition rules
  look at;
- `delegations` and `refusals`: what each of the last `policy.KEPT` iterations delegated (a
  key: the calls, the workspace, the results the act was given) and had refused — what the
  no-progress rules that see compositions look at;
- `track`: (iteration, progress, workspace fingerprint) for the last `TRACK_KEPT` iterations —
  progress is what the checks said is left to fix (`loops.progress`), None for an iteration that
  waited (asked a person, needed an approval, delegated) or whose checks measured nothing; what
  the policy's stall rules (no better count for K iterations, a workspace back where it was) and
  its forecast look at;
- `stall`: (stage, iteration) of the last stall handling the policy took (a nudge, a rewind, an
  escalation); the brief of an iteration after which the workspace was rewound names the iteration
  it went back to (`rewound_to`);
- `failed_acts`: how many acts in a row have failed;
- `snapshot`: the last `SNAPSHOT_KEPT` iterations in brief, handed to the next act and to the
  decider (and carried into a continued run, see `continuation.carried_history`). An iteration
  alike an earlier one in it (told the same, answered the same, delegated and had refused the
  same, checked and judged the same — `alike`) is not added beside it: the earlier entry becomes
  this one, counting how many went so (`times`) since the first (`first`). A loop that repeats
  itself keeps a snapshot of constant size, however long it runs;
- `pending_approval` / `approved_calls`: tool calls waiting for a person, and the ones a person
  approved, handed to the next act once and then forgotten.

Pure: no Django, no clock, no I/O. Tolerant of what older versions stored: a missing or
malformed part reads as empty.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import loops.policy as policy

SNAPSHOT_KEPT = 20  # iterations in brief handed to the next act
TRACK_KEPT = 100  # iterations whose progress and workspace the stall rules and the forecast see
TRACK_DIGEST = 16  # hex digits of a workspace fingerprint the track keeps (enough to tell trees apart)
SNAPSHOT_CHARS = 500  # of an iteration's instruction and response, each
# What tells two rounds of the same delegation apart in the instruction that reports them, and means
# nothing to the model: the ids of the delegate calls and the numbers of the runs they started
# ("## delegate call toolu_… → run 72 on helper: done", `delegation_results.render_results`).
_ROUND_IDS = re.compile(r"(?<=delegate call )\S+|(?<=→ run )\d+")
# An entry's numbering, not what happened in it.
_NUMBERING = frozenset({"iteration", "first", "times", "from_iteration"})


@dataclass(frozen=True)
class Memory:
    instructions: tuple[str, ...] = ()
    progress: tuple[tuple[str, str], ...] = ()
    failed_acts: int = 0
    snapshot: tuple[Mapping[str, Any], ...] = ()
    pending_approval: tuple[Mapping[str, Any], ...] = ()
    approved_calls: tuple[Mapping[str, Any], ...] = ()
    delegations: tuple[str, ...] = ()
    refusals: tuple[tuple[str, ...], ...] = ()
    track: tuple[tuple[int, int | None, str], ...] = ()
    stall: tuple[int, int] = (0, 0)

    @classmethod
    def of(cls, stored: Mapping[str, Any] | None) -> Memory:
        """Read a run's stored memory (None or {} is an empty one)."""
        stored = stored if isinstance(stored, Mapping) else {}
        failed = stored.get("failed_acts", 0)
        return cls(
            instructions=tuple(str(i) for i in _list(stored, "instructions")),
            progress=tuple((str(p[0]), str(p[1])) for p in _list(stored, "progress") if _pair(p)),
            failed_acts=failed if isinstance(failed, int) and not isinstance(failed, bool) and failed > 0 else 0,
            snapshot=_mappings(stored, "snapshot"),
            pending_approval=_mappings(stored, "pending_approval"),
            approved_calls=_mappings(stored, "approved_calls"),
            delegations=tuple(str(d) for d in _list(stored, "delegations")),
            refusals=tuple(tuple(str(r) for r in each) for each in _list(stored, "refusals") if isinstance(each, list | tuple)),
            track=tuple(_step(t) for t in _list(stored, "track") if _is_step(t)),
            stall=_stall(stored.get("stall")),
        )

    def as_json(self) -> dict[str, Any]:
        """What `Run.history` stores: only the parts that hold something."""
        parts: dict[str, Any] = {
            "instructions": list(self.instructions),
            "progress": [list(p) for p in self.progress],
            "failed_acts": self.failed_acts,
            "snapshot": [dict(s) for s in self.snapshot],
            "pending_approval": [dict(c) for c in self.pending_approval],
            "approved_calls": [dict(c) for c in self.approved_calls],
            "delegations": list(self.delegations) if any(self.delegations) else [],
            "refusals": [list(r) for r in self.refusals] if any(self.refusals) else [],
            "track": [list(t) for t in self.track],
            "stall": list(self.stall) if self.stall[0] else [],
        }
        return {name: value for name, value in parts.items() if value}

    def recent_instructions(self, instruction: str) -> tuple[str, ...]:
        """The instructions the policy compares, `instruction` (this iteration's) last."""
        return (*self.instructions, instruction)[-policy.KEPT :]

    def recent_progress(self, fingerprint: str, signature: str) -> tuple[tuple[str, str], ...]:
        return (*self.progress, (fingerprint, signature))[-policy.KEPT :]

    def recent_track(self, number: int, progress: int | None, fingerprint: str) -> tuple[tuple[int, int | None, str], ...]:
        """The iterations the stall rules look at, iteration `number` (this one) last."""
        return (*self.track, (number, progress, fingerprint[:TRACK_DIGEST]))[-TRACK_KEPT:]

    def recent_delegations(self, key: str) -> tuple[str, ...]:
        """What recent iterations delegated, `key` (this iteration's) last."""
        return (*self.delegations, key)[-policy.KEPT :]

    def recent_refusals(self, refused: Sequence[str]) -> tuple[tuple[str, ...], ...]:
        """What recent iterations had refused, `refused` (this iteration's) last."""
        return (*self.refusals, tuple(refused))[-policy.KEPT :]

    def refused_after(self, refused: Sequence[str]) -> Memory:
        """The memory once the last recorded iteration's delegate calls met `refused` (known after its record)."""
        if not refused:
            return self
        last = self.refusals[-1] if self.refusals else ()
        snapshot = self.snapshot
        if snapshot:  # the brief of that iteration says it too, and may now be alike an earlier one
            brief = {**snapshot[-1], "refused": [*_strings(snapshot[-1].get("refused")), *refused]}
            snapshot = joined(snapshot[:-1], brief)
        refusals = (*self.refusals[:-1], (*last, *refused))[-policy.KEPT :]
        return replace(self, refusals=refusals, snapshot=snapshot)

    def failed_in_a_row(self, act_ok: bool) -> int:
        """How many acts in a row have failed, this one included (0 when it succeeded)."""
        return 0 if act_ok else self.failed_acts + 1

    def after(
        self, *, instruction: str, fingerprint: str, signature: str, act_ok: bool, response: str,
        checks: Mapping[str, bool], verdict: str, number: int, pending: Sequence[Mapping[str, Any]] = (),
        delegation: str = "", refused: Sequence[str] = (), progress: int | None = None, stall: int = 0,
        rewound_to: int = 0,
    ) -> Memory:
        """The memory once iteration `number` is recorded: approvals handed to it are spent."""
        brief: dict[str, Any] = {
            "iteration": number,
            "instruction": instruction[:SNAPSHOT_CHARS],
            "response": response[-SNAPSHOT_CHARS:],
            "checks": dict(checks),
            "verdict": verdict,
        }
        if delegated := delegation.partition(" ")[2]:  # the key's second part names the calls
            brief["delegated"] = delegated
        if refused:
            brief["refused"] = list(refused)
        if rewound_to:
            brief["rewound_to"] = rewound_to
        # Legitimate waiting is never counted as stuck: an iteration that asked a person, needed an
        # approval or delegated records no progress (a slow check's timeout records none already).
        waiting = verdict == "escalate" or bool(pending) or bool(delegation)
        return replace(
            self,
            instructions=self.recent_instructions(instruction),
            progress=self.recent_progress(fingerprint, signature),
            failed_acts=self.failed_in_a_row(act_ok),
            snapshot=joined(self.snapshot, brief),
            pending_approval=tuple(pending) or self.pending_approval,
            approved_calls=(),
            delegations=self.recent_delegations(delegation),
            refusals=self.recent_refusals(refused),
            track=self.recent_track(number, None if waiting else progress, fingerprint),
            stall=(stall, number) if stall else self.stall,
        )

    def answered(self, approve: bool) -> Memory:
        """The memory once a person answered the pending approval: approved calls run first in the next act."""
        approved = tuple({"name": c.get("name"), "input": c.get("input")} for c in self.pending_approval)
        return replace(self, pending_approval=(), approved_calls=approved if approve else ())


def alike(brief: Mapping[str, Any]) -> str:
    """Return what two briefs share when their iterations went the same way: all but their numbering.

    The instruction is read blind to the ids of the delegate calls it reports on and the runs they
    started, so rounds that delegated the same and heard the same back are alike.
    """
    kept = {name: value for name, value in brief.items() if name not in _NUMBERING}
    kept["instruction"] = _ROUND_IDS.sub("…", str(kept.get("instruction") or ""))
    return json.dumps(kept, sort_keys=True, ensure_ascii=False, default=str)


def joined(snapshot: Sequence[Mapping[str, Any]], brief: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    """Return `snapshot` with `brief` last: in place of an entry alike it (counting both), else beside them.

    The newest `SNAPSHOT_KEPT` entries are kept.
    """
    same = alike(brief)
    earlier = [entry for entry in snapshot if alike(entry) == same]
    if earlier:
        firsts = [_first(entry) for entry in (*earlier, brief)]
        times = sum(_times(entry) for entry in (*earlier, brief))
        brief = {**brief, "first": min(firsts), "times": times}
    return (*(entry for entry in snapshot if alike(entry) != same), brief)[-SNAPSHOT_KEPT:]


def _times(entry: Mapping[str, Any]) -> int:
    times = entry.get("times", 1)
    return times if isinstance(times, int) and not isinstance(times, bool) and times > 0 else 1


def _first(entry: Mapping[str, Any]) -> int:
    number = entry.get("first", entry.get("iteration", 0))
    return number if isinstance(number, int) and not isinstance(number, bool) else 0


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list | tuple) else []


def _list(stored: Mapping[str, Any], name: str) -> list[Any]:
    value = stored.get(name)
    return list(value) if isinstance(value, list | tuple) else []


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_step(value: Any) -> bool:
    return (
        isinstance(value, list | tuple) and len(value) == 3 and _whole(value[0])
        and (value[1] is None or _whole(value[1])) and isinstance(value[2], str)
    )


def _step(value: Any) -> tuple[int, int | None, str]:
    return (int(value[0]), None if value[1] is None else int(value[1]), str(value[2]))


def _stall(value: Any) -> tuple[int, int]:
    if isinstance(value, list | tuple) and len(value) == 2 and _whole(value[0]) and _whole(value[1]):
        return (int(value[0]), int(value[1]))
    return (0, 0)


def _pair(value: Any) -> bool:
    return isinstance(value, list | tuple) and len(value) == 2


def _mappings(stored: Mapping[str, Any], name: str) -> tuple[Mapping[str, Any], ...]:
    return tuple(dict(item) for item in _list(stored, name) if isinstance(item, Mapping))
