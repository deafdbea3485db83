"""docs/models.md, docs/jobs.md and docs/testing.md, followed word for word in a copy of the project.

The copy gets the project's tracked files; then each guide's blocks are taken
in order, as a reader takes them: a ```python file=PATH block is written, a
```diff file=PATH block applied, and each line of a ```bash run block run as
the Makefile runs it, against a database made for this test. At the end
every written, edited and generated file must pass ruff and mypy, and the
copy's whole fast suite must pass: `make test-fast` there (the guides' own
test files among it, in place of their `make test PYTEST_ARGS=...` lines),
and beside it the intake fuzz (slow, so not in `make test-fast`), which holds
a property of every route the API serves, a route a guide adds included. So a
guide that breaks any test of the project fails this one. The copy runs on
this checkout's virtualenv (nothing is installed) with `make test`'s own
xdist settings, on a Postgres of its own (embedded) beside the test's Redis.
The copies, the databases, the embedded server and the test's Redis keys are
removed at the end. The models and jobs guides build the invoices example;
the testing guide's examples are test files a reader creates and runs, on
their own.

The project itself may be a tree where a reader followed the guides already
(their files written, committed or not): the copy leaves out what the guides
create, and the diff blocks find their edits made (``tools.doc_blocks.apply_diff``).
The test checks that too: in the copy where it followed the guides, the
documents' blocks pass `make lint`'s check, and the guides followed once more
from there make the same files.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Container, Iterator, Mapping
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis
from sqlalchemy.engine import make_url

from app.testing.processes import child_env
from tools import embedded
from tools.doc_blocks import (
    EXAMPLE_GUIDES,
    Block,
    Origins,
    apply_guide,
    check,
    copy_files,
    documents,
    lint,
    read_blocks,
    tracked_files,
)

pytestmark = pytest.mark.slow(240)  # the copy's whole fast suite: about as long as `make test-fast`, and more

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
"""This checkout's virtualenv (the one running the test), which the copy uses as it is."""
LITESTAR = [str(Path(sys.executable).parent / "litestar"), "--app", "app.asgi:create_app"]
COMMAND_TIMEOUT_SECONDS = 300
SUITE_TIMEOUT_SECONDS = 1200
FUZZ_EXAMPLES = 300
"""The fuzz's requests in the copy: enough to reach every POST route many times (a tenth go to the non-webhook ones)."""
MYPY_CACHE = ROOT / ".mypy_cache" / "guides"
GUIDES = (*EXAMPLE_GUIDES, "docs/testing.md")
"""The guides followed, in this order: the invoices example first, then the testing guide's own examples."""


def make_variables(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in shlex.split(line)[2:] if "=" in word)


def make_command(line: str) -> list[str]:
    """What a guide's `make ...` line runs, as the Makefile spells it (the servers' URLs come from the test)."""
    target, variables = shlex.split(line)[:2], make_variables(line)
    if target == ["make", "migrate"]:
        return [*LITESTAR, "database", "upgrade", "--no-prompt"]
    if target == ["make", "cli"] and "ARGS" in variables:
        return [*LITESTAR, *shlex.split(variables["ARGS"])]
    if target == ["make", "test"] and "PYTEST_ARGS" in variables:
        # One file: no xdist workers to start (make test adds -n 3).
        return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *shlex.split(variables["PYTEST_ARGS"])]
    raise AssertionError(f"The guide test cannot run {line!r}: use make migrate, make cli ARGS=... or make test.")


def is_migration_command(line: str) -> bool:
    return make_command(line)[len(LITESTAR) :][:1] == ["database"]


def is_test_command(line: str) -> bool:
    return shlex.split(line)[:2] == ["make", "test"]


def not_a_test_command(line: str) -> bool:
    """The guides' `make test PYTEST_ARGS=...` lines run within the copy's whole suite, not one by one."""
    return not is_test_command(line)


def guide_test_files(root: Path) -> set[str]:
    """The test files the guides' `make test PYTEST_ARGS=...` lines name."""
    files: set[str] = set()
    for guide in GUIDES:
        for block in read_blocks(root, guide):
            files.update(make_variables(line)["PYTEST_ARGS"] for line in run_lines(block) if is_test_command(line))
    return files


def run_line(tree: Path, block: Block, line: str, env: Mapping[str, str]) -> None:
    command = make_command(line)
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS)
    assert done.returncode == 0, f"{block.where}: `{line}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    cli_args = command[len(LITESTAR) :] if command[: len(LITESTAR)] == LITESTAR else []
    if cli_args[:2] == ["crons", "run"]:
        assert done.stdout.splitlines()[-1] == f"Cron {cli_args[2]} ran.", f"{block.where}: `{line}`:\n{done.stdout}"


