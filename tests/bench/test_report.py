"""The bench table: a phase that did not run is blank, not a miss; the 2-worker row names the machine's bound."""

from __future__ import annotations

from bench.report import table


def _row(rendered: str, label: str) -> list[str]:
    line = next(line for line in rendered.splitlines() if line.startswith(f"| {label}"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_figures_of_a_phase_that_did_not_run_are_neither_ok_nor_missed() -> None:
    rendered = table({"drain_eps_1w": 300.0, "update_eps": 500.0, "api_rss_mb": float("nan")}, "header")
    assert _row(rendered, "API peak RSS (MB)")[1:] == ["n/a", "", "<= 150", ""]
    assert _row(rendered, "intake ratio")[-1] == ""
    assert _row(rendered, "drain, 1 worker")[-1] == "ok"


def test_two_worker_row_shows_the_scaling_and_the_bound_one_worker_leaves() -> None:
    results = {"drain_eps_1w": 250.0, "drain_eps_2w": 300.0, "drain_2w_machine_bound": 1.28, "update_eps_2w": 440.0}
    cells = _row(table(results, "header"), "drain, 2 workers")
    assert cells[2].startswith("x1.20 (machine bound x1.28)")
    assert cells[-1] == "MISS"


def test_stripe_backlog_rows_show_their_targets_and_the_reference_without_coalescing() -> None:
    results = {
        "stripe_backlog_429": 0,
        "stripe_backlog_reads_per_customer": 1.0,
        "stripe_backlog_drain_ratio": 1.4,
        "stripe_reference_reads_per_customer": 10.0,
        "stripe_reference_events": 400,
        "stripe_reference_customers": 40,
    }
    rendered = table(results, "header")
    assert _row(rendered, "Stripe backlog: 429s")[-2:] == ["0", "ok"]
    reads = _row(rendered, "Stripe backlog: reads per customer")
    assert "no coalescing: 10.00 (400 events of 40)" in reads[2]
    assert reads[-2:] == ["<= 1.1", "ok"]
    assert _row(rendered, "Stripe backlog: drain time")[-2:] == ["<= 1.25", "MISS"]
