"""Execute the ```python code blocks of Markdown files, so documentation cannot rot.

Each file's blocks run in order, in one namespace that is fresh for that file: a later
block sees the names an earlier block of the same file defined, and no file sees another
file's. Every file runs in its own interpreter (a subprocess) inside a fresh temporary
working directory, so module-level state (actor registries, settings caches, files such
as the default ``./taskq.db``) cannot leak between files either.

- A block fenced as ```python (or ```py / ```pycon is NOT treated as code) runs.
- A block fenced as ```python no-run is skipped (for fragments that cannot run alone).
- A block with a ``title="path/to/file.py"`` (how the site shows a file's name above its
  code) is also written to that file under the working directory, which is on
  ``sys.path``: a page can have the reader create ``myapp/actors.py`` and a later block
  (or a command the page shows, in a test of its own) import it. It then runs as any
  block does.
- Top-level ``await`` is allowed; all blocks of one file share one event loop.
- A failing block is reported loudly with the file, the block's first line and the
  traceback (line numbers are the Markdown file's); the run continues with the next
  file and exits 1 at the end if anything failed.

``--create-database URL`` (re)creates that Postgres database, migrates it to head with
``taskq migrate up``, and drops it when the run ends: docs that set no URL of their own
use ``TASKQ_DATABASE_URL`` (the nox ``docs`` session points it at that database).

Usage::

    python tools/run_doc_blocks.py README.md docs/*.md
    python tools/run_doc_blocks.py --create-database postgresql+psycopg://.../taskq_docs docs/x.md
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import inspect
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
TITLE = re.compile(r"""\btitle=(?P<q>["'])(?P<title>[^"']+)(?P=q)""")


@dataclass(frozen=True)
class Block:
    """One fenced code block: its first code line (1-based) and its source."""

    line: int
    info: str
    code: str

    @property
    def language(self) -> str:
        words = self.info.split()
        return words[0].lower() if words else ""

    @property
    def title(self) -> str | None:
        """The file the block is shown as (``title="..."`` in the fence), if any."""
        match = TITLE.search(self.info)
        return match["title"] if match else None

    @property
    def runnable(self) -> bool:
        return self.language in {"python", "py"} and "no-run" not in self.info.split()[1:]


def extract_blocks(text: str) -> list[Block]:
    """All fenced blocks of a Markdown text (CommonMark fences: ``` or ~~~, ≤3 spaces)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        fence, indent, info = match["fence"], len(match["indent"]), match["info"].strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = lines[j].strip()
            if (
                closing.startswith(fence[0] * len(fence))
                and set(closing) == {fence[0]}
                and len(lines[j]) - len(lines[j].lstrip(" ")) <= 3
            ):
                break
            line = lines[j]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))) :])
            j += 1
        blocks.append(Block(i + 2, info, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def write_titled(block: Block) -> None:
    """Write a titled block to its file under the working directory (see the module doc)."""
    title = block.title
    if title is None or not title.endswith(".py"):
        return
    target = Path.cwd() / title
    if Path(title).is_absolute() or ".." in Path(title).parts:
        raise ValueError(f"a block's title must be a relative path, got {title!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(block.code, encoding="utf-8")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))


def run_file(path: Path) -> int:
    """Run one file's python blocks in order in one namespace; return the failure count."""
    every = extract_blocks(path.read_text(encoding="utf-8"))
    blocks = [b for b in every if b.runnable]
    skipped = sum(1 for b in every if b.language in {"python", "py"} and not b.runnable)
    namespace: dict[str, object] = {"__name__": "__main__", "__file__": str(path)}
    loop = asyncio.new_event_loop()
    failures = 0
    try:
        for block in blocks:
            started = time.monotonic()
            try:
                write_titled(block)
                source = "\n" * (block.line - 1) + block.code
                code = compile(source, str(path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
                result = eval(code, namespace)
                if inspect.iscoroutine(result):
                    loop.run_until_complete(result)
            except BaseException:
                failures += 1
                print(f"FAILED {path}:{block.line} (```{block.info})", file=sys.stderr)
                traceback.print_exc()
                print("-" * 72, file=sys.stderr)
                break  # later blocks of this file build on this one
            else:
                print(f"ok     {path}:{block.line} ({time.monotonic() - started:.2f}s)", flush=True)
    finally:
        loop.close()
    print(
        f"{path}: {len(blocks)} runnable block(s), {skipped} no-run, {failures} failed", flush=True
    )
    return failures


@contextlib.contextmanager
def fresh_database(url: str) -> Iterator[None]:
    """Create and migrate a Postgres database for the run; drop it afterwards."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    target = make_url(url)
    name = target.database
    if not name or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise SystemExit(f"--create-database needs a plain database name, got {name!r}")
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")

    def _drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    _drop()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        migrate = [sys.executable, "-c", "from taskq.cli import main; main()"]
        subprocess.run([*migrate, "migrate", "up", "--database-url", url], check=True)
        yield
    finally:
        _drop()
        admin.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    """Run every given file in its own subprocess; exit 1 if any block failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--create-database", metavar="URL")
    parser.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.single:
        return 1 if run_file(args.files[0]) else 0

    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        print(f"no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        if args.create_database:
            stack.enter_context(fresh_database(args.create_database))
        failed: list[str] = []
        for path in args.files:
            with tempfile.TemporaryDirectory(prefix="taskq-docs-") as cwd:
                proc = subprocess.run(
                    [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "--single",
                        str(path.resolve()),
                    ],
                    cwd=cwd,
                    check=False,
                )
            if proc.returncode != 0:
                failed.append(str(path))
    if failed:
        print(f"\ndoc blocks FAILED in: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"\nall python blocks in {len(args.files)} file(s) ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
