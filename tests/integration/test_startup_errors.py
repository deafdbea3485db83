"""A malformed setting stops the process at start: one line, non-zero exit, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full_env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **env}
    return subprocess.run(args, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"STRIPE_WEBHOOK_SECRET": "whsec_%%%"}, "STRIPE_WEBHOOK_SECRET"),
        ({"DATABASE_URL": "postgres//broken"}, "DATABASE_URL"),
        ({"STRIPE_EVENT_PAYLOADS": "snapshot,thick"}, "STRIPE_EVENT_PAYLOADS"),
    ],
)
def test_api_refuses_to_start_with_one_clear_line(env: dict[str, str], variable: str) -> None:
    result = _run([os.path.join(BIN, "uvicorn"), "--factory", "app.asgi:create_app", "--port", "0"], env)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if variable in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Configuration error: ")


def test_litestar_cli_refuses_a_bad_setting_the_same_way() -> None:
    result = _run(
        [os.path.join(BIN, "litestar"), "--app", "app.asgi:create_app", "routes"],
        {"REDIS_URL": "http://wrong-scheme"},
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "Configuration error: REDIS_URL" in result.stderr


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"DATABASE_URL": "postgresql+asyncpg://u:hunter2pw@host:notaport/db"}, "DATABASE_URL"),
        ({"REDIS_URL": "http://:hunter2pw@redis:6379/0"}, "REDIS_URL"),
    ],
)
def test_a_url_in_a_start_up_error_hides_its_password(env: dict[str, str], variable: str) -> None:
    result = _run([os.path.join(BIN, "uvicorn"), "--factory", "app.asgi:create_app", "--port", "0"], env)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "hunter2pw" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if variable in line]
    assert line.startswith(f"Configuration error: {variable}=") and ":***@" in line, result.stderr
