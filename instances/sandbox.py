"""The sandbox: how every program an agent or a user supplies is launched.

Acts of the `command` brain, checks, the Claude brain's `run_command` tool and grader
commands all start here. `prepare` turns an argv into the argv, keyword arguments and file
descriptors for `subprocess.Popen` that run it under bubblewrap:

- its own user, PID, IPC, UTS, cgroup and network namespaces (`--unshare-all`); no network
  at all unless the instance was granted egress, and even then its loopback is its own, so
  nothing on this machine's 127.0.0.1 (PostgreSQL, Redis, Tether itself) is reachable, and a
  firewall in its namespace refuses this machine's other addresses, the networks it is attached
  to, private and link-local ranges (cloud metadata) — egress means the outside world only;
- a root of its own: the system (`/usr`, a few files of `/etc`, the Python Tether runs on)
  read-only, a private `/tmp`, a private `/proc`, minimal `/dev`, and the workspace as the
  only writable host directory — never `TETHER_HOME`, the database, the secret key or
  another workspace;
- no environment but what the caller passes (the caller passes a scrubbed one);
- resource limits: address space, file size, open files and, when Tether runs as root,
  processes (each instance's programs run as their own unprivileged uid, `TETHER_SANDBOX_UID_BASE`
  + the instance id, so a fork bomb exhausts only its own allowance and one instance
  cannot read another's files).

Run as root, bubblewrap mounts with root's view of the files (so a workspace under a 0700
`TETHER_HOME` needs no traversable parent) and the program then drops to the instance's uid
with no capabilities; run as another user, bubblewrap uses an unprivileged user namespace.

There is no silent fallback: when bubblewrap cannot run, `prepare` raises
`SandboxUnavailable` saying how to fix it. `TETHER_SANDBOX=off` (a single-user development
install only) runs programs unsandboxed, and every page and `serve` say so.

No database access; reads settings; may `chown` a workspace tree to its sandbox uid.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from instances import bytecode, pinned
from instances.pinned import Pinned

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) so programs run sandboxed, "
    "or, for a single-user development install only, set TETHER_SANDBOX=off"
)
# What of /etc a program may need: name lookup, certificates, the dynamic loader, time zones.
ETC_FILES = (
    "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/hosts", "/etc/host.conf",
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives",
    "/etc/ssl", "/etc/ca-certificates", "/etc/mime.types", "/etc/gitconfig", "/etc/python3", "/etc/python3.11",
)
SLIRP_DNS = "10.0.2.3"  # slirp4netns's built-in resolver, as the sandbox sees it
# What a program granted egress may never reach, whatever this machine's own networks are:
# "this network", private ranges, shared address space, loopback, link-local (cloud metadata),
# IETF protocol assignments, benchmarking, multicast and reserved.
EGRESS_DENIED = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/3",
)
MERGED_USR = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SCRATCH = "/run/tether"


class SandboxUnavailable(Exception):
    """The sandbox cannot be set up here; the message says how to fix it."""


class WorkspaceRefused(SandboxUnavailable):
    """A workspace that now leads somewhere no program may be given (the message says where and why)."""


@dataclass(frozen=True)
class Bind:
    source: Path
    dest: str
    writable: bool = False


@dataclass
class Spec:
    """Where and as whom one program runs."""

    workspace: Path
    instance_id: int | None = None
    network: bool = False
    binds: list[Bind] = field(default_factory=list)


@dataclass
class Launch:
    """What `subprocess.Popen` needs to start the program, and whether it is sandboxed.

    `held` are the directories the sandbox mounts, held open until `close()`: bubblewrap mounts
    the descriptor (`--bind-fd`, passed in `kwargs`), or for a starter that cannot pass
    descriptors, the `/proc/<pid>/fd/<n>` link naming it; either way what was checked is what
    is mounted, whatever was swapped on its path since.
    """

    argv: list[str]
    cwd: Path
    kwargs: dict[str, Any]
    sandboxed: bool
    held: list[Any] = field(default_factory=list)

    def close(self) -> None:
        """Let the held directories go (once the program has started and bubblewrap has them)."""
        for pinned_dir in self.held:
            pinned_dir.close()
        self.held.clear()


def mode() -> str:
    """Return "bwrap" or "off" (`TETHER_SANDBOX`)."""
    return "off" if str(settings.TETHER_SANDBOX).lower() == "off" else "bwrap"


def enabled() -> bool:
    return mode() == "bwrap"


@functools.cache
def _probe() -> str:
    """Return "" when bubblewrap can build a sandbox here, else why it cannot."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    if shutil.which("prlimit") is None:
        return "prlimit (util-linux) is not installed"
    if shutil.which("setpriv") is None and os.geteuid() == 0:
        return "setpriv (util-linux) is not installed"
    probe = Path(tempfile.mkdtemp(prefix="tether-sandbox-probe-"))
    try:
        launch = prepare(["true"], Spec(workspace=probe), _probing=True)
        try:
            done = subprocess.run(
                launch.argv, capture_output=True, timeout=15, env={"PATH": "/usr/bin:/bin"}, cwd="/", **launch.kwargs
            )
        finally:
            launch.close()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap could not start: {exc}"
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    if done.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {done.stderr.decode(errors='replace').strip()[:300]}"
    return ""