def run_lines(block: Block) -> list[str]:
    if block.lang != "bash" or "run" not in block.flags:
        return []
    return [line for line in block.text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def follow(
    tree: Path, guide: str, env: Mapping[str, str], origins: Origins, run: Callable[[str], bool] = lambda _: True
) -> None:
    """Take the guide's blocks in order (of its commands those ``run`` accepts), recording what it wrote and edited."""
    for block in read_blocks(ROOT, guide):
        if block.lang == "bash" and "run" in block.flags:
            for line in filter(run, run_lines(block)):
                run_line(tree, block, line, env)
        else:
            origins.add(apply_guide(tree, [block]), tree)


def migrations(tree: Path) -> set[str]:
    return {str(path.relative_to(tree)) for path in (tree / "alembic" / "versions").glob("*.py")}


def migration_slug(message: str) -> str:
    """The part of a revision's file name Alembic makes of its message (``%(slug)s`` in alembic.ini)."""
    slug = "_".join(re.findall(r"\w+", message)).lower()
    return slug if len(slug) <= 40 else slug[:40].rsplit("_", 1)[0] + "_"


def created_by_guides(root: Path) -> set[str]:
    """What following the guides in ``root`` created: the files they write and the migrations they generate."""
    created: set[str] = set()
    for guide in GUIDES:
        for block in read_blocks(root, guide):
            if block.is_python and block.file:
                created.add(block.file)
            for line in run_lines(block):
                command = make_command(line)
                if "make-migrations" in command and "-m" in command:
                    slug = migration_slug(command[command.index("-m") + 1])
                    created.update(name for name in migrations(root) if name.endswith(f"_{slug}.py"))
    return created


def start_tree(root: Path, tree: Path) -> None:
    """The project's files as the guides start from them: ``root``'s, less what following the guides created.

    ``root`` may be a tree where the guides were followed already. Their new
    files are left out, so that each appears when its block is written, and so
    is their migration, so that the guides generate it again. Their edits of
    existing files cannot be taken back: the diff blocks find them made.
    """
    created = created_by_guides(root)
    copy_files(root, [name for name in tracked_files(root) if name not in created], tree)


def follow_guides(
    root: Path, tree: Path, env: Mapping[str, str], run: Callable[[str], bool] = lambda _: True
) -> Origins:
    """Follow the guides from ``root`` in ``tree``: what they wrote, edited and generated (one migration)."""
    start_tree(root, tree)
    before, origins = migrations(tree), Origins()
    for guide in GUIDES:
        follow(tree, guide, {**env, "PYTHONPATH": str(tree)}, origins, run)
    generated = sorted(migrations(tree) - before)
    assert len(generated) == 1, f"the guides should generate one migration, not {generated}"
    assert 'op.create_table(\n        "invoice",' in (tree / generated[0]).read_text()
    origins.others.update(generated)
    return origins


def fast_suite(tree: Path, env: Mapping[str, str], without_system_deps: bool) -> subprocess.Popen[str]:
    """`make test-fast` in ``tree``, on this checkout's virtualenv: ``tree/.venv`` links to it, and ``-o`` takes
    its install as done (a variable given to make would reach the suite's own make commands, ``-o`` does not)."""
    (tree / ".venv").symlink_to(VENV, target_is_directory=True)
    command = ["make", "--no-print-directory", "-o", ".venv/.installed", "test-fast"]
    command += ["NO_SYSTEM_DEPS=1"] if without_system_deps else []
    return started(command, tree, env)


def fuzz(tree: Path, env: Mapping[str, str], basetemp: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={basetemp}"]
    command += ["tests/fuzz/test_intake_fuzz.py", f"--fuzz-examples={FUZZ_EXAMPLES}"]
    return started(command, tree, env)


def started(command: list[str], tree: Path, env: Mapping[str, str]) -> subprocess.Popen[str]:
    """In a session of its own, so that ending it ends its pytest processes too (``stop``)."""
    pipe, out = subprocess.PIPE, subprocess.STDOUT
    return subprocess.Popen(command, cwd=tree, env=env, stdout=pipe, stderr=out, text=True, start_new_session=True)


def stop(process: subprocess.Popen[str]) -> str:
    """Kill it and its pytest processes; what it printed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.communicate()[0]


def finished(name: str, process: subprocess.Popen[str]) -> str:
    try:
        output, _ = process.communicate(timeout=SUITE_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        output = stop(process)
        raise AssertionError(f"{name} in the copy took over {SUITE_TIMEOUT_SECONDS} s:\n{output[-6000:]}") from None
    assert process.returncode == 0, f"{name} in the copy, where the guides were followed, failed:\n{failures(output)}"
    return output


FAILURE_HEADER = re.compile(r"^_+ ([^_ ].*?) _+$", re.MULTILINE)  # not a traceback's "_ _ _" line


def failures(output: str, each: int = 2500) -> str:
    """Each failure's name and the end of its report (where its assertion is), and the run's last lines: the whole
    output's tail would show only the last failures' tracebacks."""
    starts = [match.start() for match in FAILURE_HEADER.finditer(output)]
    if not starts:
        return output[-6000:]
    reports = [output[start:end] for start, end in zip(starts, [*starts[1:], len(output)], strict=True)]
    cut = (r if len(r) <= each else f"{r.splitlines()[0]}\n[...]\n{r[-each:]}" for r in reports)
    return "\n".join(cut)


def run_suites(tree: Path, env: Mapping[str, str], work: Path, without_system_deps: bool) -> None:
    """The copy's fast suite and its fuzz, side by side."""
    started = time.monotonic()
    suite = fast_suite(tree, env, without_system_deps)
    fuzzing = fuzz(tree, env, work / "fuzz")
    try:
        print(f"copy's fuzz: {finished('The intake fuzz', fuzzing).strip().splitlines()[-1]}")
        print(f"copy's make test-fast: {finished('make test-fast', suite).strip().splitlines()[-1]}")
    finally:
        for process in (suite, fuzzing):
            if process.poll() is None:  # the other one failed: this one's result no longer matters
                stop(process)
    print(f"the copy's suites took {time.monotonic() - started:.0f} s")


def in_the_fast_suite(tree: Path, test_file: str) -> bool:
    """Whether `make test-fast` runs the file's tests: none is marked slow, browser or container."""
    return not re.search(r"pytest\.mark\.(slow|browser|container)", (tree / test_file).read_text())


def contents(tree: Path, leave_out: Container[str]) -> dict[str, bytes]:
    """The tree's files and their bytes, as ``tracked_files`` sees a tree outside git (no hidden ones), no caches."""
    files = (path for path in tree.rglob("*") if path.is_file() and "__pycache__" not in path.parts)
    files = (path for path in files if not any(part.startswith(".") for part in path.relative_to(tree).parts))
    named = {str(path.relative_to(tree)): path for path in files}
    return {name: path.read_bytes() for name, path in named.items() if name not in leave_out}


async def _admin(url: str, statement: str) -> None:
    connection = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


async def _drop_redis_keys(url: str, namespace: str) -> None:
    client = Redis.from_url(url)
    try:
        for pattern in (f"{namespace}*", f"arq:*:{namespace}*"):
            keys = [key async for key in client.scan_iter(match=pattern, count=1000)]
            if keys:
                await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture
def guide_env(base_database_url: str, redis_url: str) -> Iterator[Callable[[], dict[str, str]]]:
    """Makes what `make cli` would give the commands, each time on a database and a Redis prefix of its own."""
    made: list[tuple[str, str]] = []

    def make() -> dict[str, str]:
        name, namespace = f"guide_{uuid.uuid4().hex[:12]}", f"guide{uuid.uuid4().hex[:8]}:"
        asyncio.run(_admin(base_database_url, f'CREATE DATABASE "{name}"'))
        made.append((name, namespace))
        url = make_url(base_database_url).set(database=name).render_as_string(hide_password=False)
        environment = {"DATABASE_URL": url, "REDIS_URL": redis_url, "REDIS_NAMESPACE": namespace}
        return child_env({**environment, "TEST_DATABASE_URL": base_database_url, "TEST_REDIS_URL": redis_url})

    try:
        yield make
    finally:
        for name, namespace in made:
            asyncio.run(_admin(base_database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            asyncio.run(_drop_redis_keys(redis_url, namespace))


def test_the_models_jobs_and_testing_guides_run_as_written_and_the_whole_suite_passes(
    guide_env: Callable[[], dict[str, str]], pytestconfig: pytest.Config
) -> None:
    with tempfile.TemporaryDirectory(prefix="guides-") as tmp:
        followed = Path(tmp) / "followed"
        env = guide_env()
        origins = follow_guides(ROOT, followed, env, run=not_a_test_command)
        assert lint(followed, origins, MYPY_CACHE) == []

        # The copy's whole fast suite, the guides' own test files among it, and the fuzz.
        without_system_deps = bool(pytestconfig.getoption("without_system_deps", default=False))
        # As in a fresh clone: no DATABASE_URL nor REDIS_URL (the suite makes its own databases and key prefixes).
        # Its Postgres is one of its own (embedded, not durable): a suite within the suite would otherwise take
        # twice the connections of the test server, whose limit (100 by default) the outer run needs.
        suite_env = {
            key: value for key, value in env.items() if key not in ("DATABASE_URL", "REDIS_URL", "REDIS_NAMESPACE")
        }
        assert all(in_the_fast_suite(followed, name) for name in guide_test_files(ROOT))
        servers = Path(tmp) / "servers"
        try:
            database = embedded.ensure_postgres(servers, database="test", durable=False)
            suite_env |= {"TEST_DATABASE_URL": database, "PYTHONPATH": str(followed)}
            run_suites(followed, suite_env, Path(tmp), without_system_deps)
        finally:
            embedded.stop_all(servers)

        # And where a reader has followed them (outside git every file of the copy counts as tracked, as if the
        # reader had committed the guides' files): `make lint` checks the documents' blocks in that tree,
        assert check(followed, documents(followed), MYPY_CACHE) == []
        # and the guides, followed again from there, make the same tree. Of their commands only the
        # migration's run again: with the same files, the tests, the lint and the other commands passed above.
        again = Path(tmp) / "again"
        origins_again = follow_guides(followed, again, guide_env(), run=is_migration_command)
        assert contents(again, origins_again.others) == contents(followed, origins.others)
