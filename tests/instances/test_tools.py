"""Workspace file tools and the shell tool: confinement, guardrails, bounds."""

import os
import threading
import time

import pytest

from instances.tools import ToolContext, definitions, run_tool
from instances.tools.shell import check_command, minimal_env, run_command


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('hello')\nVALUE = 1\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / "filelink").symlink_to(outside / "secret.txt")
    return root


@pytest.fixture
def ctx(ws):
    return ToolContext(workspace=ws, timeout=5, output_cap=4096)


ESCAPES = ["../outside/secret.txt", "/etc/passwd", "src/../../outside/secret.txt", "link/secret.txt", "filelink",
           "~/secret.txt", "link"]


def _call(tool, path):
    return {
        "list_files": {"path": path},
        "read_file": {"path": path},
        "write_file": {"path": path, "content": "pwned"},
        "edit_file": {"path": path, "old_text": "top", "new_text": "pwned"},
        "search_files": {"pattern": "secret", "path": path},
    }[tool]


@pytest.mark.parametrize("tool", ["list_files", "read_file", "write_file", "edit_file", "search_files"])
@pytest.mark.parametrize("path", ESCAPES)
def test_every_file_tool_refuses_path_escapes(ctx, ws, tool, path):
    result = run_tool(tool, _call(tool, path), ctx)
    assert result.is_error, result.content
    assert "refused" in result.content
    assert (ws.parent / "outside" / "secret.txt").read_text() == "top secret\n"
    assert "top secret" not in result.content
    assert not (ws.parent / "outside" / "pwned").exists()


@pytest.mark.parametrize(
    "command",
    [
        "cat ../outside/secret.txt",
        "cat /etc/passwd",
        "cat link/secret.txt",
        "cat filelink",
        "ls ~",
        "cd .. && ls",
        "cat</etc/passwd",
        "ln -s /etc e",
        "FOO=/etc ls",
        "ls; cat ../outside/secret.txt",
        "echo $(cat /etc/hostname)",
        'sh -c "cat ../outside/secret.txt"',
        "cp src/app.py /tmp/app.py",
        "cat src/../../outside/secret.txt",
    ],
)
def test_the_shell_tool_refuses_path_escapes(ctx, command):
    result = run_tool("run_command", {"command": command}, ctx)
    assert result.is_error, result.content
    assert "refused" in result.content
    assert "top secret" not in result.content


@pytest.mark.parametrize("argv", [["cat", "/etc/passwd"], ["cat", "../outside/secret.txt"], ["ls", "--dir=/etc"],
                                  ["sh", "-c", "cat link/secret.txt"]])
def test_the_shell_tool_refuses_path_escapes_in_argv(ctx, argv):
    result = run_tool("run_command", {"argv": argv}, ctx)
    assert result.is_error and "refused" in result.content


def test_file_tools_work_inside_the_workspace(ctx, ws):
    assert not run_tool("write_file", {"path": "pkg/new/mod.py", "content": "X = 1\n"}, ctx).is_error
    assert (ws / "pkg/new/mod.py").read_text() == "X = 1\n"
    assert run_tool("read_file", {"path": "pkg/new/mod.py"}, ctx).content == "X = 1\n"
    assert run_tool("read_file", {"path": "src/app.py", "offset": 2, "limit": 1}, ctx).content == "VALUE = 1\n"
    assert not run_tool("edit_file", {"path": "src/app.py", "old_text": "VALUE = 1", "new_text": "VALUE = 2"}, ctx).is_error
    assert "VALUE = 2" in (ws / "src/app.py").read_text()
    listing = run_tool("list_files", {"recursive": True}, ctx).content
    assert "src/" in listing and "src/app.py" in listing and "link -> (symlink)" in listing
    found = run_tool("search_files", {"pattern": "VALUE"}, ctx).content
    assert found == "src/app.py:2: VALUE = 2"
    assert run_tool("write_file", {"path": str(ws / "abs.txt"), "content": "ok"}, ctx).is_error is False


def test_file_tool_mistakes_are_error_results_not_exceptions(ctx):
    assert "does not exist" in run_tool("read_file", {"path": "nope.txt"}, ctx).content
    assert run_tool("read_file", {}, ctx).is_error
    assert run_tool("edit_file", {"path": "src/app.py", "old_text": "absent", "new_text": "x"}, ctx).is_error
    assert run_tool("search_files", {"pattern": "(", "regex": True}, ctx).is_error
    assert run_tool("no_such_tool", {}, ctx).is_error
    assert run_tool("read_file", ["not", "a", "dict"], ctx).is_error


