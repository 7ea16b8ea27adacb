"""The shell tool: one command run inside the workspace under an instance's guardrails.

Spawns a process. The command (an argv list, or a string run with `sh -c`) runs with
cwd = the workspace, stdin closed, an environment of PATH, HOME (the workspace) and LANG
only — nothing of the platform's own environment, so no key can leak into it — a
timeout, a cap on the output kept, and its whole process group killed at the timeout or
when the run is stopped. Before it runs, the command is checked: the instance's deny
list, then its allow list, then every word that names a path must stay inside the
workspace (no `..`, no `~`, no absolute path outside, no symlink leading out).

That check is a guardrail against honest mistakes, not a sandbox: a determined program
can still compute a path at run time. The boundary is the sandbox (`instances.sandbox`):
every command runs there, and a command is refused — never run unsandboxed — when the
sandbox cannot be set up.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from instances import sandbox

log = logging.getLogger(__name__)

SAFE_PATH = os.pathsep.join(dict.fromkeys([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]))
SYSTEM_PREFIXES = ("/usr/", "/bin/", "/sbin/", "/usr/local/", str(Path(sys.executable).parent) + "/")
DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/urandom"})
SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", ";;", "|&", "\n"})
REDIRECTS = frozenset({">", ">>", "<", "<<", "<<<", ">&", "<&", ">|", "&>", "&>>"})
# Programs that run another program named by a later word; the later one is checked too.
WRAPPERS = frozenset({"env", "nohup", "nice", "exec", "command", "time", "xargs", "sudo", "stdbuf", "timeout", "doas"})
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")


class CommandRefused(Exception):
    """A command the instance's guardrails refuse; the message is shown to the model."""


@dataclass
class CommandResult:
    exit_code: int | None
    output: str
    timed_out: bool = False
    stopped: bool = False
    truncated: bool = False
    sandboxed: bool = False

    def as_text(self) -> str:
        if self.stopped:
            head = "stopped: the run was stopped while the command ran"
        elif self.timed_out:
            head = "timed out: the command was killed"
        else:
            head = f"exit code {self.exit_code}"
        return f"{head}\n{self.output}" if self.output else head


def minimal_env(workspace: Path) -> dict[str, str]:
    """Return the whole environment a command gets: a search path, a home, a locale."""
    return {"PATH": SAFE_PATH, "HOME": str(workspace), "LANG": "C.UTF-8"}


# --- checking ----------------------------------------------------------------------------