def problem() -> str:
    """Return "" when programs can run (sandboxed, or the sandbox is off), else what is wrong and how to fix it."""
    if not enabled():
        return ""
    reason = _probe()
    return f"{reason}; {INSTALL_HINT}" if reason else ""


def runs_programs(instance: Any) -> bool:
    """Return whether an instance starts programs (a command brain, checks or the run_command tool)."""
    return bool(
        instance.brain == "command" or instance.checks or "run_command" in (instance.tools or [])
    )


def ensure() -> None:
    """Raise SandboxUnavailable when programs cannot run sandboxed here."""
    if reason := problem():
        raise SandboxUnavailable(f"the sandbox is unavailable: {reason}")


def _uid(instance_id: int | None) -> int | None:
    """Return the uid an instance's programs run as, or None to keep the server's own."""
    if os.geteuid() != 0:
        return None
    return int(settings.TETHER_SANDBOX_UID_BASE) + (instance_id or 0) % 1_000_000


def programs() -> list[Path]:
    """Return the operator's directories of programs (agent CLIs, scripts) every sandbox sees read-only."""
    value = settings.TETHER_SANDBOX_PROGRAMS
    if isinstance(value, str):
        value = value.split(":")
    return [Path(p).resolve() for p in value if str(p).strip()]


def _merged_usr_links() -> list[str]:
    args: list[str] = []
    for path in MERGED_USR:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
    return args


def give_to(directory: Pinned, uid: int | None) -> None:
    """Make the held `directory` (a tree) owned by `uid`, so the sandbox user can write what the server wrote.

    Through its descriptor, one component at a time, never through a link (`pinned.chown_tree`).
    """
    if uid is not None:
        pinned.chown_tree(directory.fd, uid)


def _dirs_for(dests: list[str], bound: set[str]) -> list[str]:
    """Return `--perms 0755 --dir` arguments making each destination's parents traversable.

    bubblewrap copies a missing parent's mode from the host (`/root` would stay 0700 inside),
    which would hide a bound Python under it from the sandbox user.
    """
    made: set[str] = set()
    args: list[str] = []
    for dest in dests:
        parent = Path(dest).parent
        for ancestor in reversed([parent, *parent.parents]):
            name = str(ancestor)
            if name == "/" or name in made or any(name == b or name.startswith(b + "/") for b in bound):
                continue
            made.add(name)
            args += ["--perms", "1777", "--dir", name]
    return args


