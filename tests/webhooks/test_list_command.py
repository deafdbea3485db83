"""``litestar webhooks list``: each unprocessed event's last error, cut at a word, or whole with ``--verbose``."""

from __future__ import annotations

import subprocess
import sys

from app.core.resources import Resources
from app.testing.processes import child_env
from app.webhooks.cli import SHORT_ERROR_CHARS, cut_at_word
from tests.ops.conftest import event_row
from tests.processes import ROOT

# A last error as a failing handler leaves it: long, with a traceback's line breaks.
ERROR = "StripeError: the API answered 502 reading customer cus_listed.\n" + " ".join(
    f"frame{n} in app/billing/sync.py" for n in range(40)
)


def list_events(settings_env: dict[str, str], *options: str) -> list[str]:
    command = [sys.executable, "-m", "litestar", "--app", "app.asgi:create_app", "webhooks", "list", *options]
    listed = subprocess.run(command, cwd=ROOT, env=child_env(settings_env), capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.splitlines()


async def test_the_last_error_is_cut_at_a_word_and_whole_with_verbose(
    settings_env: dict[str, str], resources: Resources
) -> None:
    async with resources.db.session() as session:
        session.add(event_row("stripe", 1, attempts=3, last_error=ERROR))
        await session.commit()

    (short,) = [line for line in list_events(settings_env) if "last error: " in line]
    verbose = list_events(settings_env, "--verbose")
    first = next(at for at, line in enumerate(verbose) if "last error: " in line)
    whole = [verbose[first].split("last error: ", 1)[1], *(line.strip() for line in verbose[first + 1 : -1])]

    error = short.split("last error: ", 1)[1]
    assert error.endswith(" ... (--verbose: the whole error)")
    shown = error.removesuffix(" ... (--verbose: the whole error)")
    assert len(shown) <= SHORT_ERROR_CHARS and " ".join(ERROR.split()).startswith(shown + " ")  # ends at a word
    assert "\n".join(whole) == ERROR  # every line of it, each continuation indented under the first


def test_a_short_error_is_shown_whole_and_a_long_word_is_cut_where_it_must_be() -> None:
    assert cut_at_word("KeyError: 'x'", 200) == "KeyError: 'x'"
    assert cut_at_word("x" * 300, 200) == "x" * 200 + " ... (--verbose: the whole error)"
