"""What commands print: counts with their nouns, and rows in columns."""

from __future__ import annotations

from app.core.commands import plural, table


def test_a_count_of_one_takes_the_singular() -> None:
    assert plural(1, "overdue invoice") == "1 overdue invoice"
    assert plural(0, "webhook event") == "0 webhook events"
    assert plural(2, "event") == "2 events"


def test_a_table_pads_every_column_but_the_last() -> None:
    assert table([["NAME", "NEXT", "LAST"], ["Cron", "09:00", "never"]]) == "NAME  NEXT   LAST\nCron  09:00  never"