def checked_workspace(path: Path, *, instance_id: int | None = None) -> Path:
    """Return a workspace's real path; raise WorkspaceRefused if it no longer leads where it was allowed to.

    A workspace was checked when its instance was saved, but a program of another instance
    can later swap a directory on its path for a symlink (to `TETHER_HOME`, another user's
    workspace, `/`). So the path is walked again before anything is mounted, chowned or read:
    a symlink inside the workspaces area or an operator's workspace root (where agents write)
    is refused, and so is a real path that is `/` or holds Tether's own files. With the
    `instance_id` whose workspace it is, it must also still nest with no other instance's
    (`validation.workspace_conflict`: one read of the instances' workspaces).
    """
    areas = [Path(settings.TETHER_WORKSPACES).resolve(), *(Path(r).resolve() for r in settings.TETHER_WORKSPACE_ROOTS)]
    current = Path("/")
    for part in Path(os.path.abspath(path)).parts[1:]:
        step = current / part
        # One look at each component decides it: a directory is kept by its name (what is then
        # opened below it never follows a link), a link is followed only outside the areas. Asking
        # "is it a link?" and then resolving it would be two looks, and a swap between them would
        # be followed.
        try:
            is_link = stat.S_ISLNK(os.lstat(step).st_mode)
        except FileNotFoundError:
            is_link = False  # not made yet: the rest of the path is names only
        if is_link and any(current.is_relative_to(a) for a in areas):
            raise WorkspaceRefused(
                f"workspace {path} passes through a symlink at {step} (an agent's program could have made it); "
                "refused: replace it with a directory or choose another workspace"
            )
        current = step.resolve() if is_link else step
    home, workspaces = Path(settings.TETHER_HOME).resolve(), areas[0]
    exposes = current == Path("/") or home.is_relative_to(current) or (
        current.is_relative_to(home) and not current.is_relative_to(workspaces)
    )
    if exposes:
        raise WorkspaceRefused(f"workspace {path} leads to {current}, which would expose Tether's own files; refused")
    if instance_id is not None:
        from instances import validation  # lazy: validation imports the tools, which import this module

        if why := validation.workspace_conflict(path, instance_id=instance_id):
            raise WorkspaceRefused(f"{why}; refused")
    return current


@contextlib.contextmanager
def workspace_files(workspace: Path) -> Iterator[Iterator[pinned.Entry] | None]:
    """Hold `workspace` open, checked and pinned, and give its walk's entries but directories; None if it cannot be.

    The walk skips `pinned.SKIP_DIRS`; a link is an entry of its own, never followed.
    """
    try:
        ws: Pinned | None = Pinned(checked_workspace(workspace))
    except (WorkspaceRefused, OSError):
        ws = None
    if ws is None:
        yield None
        return
    with ws:
        yield (entry for entry in ws.walk(skip=pinned.SKIP_DIRS) if entry.kind != "dir")


def prepare(
    argv: list[str], spec: Spec, *, cwd: Path | None = None, _probing: bool = False, _net: tuple[int, ...] = (),
    passes_fds: bool = True,
) -> Launch:
    """Return how to launch `argv` for `spec`; raise SandboxUnavailable when it cannot be sandboxed.

    The caller starts it, then calls `launch.close()`. `passes_fds=False` is for a starter that
    cannot pass descriptors (the MCP SDK's): it must keep the launch open until the program ends.
    """
    workspace = spec.workspace.resolve() if _probing else checked_workspace(spec.workspace)
    if not enabled():
        return Launch(list(argv), cwd or workspace, {"start_new_session": True}, sandboxed=False)
    if not _probing:
        ensure()
    uid = _uid(spec.instance_id)
    launch = Launch([], Path("/"), {"start_new_session": True}, sandboxed=True)
    try:
        return _prepare(launch, argv, spec, workspace, uid, cwd, _net, passes_fds)
    except BaseException:
        launch.close()
        raise


def _prepare(
    launch: Launch, argv: list[str], spec: Spec, workspace: Path, uid: int | None, cwd: Path | None,
    _net: tuple[int, ...], passes_fds: bool,
) -> Launch:
    """Fill `launch` in: what it holds open, then bubblewrap's namespaces, mounts and user, the limits."""
    sources = _hold_sources(launch, spec, workspace, uid, passes_fds)
    inner = cwd.resolve() if cwd is not None else workspace
    args = _namespaces(uid, _net)
    args += _mounts(spec, workspace, sources, passes_fds)
    args += ["--chdir", str(inner), "--"]
    if uid is None:
        args.insert(1, "--disable-userns")  # no user namespace of its own inside (a kernel surface less)
    else:
        args += _as_instance_user(uid, inner)
    launch.argv = [*_limits(uid), "--", *args, *argv]
    if passes_fds:
        launch.kwargs["pass_fds"] = tuple(held.fd for held in launch.held)
    return launch


def _hold_sources(launch: Launch, spec: Spec, workspace: Path, uid: int | None, passes_fds: bool) -> dict[str, str]:
    """Hold the workspace and each bind's source open (the writable ones given to `uid`); return how
    bubblewrap names each, by its path."""

    def hold(source: Path) -> str:
        """Hold `source` open (never through a link) for the sandbox; return how bubblewrap names it.

        A directory is walked to from `/`; a file bound alone (the gateway's socket, which the
        server made) is held as a path descriptor.
        """
        if source.is_dir():
            held = Pinned(source)
        else:
            held = Pinned(source, fd=os.open(source, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC))
        launch.held.append(held)
        return str(held.fd) if passes_fds else f"/proc/{os.getpid()}/fd/{held.fd}"

    sources = {str(workspace): hold(workspace)}
    give_to(launch.held[0], uid)
    for extra in spec.binds:
        sources[str(extra.source)] = hold(extra.source.resolve())
        if extra.writable:
            give_to(launch.held[-1], uid)
    return sources