def _words(script: str) -> list[str]:
    # Newlines and backticks separate commands too; shlex would fold them into words.
    lexer = shlex.shlex(script.replace("\n", " ; ").replace("`", " ; "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError as exc:
        raise CommandRefused(f"command refused: it does not parse ({exc})") from None


def _simple_commands(words: Sequence[str]) -> list[list[str]]:
    commands: list[list[str]] = [[]]
    for word in words:
        if word in SEPARATORS or word == "$":
            commands.append([])
        else:
            commands[-1].append(word)
    return [c for c in commands if c]


def _expand(commands: list[list[str]], depth: int = 0) -> list[list[str]]:
    """Return `commands` plus the ones nested in `sh -c SCRIPT` and `$(...)`, which run too."""
    nested: list[list[str]] = []
    for simple in commands:
        words = [w for w in simple if w not in REDIRECTS]
        for index, word in enumerate(words):
            if os.path.basename(word) in SHELLS and "-c" in words[index + 1 :]:
                at = words.index("-c", index + 1)
                if at + 1 < len(words):
                    nested += _simple_commands(_words(words[at + 1]))
            for inner in SUBSTITUTION.findall(word):
                nested += _simple_commands(_words(inner))
    if nested and depth >= 4:
        raise CommandRefused("command refused: shells nested too deeply to check")
    return commands + (_expand(nested, depth + 1) if nested else [])


def _programs(command: Sequence[str]) -> list[tuple[str, str]]:
    """Return (program, the simple command as text) for a command and the programs it wraps."""
    found: list[tuple[str, str]] = []
    words = [w for w in command if w not in REDIRECTS]
    text = " ".join(command)
    i = 0
    while i < len(words):
        word = words[i]
        if "=" in word and not word.startswith("=") and word.split("=", 1)[0].isidentifier():
            i += 1  # an assignment before the program
            continue
        name = os.path.basename(word)
        found.append((name, " ".join([name, *words[i + 1 :]])))
        if name not in WRAPPERS:
            break
        i += 1
        # Skip the wrapper's own options and, for `timeout`, its duration.
        while i < len(words) and (words[i].startswith("-") or (name == "timeout" and words[i][:1].isdigit())):
            i += 1
    if not found and text:
        found.append((text, text))
    return found


def _matches(pattern: str, program: str, text: str) -> bool:
    if " " in pattern.strip():
        return fnmatch.fnmatchcase(text, pattern.strip())
    return fnmatch.fnmatchcase(program, pattern.strip())


def _check_lists(programs: list[tuple[str, str]], allow: Sequence[str], deny: Sequence[str]) -> None:
    for program, text in programs:
        for pattern in deny:
            if _matches(pattern, program, text):
                raise CommandRefused(f"command refused: {program!r} matches {pattern!r} on this instance's deny list")
        if allow and not any(_matches(p, program, text) for p in allow):
            raise CommandRefused(
                f"command refused: {program!r} is not on this instance's allow list (allowed: {', '.join(allow)})"
            )


def _check_path(word: str, workspace: Path, *, command_position: bool) -> None:
    candidates = [word]
    if "=" in word:
        candidates.append(word.split("=", 1)[1])
    for value in candidates:
        if not value or value.startswith("-") and "=" not in value:
            continue
        if value.startswith("~"):
            raise CommandRefused(f"command refused: {word!r} points outside the workspace ('~' is not allowed)")
        if ".." in Path(value).parts or value.endswith("/.."):
            raise CommandRefused(f"command refused: {word!r} uses '..'; paths stay inside the workspace")
        if value.startswith("/"):
            if value in DEVICES:
                continue
            if command_position and value.startswith(SYSTEM_PREFIXES):
                continue
            if not Path(value).resolve().is_relative_to(workspace):
                raise CommandRefused(
                    f"command refused: {word!r} is an absolute path outside the workspace; use paths relative to it"
                )
            continue
        candidate = workspace / value
        if ("/" in value or os.path.lexists(candidate)) and not candidate.resolve().is_relative_to(workspace):
            raise CommandRefused(f"command refused: {word!r} leads outside the workspace (through a symlink)")


def check_command(
    command: str | Sequence[str],
    *,
    workspace: Path,
    allow: Sequence[str] = (),
    deny: Sequence[str] = (),
) -> list[str]:
    """Return the argv to run for `command`, or raise CommandRefused saying why not."""
    workspace = workspace.resolve()
    if isinstance(command, str):
        if not command.strip():
            raise CommandRefused("command refused: it is empty")
        argv = ["sh", "-c", command]
        commands = _simple_commands(_words(command))
    else:
        argv = [str(a) for a in command]
        if not argv or not argv[0]:
            raise CommandRefused("command refused: argv is empty")
        commands = [argv]
    commands = _expand(commands)
    programs = [p for c in commands for p in _programs(c)]
    _check_lists(programs, allow, deny)
    for simple in commands:
        words = [w for w in simple if w not in REDIRECTS]
        first = next((i for i, w in enumerate(words) if not ("=" in w and w.split("=", 1)[0].isidentifier())), 0)
        for index, word in enumerate(words):
            _check_path(word, workspace, command_position=index == first)
    return argv


# --- running ----------------------------------------------------------------------------


class _Capture:
    """Keep the head and the tail of a stream, up to `cap` bytes in all."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 4
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head.extend(chunk[:room])
            chunk = chunk[room:]
        self.tail.extend(chunk)
        if len(self.tail) > self.tail_cap:
            excess = len(self.tail) - self.tail_cap
            del self.tail[:excess]
            self.dropped += excess

    def text(self) -> str:
        middle = f"\n… {self.dropped} bytes of output elided …\n".encode() if self.dropped else b""
        return bytes(self.head + middle + self.tail).decode("utf-8", errors="replace")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_command(
    command: str | Sequence[str],
    *,
    workspace: Path,
    timeout: float,
    output_cap: int = 64 * 1024,
    allow: Iterable[str] = (),
    deny: Iterable[str] = (),
    stop: threading.Event | None = None,
    instance_id: int | None = None,
    network: bool = False,
) -> CommandResult:
    """Run a checked command in the workspace's sandbox; raise CommandRefused before running a refused one."""
    spec = sandbox.Spec(workspace=workspace, instance_id=instance_id, network=network)  # walked again there
    workspace = workspace.resolve()
    argv = check_command(command, workspace=workspace, allow=tuple(allow), deny=tuple(deny))
    try:
        proc, sandboxed = sandbox.spawn(
            argv,
            spec,
            env=minimal_env(workspace),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    except sandbox.SandboxUnavailable as exc:
        raise CommandRefused(f"command refused: {exc}") from None
    except OSError as exc:
        raise CommandRefused(f"command could not start: {exc.strerror or exc}") from None
    capture = _Capture(max(output_cap, 1024))

    assert proc.stdout is not None
    stdout = proc.stdout.fileno()

    def drain() -> None:
        try:
            for chunk in iter(lambda: os.read(stdout, 65536), b""):
                capture.feed(chunk)
        except OSError:
            pass  # the pipe was closed under us after a kill

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    deadline = time.monotonic() + max(timeout, 0.1)
    timed_out = stopped = False
    while proc.poll() is None:
        if stop is not None and stop.is_set():
            stopped = True
        elif time.monotonic() >= deadline:
            timed_out = True
        if stopped or timed_out:
            _kill(proc)
            break
        time.sleep(0.02)
    _kill(proc)  # stray children holding the pipe open go too
    proc.wait()
    reader.join(timeout=2)
    if not reader.is_alive():
        proc.stdout.close()
    return CommandResult(
        exit_code=proc.returncode if not (timed_out or stopped) else None,
        output=capture.text(),
        timed_out=timed_out,
        stopped=stopped,
        truncated=capture.dropped > 0,
        sandboxed=sandboxed,
    )
