"""Read progress from a check's own output: how much is left to fix, as one whole number (lower is better).

Pure: no Django, no clock, no I/O. `measure(output)` reads the summary lines the common tools print:

- a line `TETHER_PROGRESS: n` (a check of any kind may print it; the last one wins over everything
  else: n is what is left to do, 0 when nothing is);
- pytest: `2 failed, 1 passed, 1 error in 0.27s` (with or without its `===` rule): failed + errors;
  `1 passed in 0.11s` is 0;
- unittest: `FAILED (failures=1, errors=1)` is 2, `OK` after `Ran 3 tests` is 0;
- ruff: `Found 4 errors.`; `All checks passed!` is 0;
- mypy: `Found 2 errors in 1 file (checked 1 source file)`; `Success: no issues found` is 0;
- eslint: `✖ 4 problems (3 errors, 1 warning)`: the errors.

When several tools' summaries appear in one output (a check that runs `ruff check && pytest`), the
last summary of each tool is added up. An output with none of them measures `None` (unknown).

`of_check` is what one check's result records (`loops.policy.Check.progress`): a passed check with
no summary is 0, a timed-out check is None (a slow check says nothing about progress). `total` is
an iteration's: the sum of its checks', or None when any is unknown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MARKER = "TETHER_PROGRESS"
_MARKER = re.compile(rf"^\s*{MARKER}\s*[:=]\s*(\d{{1,12}})\s*$", re.MULTILINE)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# pytest's last line: counts separated by commas, then "in 0.27s" (and the `===` rule around it, or not).
_PYTEST = re.compile(
    r"^[=\s]*((?:\d+ (?:failed|passed|errors?|skipped|deselected|xfailed|xpassed|warnings?|rerun)(?:, )?)+)"
    r" in [\d.]+s(?: \([^)]*\))?[=\s]*$",
    re.MULTILINE,
)
_PYTEST_COUNT = re.compile(r"(\d+) (failed|errors?)\b")
_PYTEST_NONE = re.compile(r"^[=\s]*no tests ran in [\d.]+s[=\s]*$", re.MULTILINE)
_UNITTEST_FAILED = re.compile(r"^FAILED \(((?:\w+=\d+(?:, )?)+)\)\s*$", re.MULTILINE)
_UNITTEST_COUNT = re.compile(r"\b(failures|errors|unexpected successes)=(\d+)")
_UNITTEST_OK = re.compile(r"^Ran \d+ tests? in [\d.]+s\s*\n\s*\nOK\b", re.MULTILINE)
_RUFF = re.compile(r"^Found (\d+) errors?\.\s*$", re.MULTILINE)
_RUFF_OK = re.compile(r"^All checks passed!\s*$", re.MULTILINE)
_MYPY = re.compile(r"^Found (\d+) errors? in \d+ files? \(checked \d+ source files?\)\s*$", re.MULTILINE)
_MYPY_OK = re.compile(r"^Success: no issues found in \d+ source files?\s*$", re.MULTILINE)
_ESLINT = re.compile(r"^\s*[✖x] \d+ problems? \((\d+) errors?, \d+ warnings?\)\s*$", re.MULTILINE)


def _last(found: list[tuple[int, int]]) -> int | None:
    """The count of the summary that comes last in the output (by its position), or None."""
    return max(found)[1] if found else None


def measure(output: str) -> int | None:
    """Return what is left to fix by the summaries in `output` (see the module's doc), or None."""
    text = _ANSI.sub("", output.replace("\r\n", "\n").replace("\r", "\n"))
    if marked := _MARKER.findall(text):
        return int(marked[-1])
    tools = [
        _last(
            [
                (m.start(), sum(int(n) for n, _ in _PYTEST_COUNT.findall(m.group(1))))
                for m in _PYTEST.finditer(text)
            ]
            + [(m.start(), 0) for m in _PYTEST_NONE.finditer(text)]
        ),
        _last(
            [
                (m.start(), sum(int(n) for _, n in _UNITTEST_COUNT.findall(m.group(1))))
                for m in _UNITTEST_FAILED.finditer(text)
            ]
            + [(m.start(), 0) for m in _UNITTEST_OK.finditer(text)]
        ),
        _last(
            [(m.start(), int(m.group(1))) for m in _RUFF.finditer(text)]
            + [(m.start(), 0) for m in _RUFF_OK.finditer(text)]
        ),
        _last(
            [(m.start(), int(m.group(1))) for m in _MYPY.finditer(text)]
            + [(m.start(), 0) for m in _MYPY_OK.finditer(text)]
        ),
        _last([(m.start(), int(m.group(1))) for m in _ESLINT.finditer(text)]),
    ]
    counts = [count for count in tools if count is not None]
    return sum(counts) if counts else None


def of_check(output: str, passed: bool, timed_out: bool = False) -> int | None:
    """What one check's result records: its measure; 0 for a pass that prints none; None when it timed out."""
    if timed_out:
        return None
    found = measure(output)
    if found is None and passed:
        return 0
    return found


def total(values: Iterable[int | None]) -> int | None:
    """An iteration's progress: the sum of its checks' (None when it ran none, or any is unknown)."""
    counts = [
        value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
        for value in values
    ]
    if not counts or any(count is None for count in counts):
        return None
    return sum(count for count in counts if count is not None)