def test_shell_runs_in_the_workspace_with_a_minimal_environment(ctx, ws, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-should-not-leak")
    monkeypatch.setenv("TETHER_SECRET_KEY", "django-secret-should-not-leak")
    result = run_tool("run_command", {"command": "pwd; env | sort"}, ctx)
    assert not result.is_error
    assert str(ws.resolve()) in result.content
    names = {line.split("=", 1)[0] for line in result.content.splitlines()[2:] if "=" in line}
    assert names <= {"PATH", "HOME", "LANG", "PWD", "SHLVL", "_"}
    assert "should-not-leak" not in result.content
    assert set(minimal_env(ws)) == {"PATH", "HOME", "LANG"}


def test_shell_timeout_kills_the_command(ws):
    began = time.monotonic()
    result = run_command("sleep 20; echo never", workspace=ws, timeout=0.5)
    assert result.timed_out and time.monotonic() - began < 10  # the command would have taken 20 s
    assert "never" not in result.output


def test_shell_output_is_capped_keeping_head_and_tail(ws):
    result = run_command("seq 1 200000", workspace=ws, timeout=10, output_cap=4096)
    assert result.truncated and len(result.output) < 4096 + 200
    assert result.output.startswith("1\n2\n") and result.output.rstrip().endswith("200000")


def test_shell_stop_kills_the_command(ws):
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    began = time.monotonic()
    result = run_command("sleep 20", workspace=ws, timeout=30, stop=stop)
    assert result.stopped and time.monotonic() - began < 10  # the command would have taken 20 s


@pytest.mark.parametrize(
    ("command", "allow", "deny", "refused"),
    [
        ("curl https://example.com", (), ("curl",), "deny list"),
        ("ls && curl x", (), ("curl",), "deny list"),
        ("timeout 5 curl x", (), ("curl",), "deny list"),
        ("bash -c 'curl x'", (), ("curl",), "deny list"),
        ("echo \"$(curl x)\"", (), ("curl",), "deny list"),
        ("ls\ncurl x", (), ("curl",), "deny list"),
        ("git push origin main", (), ("git push*",), "deny list"),
        ("rm -rf src", ("ls", "cat", "python*"), (), "allow list"),
        ("ls | wc -l", ("ls",), (), "allow list"),
    ],
)
def test_allow_and_deny_lists(ws, command, allow, deny, refused):
    from instances.tools.shell import CommandRefused

    with pytest.raises(CommandRefused, match=refused):
        check_command(command, workspace=ws, allow=allow, deny=deny)


def test_allowed_commands_pass_the_lists(ws):
    assert check_command("git status", workspace=ws, deny=("git push*",)) == ["sh", "-c", "git status"]
    assert check_command("ls -la src | wc -l > /dev/null", workspace=ws, allow=("ls", "wc")) is not None
    assert check_command(["python3", "-c", "print(1)"], workspace=ws, allow=("python*",)) == ["python3", "-c", "print(1)"]
    assert check_command("/usr/bin/env ls", workspace=ws) is not None


def test_commands_run_sandboxed_inside_the_workspace(ws):
    (ws / "probe.sh").write_text("pwd; id -u; ls /\n")  # the guardrail would refuse a literal '/'
    result = run_command(["sh", "probe.sh"], workspace=ws, timeout=20)
    assert result.sandboxed and result.exit_code == 0, result.output
    lines = result.output.split()
    assert lines[0] == str(ws.resolve())
    assert lines[1] != "0"
    assert str(ws.parent.name) not in lines[2:]


def test_without_bubblewrap_commands_are_refused_not_run_unsandboxed(ws, monkeypatch):
    from instances import sandbox
    from instances.tools import shell

    monkeypatch.setenv("PATH", "/nonexistent")
    sandbox._probe.cache_clear()
    try:
        with pytest.raises(shell.CommandRefused, match="apt-get install bubblewrap"):
            run_command("touch made-it", workspace=ws, timeout=5)
    finally:
        monkeypatch.undo()
        sandbox._probe.cache_clear()
    assert not (ws / "made-it").exists()


def test_tool_definitions_follow_the_instance_selection():
    names = [d["name"] for d in definitions(["read_file", "run_command"])]
    assert names == ["read_file", "run_command"]
    for d in definitions(["list_files", "read_file", "write_file", "edit_file", "search_files", "run_command"]):
        assert d["input_schema"]["type"] == "object" and d["description"]
    with pytest.raises(ValueError, match="unknown tool"):
        definitions(["format_disk"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads everything")
def test_unreadable_files_are_error_results(ctx, ws):
    (ws / "locked.txt").write_text("x")
    (ws / "locked.txt").chmod(0)
    assert run_tool("read_file", {"path": "locked.txt"}, ctx).is_error
