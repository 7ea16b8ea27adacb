"""See code that tampers with the test machinery in a change to non-test Python files.

The code under test runs inside the test process, so it can make a failing suite look green:
leave the process early (`os._exit(0)`, an `os.exec*`, `sys.exit` or `raise SystemExit` while
being imported, an `atexit` handler), patch the runner or the assertions
(`unittest.TestCase.assertEqual = ...`, `builtins.AssertionError = ...`,
`setattr(unittest.TestCase, ...)`, `mock.patch('unittest...')`), stop pytest (`pytest.exit`, a
`pytest.skip` at import), or put something else in the place of the runner's modules
(`sys.modules['pytest'] = ...`, `sys.meta_path.insert(...)`). `scan(before, after)` reads each
changed file in both versions and returns a `Finding` for every such line that is new or changed
in `after`: a finding whose kind and line text were already in `before` is not reported again.

Files are read with `ast` when they parse, which sees through the common aliases
(`import os as o`, `from os import _exit`, `__import__('os')._exit`, `getattr(os, '_exit')`,
`sys.modules['os']._exit`, `T = unittest.TestCase`; the reader is `loops.tamper_reader`), and
line by line with patterns when they do not. Ordinary code is left alone: `sys.exit()` inside a
function or under `if __name__ == "__main__":` is how a command-line program ends.

This is a tripwire, not a proof. Code running in the test process can always lie to an in-process
runner (through `exec` of a computed string, `ctypes`, frames, or a function that is only called
later); what stands behind the checks is a QA role with a fresh context, a second check process
that imports nothing from the workspace, and sampling in the review queue.

Pure: no Django, no I/O. Bounded: a file over `MAX_PARSE_BYTES` is read with the patterns only, a
file over `MAX_FILE_BYTES` is not read at all (one finding, on line 0, says so), and at most
`MAX_FINDINGS` findings are returned.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from difflib import SequenceMatcher
from pathlib import PurePosixPath

from loops.tamper_reader import MAX_HITS_PER_FILE, MAX_NAME_CHARS, read_hits

MAX_FILE_BYTES = 1_000_000
MAX_PARSE_BYTES = 250_000  # larger files are read with the patterns only: the AST walk is slow
MAX_FINDINGS = 50
MAX_TEXT_CHARS = 200  # of a line, in a finding
MAX_DIFF_LINES = 20_000  # above this, repeated identical findings are matched in order, not by diff

PYTHON_SUFFIXES = (".py", ".pyw")
TEST_DIRS = frozenset({"tests", "test"})


@dataclass(frozen=True)
class Finding:
    path: str
    line: int  # 1-based; 0 when the finding is about the whole file
    text: str  # the line as it reads in `after` (trailing space removed, cut to MAX_TEXT_CHARS)
    what: str  # a short reason: "calls os._exit", "patches unittest.TestCase.assertEqual"


def is_test_path(path: str) -> bool:
    """A test file: test_*.py, *_test.py, conftest.py, or anything under a tests/ or test/ directory."""
    parts = PurePosixPath(path.replace("\\", "/")).parts
    if not parts:
        return False
    name = parts[-1]
    if name == "conftest.py" or (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py"):
        return True
    return any(part in TEST_DIRS for part in parts[:-1])


def in_scope(path: str) -> bool:
    """The default selection: Python source that is not a test file."""
    return path.endswith(PYTHON_SUFFIXES) and not is_test_path(path)


def scan(
    before: Mapping[str, bytes | str | None],
    after: Mapping[str, bytes | str | None],
    *,
    include: Callable[[str], bool] = in_scope,
) -> list[Finding]:
    """Findings on the lines of `after` that are new or changed relative to `before`.

    Both map a path to the file's content (None or missing: the file is absent). Files `include`
    rejects are skipped (by default: non-Python files and test files). Sorted by path, then line.
    """
    found: list[Finding] = []
    for path in sorted(after):
        if len(found) >= MAX_FINDINGS:
            break
        new = after[path]
        if new is None or not _included(include, path):
            continue
        old = before.get(path)
        new_bytes = _as_bytes(new)
        old_bytes = None if old is None else _as_bytes(old)
        if new_bytes == old_bytes:
            continue
        found.extend(_scan_file(path, old_bytes, new_bytes))
    return found[:MAX_FINDINGS]


# --- One file -------------------------------------------------------------------------------------


def _included(include: Callable[[str], bool], path: str) -> bool:
    try:
        return bool(include(path))
    except Exception:
        return True  # a predicate that cannot decide does not hide a file


def _as_bytes(content: bytes | str) -> bytes:
    if isinstance(content, str):
        return content.encode("utf-8", "surrogatepass")
    return bytes(content)


def _scan_file(path: str, old: bytes | None, new: bytes) -> list[Finding]:
    if len(new) > MAX_FILE_BYTES:
        return [Finding(path, 0, "", f"not scanned: larger than {MAX_FILE_BYTES:,} bytes")]
    new_lines = _lines(new)
    # A package's __main__.py is a program (`python -m package`): its top level runs as one, not on import.
    program = PurePosixPath(path.replace("\\", "/")).name == "__main__.py"
    # A big file is read with the patterns only (both versions, so they give comparable findings).
    small = len(new) <= MAX_PARSE_BYTES and (old is None or len(old) <= MAX_PARSE_BYTES)
    new_tree = _parse(new) if small else None
    if old is None or len(old) > MAX_FILE_BYTES:
        old_lines: list[str] = []
        old_hits: list[tuple[int, str]] = []
    else:
        old_lines = _lines(old)
        old_tree = _parse(old) if new_tree is not None else None
        # Both versions are read the same way when they can be, so the same line gives the same finding.
        old_hits = _hits(old_tree, old_lines, program) if old_tree is not None else _pattern_hits(old_lines, program)
    new_hits = _hits(new_tree, new_lines, program) if new_tree is not None else _pattern_hits(new_lines, program)
    fresh = _fresh(new_hits, new_lines, old_hits, old_lines)
    return [Finding(path, line, _line_text(new_lines, line), what) for line, what in fresh]


def _hits(tree: ast.Module, lines: list[str], program: bool) -> list[tuple[int, str]]:
    try:
        return read_hits(tree, program)
    except (RecursionError, MemoryError):
        return _pattern_hits(lines, program)


def _parse(content: bytes) -> ast.Module | None:
    try:
        return ast.parse(content)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None


def _lines(content: bytes) -> list[str]:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(content).readline)
        text = content.decode(encoding, "replace")
    except (SyntaxError, LookupError, UnicodeError):
        text = content.decode("utf-8", "replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    # The line breaks Python counts (str.splitlines also breaks on form feeds and others).
    return re.split(r"\r\n|\r|\n", text)


def _line_text(lines: list[str], line: int) -> str:
    if 1 <= line <= len(lines):
        return lines[line - 1].rstrip()[:MAX_TEXT_CHARS]
    return ""


def _fresh(
    new_hits: list[tuple[int, str]], new_lines: list[str], old_hits: list[tuple[int, str]], old_lines: list[str]
) -> list[tuple[int, str]]:
    """The hits of `new` not already in `old`: matched by (what, line text), as many times as they occur.

    When a (what, text) pair occurs more often in `new` than in `old`, the ones on lines the diff
    leaves unchanged are taken as the old ones, so the report points at the added line.
    """
    hits = sorted(set(new_hits))
    old_count = Counter((what, _line_text(old_lines, line)) for line, what in set(old_hits))
    if not old_count:
        return hits
    new_count = Counter((what, _line_text(new_lines, line)) for line, what in hits)
    unchanged: set[int] = set()
    if any(new_count[key] > old_count[key] > 0 for key in new_count):
        unchanged = _unchanged_lines(old_lines, new_lines)
    # Hits on unchanged lines claim the old findings first.
    ordered = sorted(hits, key=lambda hit: (hit[0] not in unchanged, hit[0]))
    fresh = []
    for line, what in ordered:
        key = (what, _line_text(new_lines, line))
        if old_count[key] > 0:
            old_count[key] -= 1
        else:
            fresh.append((line, what))
    return sorted(fresh)


def _unchanged_lines(old_lines: list[str], new_lines: list[str]) -> set[int]:
    if len(old_lines) > MAX_DIFF_LINES or len(new_lines) > MAX_DIFF_LINES:
        return set()
    matcher = SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    unchanged: set[int] = set()
    for _, j, size in matcher.get_matching_blocks():
        unchanged.update(range(j + 1, j + size + 1))
    return unchanged


# --- Patterns, for a file that does not parse ----------------------------------------------------

# Every repetition is bounded, so a long line costs time in proportion to its length.
_MACHINERY = r"(?:unittest|_?pytest|pluggy|builtins|__builtins__|TestCase)"
_ASSIGN = r"\s{0,20}(?:[-+*/%&|^@]|//|\*\*|<<|>>)?=(?!=)"
_DOT = r"\s{0,20}\.\s{0,20}"
_INDEX = r"\s{0,20}\[[^\]\n]{0,200}\]"
_CHAIN = rf"(?:{_DOT}\w{{1,100}}|{_INDEX}){{1,20}}"
# (pattern, reason); a reason may name the pattern's `name` group.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), what)
    for pattern, what in (
        (r"\b_exit\b", "mentions os._exit"),
        (rf"\bos{_DOT}exec[lv]p?e?\b", "mentions os.exec"),
        (r"\batexit\b", "mentions atexit"),
        (rf"^(?:sys{_DOT})?(?:exit|quit)\s{{0,20}}\(", "calls sys.exit at import"),
        (rf"^raise\s{{1,20}}(?:builtins{_DOT})?SystemExit\b", "raises SystemExit at import"),
        (rf"(?<![\w.])(?P<name>{_MACHINERY}{_CHAIN}){_ASSIGN}", "patches {name}"),
        (rf"^\s*del\b.*\b{_MACHINERY}\s{{0,20}}[.\[]", "deletes from the test machinery"),
        (rf"\b(?:set|del)attr\s{{0,20}}\(\s{{0,20}}(?P<name>{_MACHINERY}[\w.]{{0,200}})", "patches {name} (setattr)"),
        (rf"\bpatch(?:{_DOT}(?:object|dict|multiple))?\s{{0,20}}\(\s{{0,20}}['\"]?(?P<name>{_MACHINERY}[\w.]{{0,200}})",
         "patches {name} (mock.patch)"),
        (rf"\bsys{_DOT}modules(?P<name>{_INDEX})?{_ASSIGN}", "writes sys.modules{name}"),
        (rf"\bsys{_DOT}modules{_DOT}(?:update|setdefault|pop|popitem|clear|__setitem__|__delitem__)\b",
         "writes sys.modules"),
        (rf"^\s*del\b.*\bsys{_DOT}modules\b", "deletes from sys.modules"),
        (rf"\bsys{_DOT}(?:meta_path|path_hooks)(?:{_DOT}(?:insert|append|extend|remove|pop|clear)\b|{_INDEX}{_ASSIGN}|{_ASSIGN})",
         "modifies sys.meta_path"),
        (rf"\bpytest{_DOT}(?:exit|skip|xfail)\b", "mentions pytest.exit or pytest.skip"),
        (r"\bSkipTest\b", "mentions unittest.SkipTest"),
        (r"^\s*(?:from|import)\s+(?:_pytest|pluggy)\b", "imports pytest internals"),
    )
)


def _pattern_hits(lines: list[str], program: bool = False) -> list[tuple[int, str]]:
    patterns = [(p, what) for p, what in _PATTERNS if not (program and what.endswith(" at import"))]
    hits: list[tuple[int, str]] = []
    for number, line in enumerate(lines, 1):
        for pattern, what in patterns:
            match = pattern.search(line)
            if match is None:
                continue
            name = re.sub(r"\s+", "", match.groupdict().get("name") or "")[:MAX_NAME_CHARS]
            hits.append((number, what.replace("{name}", name) + " (file does not parse)"))
            if len(hits) >= MAX_HITS_PER_FILE:
                return hits
    return hits
