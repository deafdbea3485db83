"""How the bench turns rounds into one figure: a drain's rate over all its rounds, a cost from paired rounds."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from bench.paired import paired_cost
from bench.phase_drain import overall_rate


def test_a_drains_rate_over_rounds_is_all_its_jobs_over_all_its_seconds() -> None:
    # 1,000 jobs at 400/s (2.5 s) and 1,000 at 800/s (1.25 s): 2,000 jobs in 3.75 s, not the rates' mean of 600.
    assert overall_rate([400.0, 800.0]) == pytest.approx(2000 / 3.75)


def test_a_round_at_half_speed_spoils_its_own_cost_not_the_figure() -> None:
    run = SimpleNamespace(notes=[])
    on, off = [1524.0, 804.0, 1387.0], [1585.0, 1719.0, 1401.0]  # the second "on" ran at half speed
    cost = paired_cost(cast(Any, run), "metrics cost, intake req/s", [1 - a / b for a, b in zip(on, off, strict=True)])
    assert cost == pytest.approx(1 - 1524 / 1585)  # 3.8%; each kind's median would say 12.5%
    assert run.notes == ["metrics cost, intake req/s, each round: 3.8%, 53.2%, 1.0%"]
