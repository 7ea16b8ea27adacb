"""A sandboxed Python reads the bytecode the server compiled, and can change none of it.

The sandbox caches bytecode in its own `/tmp/pycache` (a `.pyc` planted in the workspace is never
run: tests/security/test_protected_evidence.py). The interpreter's own modules come compiled, from
the server's cache mounted read-only (instances/bytecode.py): a check's pytest no longer compiles
and rewrites every module of its plugins each time.
"""

import os
import sys
from pathlib import Path

from instances import bytecode, sandbox
from instances.brains import process


def run_inside(workspace: Path, code: str, *flags: str) -> process.Finished:
    spec = sandbox.Spec(workspace=workspace, instance_id=7, network=False)
    return process.run(
        ["python", *flags, "-c", code], cwd=workspace, env=process.base_env(workspace), timeout=120,
        stop=None, cap=10**7, spec=spec,
    )


def test_a_sandboxed_python_runs_the_servers_compiled_modules(tmp_path):
    done = run_inside(tmp_path, "import json, argparse", "-v")
    assert done.exit_code == 0, done.stderr[-2000:]
    used = [line for line in done.stderr.splitlines() if line.startswith("# code object from '/tmp/pycache/")]
    stdlib = os.path.realpath(sys.base_prefix)
    assert any(f"/tmp/pycache{stdlib}/" in line and "argparse" in line for line in used), done.stderr[-3000:]


def test_the_agent_can_write_none_of_it(tmp_path):
    cache = bytecode.warm()
    assert cache is not None
    [compiled] = list((cache / os.path.realpath(sys.base_prefix).lstrip("/")).rglob("argparse.cpython-*.pyc"))
    before = compiled.read_bytes()
    seen = "/tmp/pycache/" + str(compiled.relative_to(cache))
    done = run_inside(
        tmp_path,
        "import os, sys\n"
        f"target = {seen!r}\n"
        "for attempt in (lambda: open(target, 'wb').write(b'forged'), lambda: os.remove(target),\n"
        "                lambda: open(os.path.join(os.path.dirname(target), 'planted.cpython-313.pyc'), 'wb')):\n"
        "    try:\n"
        "        attempt()\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.errno)\n"
        "    else:\n"
        "        print('WROTE')\n",
    )
    assert done.exit_code == 0, done.stderr[-2000:]
    assert "WROTE" not in done.stdout and done.stdout.count("refused") == 3, done.stdout
    assert compiled.read_bytes() == before
    assert not list(compiled.parent.glob("planted*"))


def test_the_cache_is_made_once_and_holds_only_the_interpreters_trees():
    cache = bytecode.warm()
    assert cache is not None and bytecode.warm() == cache
    kept = {"/" + child.name for child in cache.iterdir()}
    assert all(any(root == top or root.startswith(top + "/") for root in bytecode.roots()) for top in kept), kept
    assert [dest for _, dest in bytecode.mounts()] == [
        "/tmp/pycache" + root for root in bytecode.roots() if (cache / root.lstrip("/")).is_dir()
    ]


def test_a_workspace_beside_the_interpreter_still_caches_its_own_bytecode():
    """A workspace that shares a directory with the interpreter's tree (`make run` keeps both in the
    checkout) writes its own bytecode next to the read-only mount: `py_compile` must work there."""
    import shutil
    import uuid

    workspace = Path(sys.prefix).resolve().parent / f".tether-bytecode-test-{uuid.uuid4().hex[:8]}"
    workspace.mkdir()
    try:
        (workspace / "app.py").write_text("def mul(a, b):\n    return a * b\n")
        done = run_inside(workspace, "import py_compile; print(py_compile.compile('app.py', doraise=True))")
        assert done.exit_code == 0, done.stderr[-2000:]
        assert done.stdout.strip().startswith("/tmp/pycache/"), done.stdout
    finally:
        shutil.rmtree(workspace)
