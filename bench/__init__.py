"""``make bench``: intake, pipeline latency, worker drain and cron cost, each next to a same-run reference."""
