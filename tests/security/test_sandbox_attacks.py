"""The governed cannot reach the governor: attacks from inside the sandbox, through the real runner.

One attack script tries, at run time and with computed paths, everything an agent must not do:
read Tether's secret key and database, another user's workspace, the server's environment
(through `/proc`), connect to PostgreSQL and Redis on 127.0.0.1, and write outside its
workspace. It runs as a `command`-brain act, as a check, and through the Claude brain's
`run_command` tool; every attempt must fail, the run must record what was refused, and nothing
on the host may change. Each test first shows the same attempts succeed from the server
itself, so it fails on code that runs programs unsandboxed.
"""

import json
import os
import shutil
import socket

import pytest
from django.conf import settings

from loops.models import Event
from tests.fakes.messages_server import MessagesServer, text, tool_use, tool_uses
from tests.loops.conftest import drive_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-ant-api03-SANDBOXTESTKEY-0123456789abcdefXYZW"
CANARY = "tether-canary-8d1f0c2b9e"

ATTACK = r"""
import json, os, socket, sys
T = json.loads({targets!r})
results = {{}}

def attempt(name, fn):
    try:
        results[name] = "ALLOWED: " + repr(fn())[:120]
    except Exception as exc:
        results[name] = "refused: " + type(exc).__name__ + ": " + str(exc)[:120]

def read(path):
    with open(path, "rb") as fh:
        return fh.read(64)

def write(path):
    with open(path, "w") as fh:
        fh.write("pwned")
    return path

def connect(port):
    socket.create_connection(("127.0.0.1", port), timeout=3).close()
    return port

def environ(path):
    text = read_all(path)
    if T["canary"] in text:
        return "canary found"
    raise PermissionError("no server secrets in " + path)

def read_all(path):
    with open(path, "rb") as fh:
        return fh.read().decode(errors="replace")

attempt("secret_key", lambda: read(T["secret_key"]))
attempt("database", lambda: read(T["database"]))
attempt("other_workspace", lambda: os.listdir(T["other_workspace"]))
attempt("other_workspace_file", lambda: read(T["other_file"]))
attempt("proc_1_environ", lambda: environ("/proc/1/environ"))
attempt("server_environ", lambda: environ("/proc/%d/environ" % T["server_pid"]))
attempt("postgres", lambda: connect(5432))
attempt("redis", lambda: connect(6379))
attempt("write_home", lambda: write(T["write_home"]))
attempt("write_other_workspace", lambda: write(T["write_other"]))
attempt("write_tmp_host", lambda: write(T["write_tmp"]))
for name, outcome in sorted(results.items()):
    print(name + ": " + outcome)
allowed = sorted(n for n, o in results.items() if not o.startswith("refused"))
print("ATTACK-REPORT " + json.dumps({{"allowed": allowed, "refused": len(results) - len(allowed)}}))
"""


@pytest.fixture
def server_process():
    """A platform process with a secret in its environment (as a worker holds DATABASE_URL)."""
    import subprocess

    proc = subprocess.Popen(["sleep", "120"], env={"PATH": "/usr/bin:/bin", "TETHER_CANARY": CANARY})
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def targets(tmp_path, other_user, make_instance, server_process):
    """What an attacker aims at: real files and services of this server; the canary in its environment."""
    home = settings.TETHER_HOME
    database = settings.DATABASES["default"]["NAME"]
    other = make_instance(other_user, name="theirs")
    other_ws = other.workspace_path()
    other_ws.mkdir(parents=True, exist_ok=True)
    (other_ws / "notes.txt").write_text("their private notes\n")
    host_tmp = tmp_path / "host-tmp"
    host_tmp.mkdir()
    found = {
        "secret_key": str(home / "secret_key"),
        "database": str(database),
        "other_workspace": str(other_ws),
        "other_file": str(other_ws / "notes.txt"),
        "server_pid": server_process.pid,
        "write_home": str(home / "pwned"),
        "write_other": str(other_ws / "pwned"),
        "write_tmp": str(host_tmp / "pwned"),
        "canary": CANARY,
    }
    for written in ("write_home", "write_other", "write_tmp"):
        if os.path.exists(found[written]):
            os.unlink(found[written])  # left by an earlier run against an unsandboxed build
    # From the server itself every target is there: the sandbox is what stops the attacks.
    from django.db import connection

    assert (home / "secret_key").exists() and (other_ws / "notes.txt").exists()
    assert connection.vendor != "sqlite" or os.path.exists(database)  # on PostgreSQL: the port below
    assert CANARY in open(f"/proc/{server_process.pid}/environ", "rb").read().decode(errors="replace")
    socket.create_connection(("127.0.0.1", 5432), timeout=3).close()
    return found


