"""`make test`'s own behaviour: a missing test path is an error, and NO_SYSTEM_DEPS=1 installs nothing and deselects
what needs Debian's chromium, prometheus or a container engine (tools/make_test.py, tools/install-debian-packages)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools.make_test import missing_paths

ROOT = Path(__file__).resolve().parents[2]
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tools.make_test"]


def run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST")}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_missing_paths_are_the_arguments_whose_file_or_folder_is_absent(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("")
    given = ["tests", "tests/test_a.py::test_x[1]", "tests/test_b.py", "test/"]
    assert missing_paths(given, tmp_path) == ["tests/test_b.py", "test/"]


@pytest.mark.slow
def test_a_missing_path_stops_the_run_under_xdist_with_its_name() -> None:
    result = run([*PYTEST, "-n", "2", "tests/tools/no_such_test.py", "tests/tools"])
    assert result.returncode == 4, result.stdout + result.stderr
    assert "file or directory not found: tests/tools/no_such_test.py" in result.stderr
    assert "no tests ran" not in result.stdout


def collected(*args: str) -> set[str]:
    result = run([*PYTEST, "--collect-only", *args])
    assert result.returncode == 0, result.stdout + result.stderr
    return {line for line in result.stdout.splitlines() if "::" in line}


@pytest.mark.slow(10)
def test_without_system_deps_deselects_the_tests_that_need_them_and_only_those() -> None:
    folders = ["tests/ops", "tests/deploy"]
    every = collected(*folders)
    kept = collected("--without-system-deps", *folders)
    deselected = every - kept
    assert kept < every

    def in_module(tests: set[str], name: str) -> set[str]:
        return {test for test in tests if test.startswith(name + "::")}

    for module in (
        "tests/deploy/test_image.py",
        "tests/deploy/test_monitoring.py",
        "tests/ops/test_prometheus_scrape.py",
    ):
        assert in_module(every, module) and in_module(deselected, module) == in_module(every, module), module
    assert in_module(kept, "tests/deploy/test_compose.py") == in_module(every, "tests/deploy/test_compose.py")
    # The browser tests go (they take the `browser` fixture), the operations page's other tests stay.
    assert in_module(deselected, "tests/ops/test_ops_retry_in_browser.py")
    session = "tests/ops/test_ops_session.py"
    assert in_module(every, session) and in_module(kept, session) == in_module(every, session)
    assert not {test for test in deselected if test.startswith("tests/ops/test_metrics.py")}


def test_the_recipe_installs_nothing_with_no_system_deps() -> None:
    plain = run(["make", "-n", "test"]).stdout
    without = run(["make", "-n", "test", "NO_SYSTEM_DEPS=1"]).stdout
    assert "tools/install-debian-packages" in plain
    assert "tools/install-debian-packages" not in without
    assert re.search(r"pytest .*-p tools\.make_test --without-system-deps", without), without
    assert "-p tools.make_test" in plain and "--without-system-deps" not in plain


def test_the_install_script_says_how_it_is_used() -> None:
    result = run(["bash", str(ROOT / "tools" / "install-debian-packages")])
    assert result.returncode == 2
    assert "usage: tools/install-debian-packages WHY PACKAGE..." in result.stderr


@pytest.mark.slow
def test_quiet_under_xdist_there_is_no_placeholder_line() -> None:
    result = run([*PYTEST, "-n", "2", "tests/unit/test_client_ip.py"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bringing up nodes" not in result.stdout + result.stderr
    assert re.search(r"^\d+ passed in ", result.stdout, re.MULTILINE), result.stdout


@pytest.mark.slow
def test_make_test_fast_leaves_out_the_slow_browser_and_container_tests() -> None:
    recipe = run(["make", "-n", "test-fast", "NO_SYSTEM_DEPS=1"]).stdout
    fast = re.search(r'-m "([^"]+)"', recipe)
    assert fast is not None and "tools/install-debian-packages" not in recipe, recipe
    assert fast.group(1) == "not slow and not browser and not container"
    folders = ["tests/ops", "tests/deploy", "tests/faults", "tests/soak"]
    every, kept = collected(*folders), collected("-m", fast.group(1), *folders)
    assert kept and kept < every
    slow = ("tests/ops/test_ops_phone.py", "tests/deploy/test_image.py", "tests/faults/test_frozen_worker.py")
    for left_out in (*slow, "tests/soak/"):
        assert not {test for test in kept if test.startswith(left_out)}, left_out
    # Every browser test is marked browser, slow or not: none is kept.
    assert not {test for test in kept if test.startswith("tests/ops/test_ops_page.py")}
    assert {test for test in kept if test.startswith("tests/ops/test_ops_session.py")}
