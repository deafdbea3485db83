"""``python -m bench.without_journal MODULE [ARGS...]``: ``python -m MODULE ARGS...``, the journal's writes skipped.

The reference of the journal's cost (phases ``drain`` and ``stripe_backlog``):
the same worker with ``app.identity.repository.journal_sql.JOURNAL_WRITES``
set to False before any statement is built, so identity's statements write
their rows but no ``workspace_change`` row (they still read the stored row
they diff against: that read is part of the write's lock), and a
``Journaled`` model's flush journals nothing. The product has no such switch
(no setting, no flag): this exists only to measure what the journal costs.
"""

from __future__ import annotations

from bench.switched import run_switched


def switch_off() -> None:
    from app.identity.repository import journal_sql

    journal_sql.JOURNAL_WRITES = False


def main() -> None:
    run_switched(switch_off, "python -m bench.without_journal MODULE [ARGS...]")


if __name__ == "__main__":
    main()