def attack_script(found):
    return ATTACK.format(targets=json.dumps(found))


def report_in(run):
    """Return the attack report the run recorded (in its events or its iterations' check results)."""
    from loops.models import Iteration

    recorded = [e.data for e in Event.objects.filter(run=run).order_by("seq")]
    recorded += [i.checks for i in Iteration.objects.filter(run=run)]
    for data in recorded:
        blob = json.dumps(data)
        if "ATTACK-REPORT {" in blob:
            raw = json.loads(blob)
            stack = [raw]
            while stack:
                item = stack.pop()
                if isinstance(item, str) and "ATTACK-REPORT {" in item:
                    return json.JSONDecoder().raw_decode("{" + item.split("ATTACK-REPORT {", 1)[1])[0]
                if isinstance(item, dict):
                    stack.extend(item.values())
                elif isinstance(item, list):
                    stack.extend(item)
    raise AssertionError("the run recorded no attack report: " + json.dumps(recorded)[-3000:])


def assert_all_refused(report, found):
    assert report == {"allowed": [], "refused": 11}
    for path in ("write_home", "write_other", "write_tmp"):
        assert not os.path.exists(found[path]), f"{path} was written on the host"
    assert open(found["other_file"]).read() == "their private notes\n"


def test_a_command_brain_act_reaches_nothing_of_the_platform(user, make_instance, script, targets):
    agent = script(attack_script(targets))
    inst = make_instance(user, command=agent, checks=[], max_iterations=1)
    from loops import services

    run = drive_in_thread(services.run_start(instance=inst, user=user, objective="look around"))
    assert_all_refused(report_in(run), targets)


def test_a_check_reaches_nothing_of_the_platform(user, make_instance, script, targets):
    check = script(attack_script(targets))
    inst = make_instance(user, command=["true"], checks=[{"name": "evil", "command": check, "required": True}],
                         max_iterations=1)
    from loops import services

    run = drive_in_thread(services.run_start(instance=inst, user=user, objective="check"))
    assert_all_refused(report_in(run), targets)


def test_run_command_reaches_nothing_of_the_platform(user, make_instance, targets, price):
    from instances.models import Credential
    from loops import services

    credential = Credential.create_for(user, label="mine", secret=KEY)
    with MessagesServer(api_key=KEY) as server:
        inst = make_instance(
            user, brain="anthropic", decider="checks", base_url=server.url, credential=credential,
            model="claude-test-1", tools=["write_file", "run_command"], command=[], checks=[], max_iterations=1,
        )
        server.enqueue(
            tool_uses([("write_file", {"path": "look.py", "content": attack_script(targets)})], say="Writing."),
            tool_use("run_command", {"argv": ["python3", "look.py"]}),
            text("Looked around."),
        )
        run = drive_in_thread(services.run_start(instance=inst, user=user, objective="look around"))
    assert_all_refused(report_in(run), targets)


def test_a_fork_bomb_is_held_to_the_instance_process_limit(user, make_instance, script, settings):
    if os.geteuid() != 0:
        pytest.skip("per-instance process limits apply when Tether runs as root (its own uid per instance)")
    settings.TETHER_SANDBOX_MAX_PROCESSES = 16
    from instances.brains import process
    from instances.sandbox import Spec

    inst = make_instance(user)
    workspace = inst.workspace_path()
    workspace.mkdir(parents=True, exist_ok=True)
    bomb = "import os, sys\nmade = 0\ntry:\n    for _ in range(64):\n        if os.fork() == 0:\n            import time; time.sleep(5); os._exit(0)\n        made += 1\nexcept OSError as exc:\n    print('stopped at', made, type(exc).__name__)\n"
    (workspace / "bomb.py").write_text(bomb)
    done = process.run(["python3", "bomb.py"], cwd=workspace, env=process.base_env(workspace), timeout=30,
                       spec=Spec(workspace=workspace, instance_id=inst.pk))
    assert done.sandboxed and "stopped at" in done.stdout, (done.stdout, done.stderr)
    assert int(done.stdout.split()[2]) < 16