def _namespaces(uid: int | None, _net: tuple[int, ...]) -> list[str]:
    """Return bubblewrap and its namespaces (with egress: the descriptors slirp4netns sets it up by)."""
    if uid is None:
        # Not root: an unprivileged user namespace; the program keeps the server's uid outside it.
        args = ["bwrap", "--unshare-all", "--uid", "65534", "--gid", "65534"]
    else:
        # Root: bubblewrap sets the namespaces up with root's view of the files (no user
        # namespace), then the program drops to the instance's own uid with no capabilities.
        args = ["bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--unshare-net",
                "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    args += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if _net:
        # Egress: the program waits (--block-fd) until slirp4netns has given its namespace a route out.
        info, block, resolv = _net
        args += ["--info-fd", str(info), "--block-fd", str(block), "--ro-bind-data", str(resolv), "/etc/resolv.conf"]
    return args


def _mounts(spec: Spec, workspace: Path, sources: dict[str, str], passes_fds: bool) -> list[str]:
    """Return bubblewrap's mounts: the system read-only, a /tmp of its own, the bytecode, the binds."""
    bind, ro_bind = ("--bind-fd", "--ro-bind-fd") if passes_fds else ("--bind", "--ro-bind")
    readonly = ["/usr"]
    readonly += [p for p in MERGED_USR if os.path.isdir(p) and not os.path.islink(p)]
    readonly += [p for p in ETC_FILES if os.path.exists(p)]
    prefixes = [sys.base_prefix, sys.prefix, str(Path(sys.executable).resolve().parent.parent)]
    readonly += [p for p in dict.fromkeys(prefixes) if os.path.isdir(p) and not p.startswith("/usr/")]
    readonly += [str(p) for p in programs() if p.is_dir()]
    writable = [(str(workspace), str(workspace))]
    writable += [(str(b.source), b.dest) for b in spec.binds if b.writable]
    extra_ro = [(str(b.source), b.dest) for b in spec.binds if not b.writable]
    # /tmp is the program's own, and writable by it (sticky, as a system's /tmp is): bubblewrap
    # would make it 0755 and root's, which the instance's uid cannot write.
    args = ["--proc", "/proc", "--dev", "/dev", "--size", str(int(settings.TETHER_SANDBOX_TMP_MB) << 20),
            "--perms", "1777", "--tmpfs", "/tmp"]
    dests = readonly + [d for _, d in writable + extra_ro]
    args += _dirs_for(sorted(dests), {"/usr", "/proc", "/dev"})
    for path in readonly:
        args += ["--ro-bind", path, path]
    args += _bytecode_mounts()
    args += _merged_usr_links()
    for source, dest in writable:
        args += [bind, sources[source], dest]
    for source, dest in extra_ro:
        args += [ro_bind, sources[source], dest]
    return args


def _bytecode_mounts() -> list[str]:
    """The interpreter's bytecode, compiled once by the server (instances.bytecode): read-only, under
    a cache directory the program can still write for its own modules."""
    cached = bytecode.mounts()
    if not cached:
        return []
    args = ["--perms", "1777", "--dir", bytecode.PREFIX_SEEN]
    below = {str(a) for _, dest in cached for a in Path(dest).parents
             if str(a).startswith(bytecode.PREFIX_SEEN + "/")}
    # Writable and sticky like /tmp: the workspace's own bytecode may belong beside a mount (a
    # workspace in the checkout that holds the virtualenv, as `make run` has them).
    for name in sorted(below):
        args += ["--perms", "1777", "--dir", name]
    for source, dest in cached:
        args += ["--ro-bind", source, dest]
    return args


def _as_instance_user(uid: int, inner: Path) -> list[str]:
    """Return how root mode drops to the instance's uid, with no capabilities, in a user namespace of its own."""
    args = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--pdeathsig=KILL", "--"]
    # A user namespace of its own, mapping the instance's uid to itself, in which no other can
    # be made: the program cannot `unshare -U` its way to a kernel surface root mode leaves open.
    args += ["bwrap", "--unshare-user", "--disable-userns", "--uid", str(uid), "--gid", str(uid),
             "--die-with-parent", "--dev-bind", "/", "/", "--chdir", str(inner), "--"]
    return args


def _limits(uid: int | None) -> list[str]:
    """Return the resource limits the sandbox starts under (processes counted per uid: root mode only)."""
    limits = [
        "prlimit",
        f"--as={int(settings.TETHER_SANDBOX_MEMORY_MB) << 20}",
        f"--fsize={int(settings.TETHER_SANDBOX_FILE_MB) << 20}",
        "--nofile=1024",
        "--core=0",
    ]
    if uid is not None:
        limits.append(f"--nproc={int(settings.TETHER_SANDBOX_MAX_PROCESSES)}")
    return limits


def spawn(argv: list[str], spec: Spec, *, cwd: Path | None = None, **popen_kwargs: Any) -> tuple[
    subprocess.Popen[bytes], bool
]:
    """Start `argv` under `spec`; return the process (in a session of its own) and whether it is sandboxed.

    Without a network grant the program's network namespace has only its own loopback. With
    one, slirp4netns (user-mode networking, `--disable-host-loopback`) gives it a route out, and
    `egress_rules` fence it off this machine and its networks before it starts; the route lives
    exactly as long as the sandbox.
    """
    if not (spec.network and enabled()):
        launch = prepare(argv, spec, cwd=cwd)
        try:
            return subprocess.Popen(launch.argv, cwd=launch.cwd, **launch.kwargs, **popen_kwargs), launch.sandboxed
        finally:
            launch.close()  # the child has its own copies of the held directories
    slirp = shutil.which("slirp4netns")
    if slirp is None:
        raise SandboxUnavailable(
            "network egress needs slirp4netns (Debian/Ubuntu: apt-get install slirp4netns); "
            "or turn the instance's network grant off"
        )
    _nft()
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    resolv_r, resolv_w = os.pipe()
    exit_r, exit_w = os.pipe()  # held open by the sandbox; slirp4netns exits once the last holder is gone
    ready_r, ready_w = os.pipe()
    open_fds = {info_r, info_w, block_r, block_w, resolv_r, resolv_w, exit_r, exit_w, ready_r, ready_w}

    def close(*fds: int) -> None:
        for fd in fds:
            if fd in open_fds:
                open_fds.discard(fd)
                os.close(fd)

    try:
        os.write(resolv_w, f"nameserver {SLIRP_DNS}\n".encode())
        close(resolv_w)
        launch = prepare(argv, spec, cwd=cwd, _net=(info_w, block_r, resolv_r))
        kwargs = {**launch.kwargs, "pass_fds": (*launch.kwargs.get("pass_fds", ()), info_w, block_r, resolv_r, exit_w)}
        try:
            proc = subprocess.Popen(launch.argv, cwd=launch.cwd, **kwargs, **popen_kwargs)
        finally:
            launch.close()
        close(info_w, block_r, resolv_r, exit_w)
        try:
            child = _child_pid(info_r)
            _await_block(child)
            userns = [] if os.geteuid() == 0 else [f"--userns-path=/proc/{child}/ns/user"]
            subprocess.Popen(
                [slirp, "--configure", "--mtu=65520", "--disable-host-loopback", "--exit-fd", str(exit_r),
                 "--ready-fd", str(ready_w), *userns, str(child), "tap0"],
                pass_fds=(exit_r, ready_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True,
            )
            close(exit_r, ready_w)
            if os.read(ready_r, 1) != b"1":
                raise SandboxUnavailable("slirp4netns could not give the sandbox its network")
            _fence(child)
            os.write(block_w, b"go")
        except (OSError, SandboxUnavailable):
            proc.kill()
            proc.wait()
            raise
    finally:
        close(*list(open_fds))
    return proc, True


def egress_rules() -> str:
    """The nftables ruleset of a sandbox granted egress: out to the world, never to this machine.

    slirp4netns opens the program's connections from this machine's own network stack, so any
    address that stack can reach would be reachable: its other addresses (a database listening
    on all interfaces), the networks it is attached to, and private or link-local ranges (another
    machine's services, a cloud's metadata endpoint). Only slirp4netns's resolver is let through
    of its virtual network; IPv6 has no route out at all.
    """
    nets = {ipaddress.IPv4Network(n) for n in (*EGRESS_DENIED, *_this_machines_networks())}
    denied = [str(n) for n in ipaddress.collapse_addresses(nets)]  # no overlaps: nft refuses them in a set
    return (
        "table inet tether_egress {\n"
        "  chain out {\n"
        "    type filter hook output priority 0; policy accept;\n"
        '    oif "lo" accept\n'
        f"    ip daddr {SLIRP_DNS} meta l4proto {{ tcp, udp }} th dport 53 accept\n"
        f"    ip daddr {{ {', '.join(denied)} }} meta l4proto tcp reject with tcp reset\n"
        f"    ip daddr {{ {', '.join(denied)} }} reject with icmpx type admin-prohibited\n"
        "    meta nfproto ipv6 reject with icmpx type admin-prohibited\n"
        "  }\n"
        "}\n"
    )


def _this_machines_networks() -> list[str]:
    """Every IPv4 address of this machine (as /32) and every network it is directly attached to."""
    found: set[str] = set()
    try:
        trie = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        trie = []
    for before, line in zip(trie, trie[1:], strict=False):
        if "/32 host LOCAL" in line and "|--" in before:
            found.add(before.split("|--")[1].strip() + "/32")
    try:
        routes = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        routes = []
    for line in routes:
        fields = line.split()
        if len(fields) > 7 and fields[2] == "00000000" and fields[1] != "00000000":
            net, mask = (int(fields[i], 16).to_bytes(4, "little") for i in (1, 7))
            bits = bin(int.from_bytes(mask, "big")).count("1")
            found.add(f"{'.'.join(map(str, net))}/{bits}")
    return sorted(found)


def _fence(pid: int) -> None:
    """Load `egress_rules` into the network namespace of the sandbox whose first process is `pid`.

    Done from outside, before the program is let go: inside, it has no capabilities to change them.
    """
    enter = ["nsenter", f"--net=/proc/{pid}/ns/net"]
    if os.geteuid() != 0:
        enter += [f"--user=/proc/{pid}/ns/user", "--preserve-credentials"]
    try:
        done = subprocess.run([*enter, "--", _nft(), "-f", "-"], input=egress_rules().encode(),
                              capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        raise SandboxUnavailable("the sandbox's egress firewall took over 10 s to load") from None
    if done.returncode != 0:
        raise SandboxUnavailable(
            "could not load the sandbox's egress firewall (nft: "
            + done.stderr.decode(errors="replace").strip()[:200] + "); or turn the instance's network grant off"
        )


def _nft() -> str:
    nft = shutil.which("nft") or next((p for p in ("/usr/sbin/nft", "/sbin/nft") if os.access(p, os.X_OK)), None)
    if nft is None:
        raise SandboxUnavailable(
            "network egress needs nftables to keep the sandbox off this machine's own networks "
            "(Debian/Ubuntu: apt-get install nftables); or turn the instance's network grant off"
        )
    return nft


def _await_block(pid: int, timeout: float = 5.0) -> None:
    """Wait until the sandbox's first process waits on --block-fd (its own loopback set up by then).

    slirp4netns configuring the namespace while bubblewrap still sets up its loopback makes
    bubblewrap fail, so the route out is added only once bubblewrap is done.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/wchan") as fh:
                if "pipe" in fh.read():
                    return
        except OSError:
            return  # gone: the caller finds out when it reads the ready pipe
        time.sleep(0.002)


def _child_pid(info: int) -> int:
    """Read the sandbox's child pid from bubblewrap's --info-fd (JSON)."""
    data = b""
    while b"}" not in data:
        chunk = os.read(info, 4096)
        if not chunk:
            raise SandboxUnavailable("bubblewrap exited before the sandbox was set up")
        data += chunk
    return int(json.loads(data[: data.index(b"}") + 1])["child-pid"])


def warning() -> str:
    """Return the warning every page and `serve` show while the sandbox is off, else ""."""
    if enabled():
        return ""
    return (
        "TETHER_SANDBOX=off: agents' programs run unsandboxed as the server's own user and can read its "
        "secrets. Use this only for a single-user development install."
    )


def context_processor(request: Any) -> dict[str, str]:
    """Put the sandbox-off warning on every page."""
    return {"sandbox_warning": warning()}
