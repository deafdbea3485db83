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


def test_stripe_backlog_rows_show_their_targets_and_the_workers_cpu_per_event() -> None:
    results = {
        "stripe_backlog_429": 0,
        "stripe_backlog_reads_per_customer": 1.0,
        "stripe_backlog_drain_ratio": 1.4,
        "stripe_backlog_events": 400,
        "stripe_backlog_customers": 40,
        "stripe_backlog_worker_cpu_ms": 3.2,
        "stripe_backlog_clerk_cpu_ms": 2.3,
        "stripe_backlog_cpu_ratio": 3.2 / 2.3,
    }
    rendered = table(results, "header")
    assert _row(rendered, "Stripe backlog: 429s")[-2:] == ["0", "ok"]
    reads = _row(rendered, "Stripe backlog: reads per customer")
    assert reads[2] == "400 events of 40 customers"
    assert reads[-2:] == ["<= 1.1", "ok"]
    assert _row(rendered, "Stripe backlog: drain time")[-2:] == ["<= 1.25", "MISS"]
    assert _row(rendered, "Stripe backlog: worker CPU per event")[1:] == [
        "1.39",
        "3.20 ms (two workers, every event of the backlog); a Clerk event 2.30 ms (one worker's drain)",
        "<= 1.3",
        "MISS",
    ]
    assert "coalescing" not in rendered


def test_each_thin_backlog_drain_is_held_to_its_target_on_its_own_row() -> None:
    results = {
        "thin_backlog_drain_ratio": 1.0,
        "thin_backlog_drain_ratio_unknown": 1.38,
        "thin_backlog_customers": 1_000,
    }
    rendered = table(results, "header")
    known = _row(rendered, "thin backlog: drain time / (reads / 20 per s), subscriptions synced before")
    assert known[1:] == ["1.00", "1,000 customers, one read each", "<= 1.25", "ok"]
    unknown = _row(rendered, "thin backlog: drain time / (reads / 20 per s), customers never seen")
    assert unknown[1] == "1.38"
    assert unknown[-2:] == ["<= 1.25", "MISS"]


def test_the_pipeline_rows_name_the_load_as_a_share_of_the_drain_measured_before() -> None:
    results = {
        "pipeline_p50_ms": 9.0,
        "pipeline_p99_ms": 120.0,
        "pipeline_events": 3_000,
        "pipeline_offered_eps": 210.0,
        "pipeline_reference_eps": 420.0,
    }
    rendered = table(results, "header")
    p50 = _row(rendered, "pipeline p50")
    assert p50[2] == "3,000 Clerk events at 210/s, half of one worker's drain just before (420/s)"
    assert p50[-2:] == ["<= 50", "ok"]
    assert _row(rendered, "pipeline p99")[-2:] == ["<= 100", "MISS"]


def test_isolation_and_fairness_rows_hold_their_probes_to_their_targets() -> None:
    results = {
        "isolation_probe_p50_ms": 40.0,
        "isolation_probe_p99_ms": 1000.0,
        "isolation_flood_drain_ratio": 0.8,
        "fairness_probe_p50_ms": 30.0,
        "fairness_probe_p99_ms": 1000.0,
        "fairness_flood_before_share": 0.0125,
        "fairness_flood_before_max": 40,
        "fairness_flood_drain_ratio": 0.89,
    }
    rendered = table(results, "header")
    assert _row(rendered, "isolation: Stripe events' wait")[1] == "40 / 1,000"
    assert _row(rendered, "isolation: Stripe events' wait")[-1] == "MISS"  # under 1 s, strictly
    assert _row(rendered, "isolation: flood drain rate")[-1] == ""  # reported, no target
    assert _row(rendered, "fairness: other organizations' wait")[-1] == "ok"  # at most 1 s
    before = _row(rendered, "fairness: flood events processed before each")
    assert before[1] == "1.25%" and before[-2:] == ["<= 2%", "ok"]
    assert _row(rendered, "fairness: flood drain rate")[-2:] == [">= 0.9", "MISS"]


def test_adapter_rows_set_the_adapter_next_to_arqs_own_call() -> None:
    results = {
        "adapter_arq_us": 300.0,
        "adapter_arq_cpu_us": 150.0,
        "adapter_single_us": 150.0,
        "adapter_single_cpu_us": 80.0,
        "adapter_batch_us": 20.0,
        "adapter_batch_cpu_us": 8.0,
        "adapter_batch": 500,
        "adapter_fair_extra_single_us": 10.0,
        "adapter_fair_extra_batch_us": 6.5,
    }
    rendered = table(results, "header")
    single = _row(rendered, "arq adapter, one job a call")
    assert single[1] == "150.0 / 80.0" and single[2].startswith("arq's enqueue_job 300.0 / 150.0")
    assert _row(rendered, "arq adapter, batches")[2].startswith("500 jobs a call")
    assert _row(rendered, "arq adapter: fair placement's extra")[1] == "10.0 / 6.5"