def test_a_memory_hog_is_held_to_the_address_space_limit(user, make_instance, settings):
    settings.TETHER_SANDBOX_MEMORY_MB = 256
    from instances.brains import process
    from instances.sandbox import Spec

    inst = make_instance(user)
    workspace = inst.workspace_path()
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "hog.py").write_text("try:\n    b = bytearray(1024 * 1024 * 1024)\n    print('got 1 GiB')\nexcept MemoryError:\n    print('refused memory')\n")
    done = process.run(["python3", "hog.py"], cwd=workspace, env=process.base_env(workspace), timeout=30,
                       spec=Spec(workspace=workspace, instance_id=inst.pk))
    assert done.sandboxed and "refused memory" in done.stdout, (done.stdout, done.stderr)


def test_sandbox_off_is_loud_and_explicit(settings, client, user):
    from instances import sandbox

    settings.TETHER_SANDBOX = "off"
    assert "unsandboxed" in sandbox.warning()
    client.force_login(user)
    page = client.get("/")
    assert "TETHER_SANDBOX=off" in page.content.decode()
    settings.TETHER_SANDBOX = "bwrap"
    assert sandbox.warning() == ""
    assert "TETHER_SANDBOX=off" not in client.get("/").content.decode()



NET_PROBE = """
import json, socket, sys
seen = {}
for name, host, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((host, port), timeout=3).close()
        seen[name] = "reached"
    except OSError as exc:
        seen[name] = "refused " + type(exc).__name__
print(json.dumps(seen))
"""


def probe_network(instance, targets):
    import json

    from instances.brains import process
    from instances.sandbox import Spec

    workspace = instance.workspace_path()
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "net.py").write_text(NET_PROBE)
    done = process.run(["python3", "net.py", json.dumps(targets)], cwd=workspace, env=process.base_env(workspace),
                       timeout=60, spec=Spec(workspace=workspace, instance_id=instance.pk, network=instance.network))
    assert done.sandboxed and done.exit_code == 0, (done.stdout, done.stderr, done.spawn_error)
    return json.loads(done.stdout)


@pytest.fixture
def listener():
    """A server listening on every address of this machine, as a database with `listen_addresses='*'` does."""
    import socket

    server = socket.create_server(("0.0.0.0", 0))
    yield server.getsockname()[1]
    server.close()


def this_machines_addresses():
    import ipaddress

    from instances.sandbox import _this_machines_networks

    return [str(n.network_address) for n in map(ipaddress.ip_network, _this_machines_networks())
            if n.prefixlen == 32 and not n.network_address.is_loopback]


def forbidden(port):
    found = [("loopback", "127.0.0.1", port), ("slirp_gateway", "10.0.2.2", port), ("metadata", "169.254.169.254", 80)]
    found += [(f"own {address}", address, port) for address in this_machines_addresses()]
    return found


def test_without_a_network_grant_a_program_reaches_no_network(user, make_instance, listener):
    seen = probe_network(make_instance(user, network=False), [("outside", "10.0.2.3", 53), *forbidden(listener)])
    assert all(outcome.startswith("refused") for outcome in seen.values()), seen


def test_with_a_network_grant_a_program_gets_out_but_never_to_this_machine(user, make_instance, listener):
    """Egress is the outside world: not this machine's loopback, nor its other addresses (a server
    listening on all of them), nor the slirp gateway, nor link-local metadata."""
    seen = probe_network(make_instance(user, network=True), [("outside", "10.0.2.3", 53), *forbidden(listener)])
    assert seen.pop("outside") == "reached", seen  # the user-mode network's resolver: a route out exists
    assert seen and all(outcome.startswith("refused") for outcome in seen.values()), seen


def test_the_egress_firewall_refuses_every_address_of_this_machine_and_every_private_range():
    import ipaddress
    import re

    from instances import sandbox

    rules = sandbox.egress_rules()
    denied = [ipaddress.ip_network(n) for n in re.search(r"ip daddr \{ ([^}]*) \} meta l4proto tcp reject", rules)[1].split(", ")]
    must = ["10.0.2.2", "10.1.2.3", "172.17.0.1", "192.168.1.1", "169.254.169.254", "127.0.0.1", "100.64.0.1",
            *this_machines_addresses()]
    for address in must:
        assert any(ipaddress.ip_address(address) in net for net in denied), (address, rules)
    assert not any(ipaddress.ip_address("1.1.1.1") in net for net in denied)
    assert "meta nfproto ipv6 reject" in rules


def test_without_nftables_egress_is_refused_with_how_to_fix_it(user, make_instance, monkeypatch):
    from instances.brains import process
    from instances.sandbox import Spec

    inst = make_instance(user, network=True)
    workspace = inst.workspace_path()
    workspace.mkdir(parents=True, exist_ok=True)
    real_which, real_access = shutil.which, os.access
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "nft" else real_which(name, *a, **k))
    monkeypatch.setattr(os, "access", lambda path, mode: not str(path).endswith("/nft") and real_access(path, mode))
    done = process.run(["true"], cwd=workspace, env=process.base_env(workspace), timeout=30,
                       spec=Spec(workspace=workspace, instance_id=inst.pk, network=True))
    assert "apt-get install nftables" in done.spawn_error, done


def test_without_bubblewrap_a_run_that_starts_programs_is_refused_with_how_to_fix_it(user, make_instance, monkeypatch):
    from instances import sandbox
    from loops import services
    from loops.models import Run

    inst = make_instance(user, command=["true"])
    monkeypatch.setenv("PATH", "/nonexistent")
    sandbox._probe.cache_clear()
    try:
        with pytest.raises(services.Refused, match="apt-get install bubblewrap"):
            services.run_start(instance=inst, user=user, objective="anything")
    finally:
        monkeypatch.undo()
        sandbox._probe.cache_clear()
    assert not Run.objects.exists()


def test_a_workspace_swapped_for_a_symlink_after_it_was_allowed_is_refused(user, script):
    """Instance B's workspace is a directory inside instance A's; A's agent swaps it for a symlink
    to TETHER_HOME. B's next run must not mount, chown or read what the symlink points at."""
    import shutil

    from instances import capabilities
    from instances.models import Instance
    from loops import services

    a = Instance.objects.create(owner=user, name="a", command=["true"])  # the default workspace, in ada's area
    inside = a.workspace_path() / "sub"
    if inside.is_symlink():
        inside.unlink()
    shutil.rmtree(inside, ignore_errors=True)
    inside.mkdir(parents=True)
    peek = script(f"print(open({str(settings.TETHER_HOME / 'secret_key')!r}).read())")
    b = Instance.objects.create(owner=user, name="b", command=peek, checks=[], workspace=str(inside), max_iterations=1)
    assert capabilities.check_workspace(user, str(inside)) == inside.resolve()  # allowed when it was saved
    inside.rmdir()
    inside.symlink_to(settings.TETHER_HOME)  # what A's agent can do inside its own workspace
    owner_before = os.stat(settings.TETHER_HOME / "secret_key").st_uid
    try:
        run = drive_in_thread(services.run_start(instance=b, user=user, objective="peek"))
    finally:
        inside.unlink()

    assert run.outcome == "failed" and "symlink" in run.outcome_detail, run.outcome_detail
    secret = (settings.TETHER_HOME / "secret_key").read_text().strip()
    assert secret not in json.dumps([e.data for e in Event.objects.filter(run=run)])
    assert os.stat(settings.TETHER_HOME / "secret_key").st_uid == owner_before  # nothing was chowned


def test_run_command_refuses_a_workspace_reached_through_a_symlink_in_the_workspaces_area():
    from instances import sandbox
    from instances.tools.shell import CommandRefused, run_command

    area = settings.TETHER_WORKSPACES / "9999"
    area.mkdir(parents=True, exist_ok=True)
    link = area / "sneaky"
    if link.is_symlink():
        link.unlink()
    link.symlink_to("/")
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="symlink"):
            sandbox.checked_workspace(link / "etc")
        with pytest.raises(CommandRefused, match="symlink"):
            run_command(["ls"], workspace=link, timeout=5)
        assert sandbox.checked_workspace(area) == area.resolve()
    finally:
        link.unlink()


def test_a_program_has_a_private_tmp_it_can_write(tmp_path):
    """Tools need a /tmp (pytest's tmp_path, compilers, py_compile): the sandbox's own, writable by its uid."""
    from instances import sandbox
    from instances.brains import process

    workspace = tmp_path / "ws"
    workspace.mkdir()
    marker = f"tether-private-tmp-{os.getpid()}"
    probe = f"import os, tempfile\nopen('/tmp/{marker}', 'w').write('x')\nprint(tempfile.mkdtemp(), oct(os.stat('/tmp').st_mode))"
    done = process.run(["python3", "-c", probe], cwd=workspace, env=process.base_env(workspace), timeout=30,
                       spec=sandbox.Spec(workspace=workspace, instance_id=7))
    assert done.exit_code == 0, done.stderr
    assert done.stdout.strip().endswith("0o41777")
    assert not os.path.exists(f"/tmp/{marker}")  # its /tmp, not the host's
