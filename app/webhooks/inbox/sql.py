"""Every SQL statement on ``webhook_event``, hand-written: intake and processing are the hot paths.

Statements that target one row find it by its key, never through a partial
index: "coalesce(...) IS NULL" / "num_nonnulls(...) = 1" say "processed_at IS
NULL AND abandoned_at IS NULL" / "abandoned_at IS NOT NULL" in forms the
planner cannot match to the partial indexes of pending or set-aside rows.
Without fresh statistics it once chose them, and a backlog of N events cost
O(N) per claim (``tests/webhooks/test_query_plans.py``).
"""

from __future__ import annotations

from sqlalchemy import text

# Advisory-lock keys of inbox rows: a constant high part keeps them apart from other users.
LOCK_BASE = 0x5745 << 48

# One round trip: insert; or, for a redelivery, reopen a set-aside row (exactly what retry-abandoned does
# for it); or report the existing row.
STORE = """
WITH inserted AS (
    INSERT INTO webhook_event (provider, event_id, type, payload, request_id, tenant_key, sync_subject, trace_context)
    VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8)
    ON CONFLICT (provider, event_id) DO NOTHING
    RETURNING id, request_id, tenant_key
), reopened AS (
    UPDATE webhook_event SET abandoned_at = NULL, attempts = 0
    WHERE provider = $1 AND event_id = $2 AND num_nonnulls(abandoned_at) = 1 AND processed_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM inserted)
    RETURNING id, request_id, tenant_key
)
SELECT id, 'inserted' AS outcome, false AS processed, request_id, tenant_key FROM inserted
UNION ALL
SELECT id, 'reopened', false, request_id, tenant_key FROM reopened
UNION ALL
SELECT id, 'existing', processed_at IS NOT NULL, request_id, tenant_key FROM webhook_event
WHERE provider = $1 AND event_id = $2
  AND NOT EXISTS (SELECT 1 FROM inserted) AND NOT EXISTS (SELECT 1 FROM reopened)
"""

# The keys one event was stored with (by the unique key): a Stripe thin event's snapshot twin names its customer.
KEYS_OF = "SELECT tenant_key, sync_subject FROM webhook_event WHERE provider = $1 AND event_id = $2"
# Which of these events are in the inbox (by the unique key): the backfill stores the others.
PRESENT = "SELECT event_id FROM webhook_event WHERE provider = $1 AND event_id = ANY($2::text[])"

# --- One processing attempt, on the attempt's own connection (attempt.py) ----------------------------------
# While the attempt holds the event's lock its session carries idle timeouts ($3): a worker frozen or cut off
# mid-attempt loses its locks. Every statement that releases the lock clears them.
_HOLD = "set_config('idle_session_timeout', $3, false), set_config('idle_in_transaction_session_timeout', $3, false)"
_LET_GO = (
    "set_config('idle_session_timeout', '0', false), set_config('idle_in_transaction_session_timeout', '0', false)"
)
# The claimed row comes back whole, its payload as text (decoded by us): the handler's event is built from it.
CLAIM = f"""
WITH lock AS MATERIALIZED (SELECT pg_try_advisory_lock($2) AS got),
held AS MATERIALIZED (SELECT {_HOLD} FROM lock WHERE lock.got),
counted AS (
    UPDATE webhook_event SET attempts = attempts + 1
    FROM lock
    WHERE webhook_event.id = $1 AND lock.got
      AND coalesce(webhook_event.processed_at, webhook_event.abandoned_at) IS NULL
    RETURNING webhook_event.id, webhook_event.provider, webhook_event.event_id, webhook_event.type,
              webhook_event.payload::text AS payload, webhook_event.received_at, webhook_event.attempts,
              webhook_event.last_error, webhook_event.request_id, webhook_event.tenant_key, webhook_event.trace_context
)
SELECT lock.got, counted.* FROM lock LEFT JOIN counted ON true LEFT JOIN held ON true
"""
# In the handler's transaction. Reading from `marked` makes the row update (and its row lock, held until
# COMMIT) happen before the unlock: a worker claiming the event in between waits, then sees it processed.
# `took` (arrival to processing) is NULL for a replayed event: its wait since arrival measures no pipeline.
MARK_PROCESSED_AND_UNLOCK = f"""
WITH marked AS (
    UPDATE webhook_event SET processed_at = now(), last_error = NULL WHERE id = $1
    RETURNING CASE WHEN replayed_at IS NULL THEN extract(epoch FROM processed_at - received_at) END AS took
)
SELECT done.took, pg_advisory_unlock($2), {_LET_GO} FROM (SELECT max(took) AS took FROM marked) AS done
"""
RECORD_ERROR_AND_UNLOCK = f"""
WITH recorded AS (UPDATE webhook_event SET last_error = $2 WHERE id = $1 RETURNING id)
SELECT pg_advisory_unlock($3), {_LET_GO} FROM (SELECT count(*) FROM recorded) AS done
"""
RECORD_ERROR = "UPDATE webhook_event SET last_error = $2 WHERE id = $1"
# An attempt the remote side asked to make later (a 429's Retry-After, a saturated API budget) is not a failure:
# its count is given back and its last error kept as it was.
UNCOUNT_AND_UNLOCK = f"""
WITH uncounted AS (UPDATE webhook_event SET attempts = greatest(attempts - 1, 0) WHERE id = $1 RETURNING id)
SELECT pg_advisory_unlock($2), {_LET_GO} FROM (SELECT count(*) FROM uncounted) AS done
"""
UNCOUNT = "UPDATE webhook_event SET attempts = greatest(attempts - 1, 0) WHERE id = $1"
SET_ASIDE_ONE = """
UPDATE webhook_event SET abandoned_at = now(), last_error = $2
WHERE id = $1 AND coalesce(processed_at, abandoned_at) IS NULL
RETURNING provider, event_id, type, attempts, last_error
"""
UNLOCK = f"SELECT pg_advisory_unlock($1), {_LET_GO}"

# --- Synced events: a sync of their subject covers them (coverage.py) ---------------------------------------
# An event whose job asks for a sync: no lock, no attempt (the sync counts attempts).
PEEK = """
SELECT id, provider, type, sync_subject, received_at, request_id, tenant_key, trace_context,
       coalesce(processed_at, abandoned_at) IS NOT NULL AS done
FROM webhook_event WHERE id = $1
"""
# The events a sync covers: its subject's, unprocessed, not set aside, arrived by the time its read began
# (ix_webhook_event_sync_subject).
_COVERED = "sync_subject = $1 AND received_at <= $2 AND processed_at IS NULL AND abandoned_at IS NULL"
# When the latest of them arrived (none: NULL), and the last of them stored: the cause its journal rows name. A
# replayed event counts as arriving when it was replayed: a read before the replay (one that found the customer
# already written from a later read) must not stand for it, or a replay after a fix would read nothing.
COVERED = f"""
SELECT max(greatest(received_at, replayed_at)) AS newest_at, max(id) AS newest FROM webhook_event WHERE {_COVERED}
"""
# In the sync's transaction, with what it wrote (the sync's read counts as an attempt of each): `took` as
# MARK_PROCESSED_AND_UNLOCK's.
MARK_COVERED = text(
    """
UPDATE webhook_event SET processed_at = now(), last_error = NULL, attempts = attempts + 1
WHERE sync_subject = :subject AND received_at <= :read_began AND processed_at IS NULL AND abandoned_at IS NULL
RETURNING provider, CASE WHEN replayed_at IS NULL THEN extract(epoch FROM processed_at - received_at) END AS took,
          trace_context
"""
)
RECORD_COVERED_FAILURE = f"""
UPDATE webhook_event SET attempts = attempts + 1, last_error = $3 WHERE {_COVERED}
RETURNING attempts
"""
SET_ASIDE_COVERED = f"""
UPDATE webhook_event SET abandoned_at = now(), last_error = $3, attempts = attempts + 1 WHERE {_COVERED}
RETURNING id, provider, event_id, type, attempts, last_error
"""

# --- Crons and operator commands (upkeep.py) ----------------------------------------------------------------
# Pending rows by arrival, through the partial index ix_webhook_event_pending (keyset paging).
PENDING_PAGE = """
SELECT id, provider, event_id, type, attempts, last_error, received_at, request_id, tenant_key, sync_subject,
       trace_context
FROM webhook_event
WHERE processed_at IS NULL AND abandoned_at IS NULL AND received_at < $1
  AND received_at >= $2 AND (received_at > $2 OR id > $3)
ORDER BY received_at, id
LIMIT $4
"""
# The event's advisory lock (held by a running attempt) is taken for the transaction, so a set-aside never
# races an attempt: a row being processed is skipped and looked at again on the next tick.
SET_ASIDE_EXHAUSTED = """
UPDATE webhook_event SET abandoned_at = now()
WHERE id = ANY($1::bigint[]) AND coalesce(abandoned_at, processed_at) IS NULL
  AND pg_try_advisory_xact_lock($2::bigint + id)
RETURNING id, provider, event_id, type, attempts, last_error
"""
DELETE_PROCESSED_BATCH = """
DELETE FROM webhook_event WHERE id IN (
    SELECT id FROM webhook_event
    WHERE processed_at IS NOT NULL AND processed_at < $1 AND abandoned_at IS NULL
    ORDER BY processed_at
    LIMIT $2
)
"""
REOPEN = """
UPDATE webhook_event SET abandoned_at = NULL, attempts = 0
WHERE abandoned_at IS NOT NULL AND processed_at IS NULL AND ($1::bigint IS NULL OR id = $1)
RETURNING id, provider, request_id, tenant_key, trace_context
"""

# A replay: the event new again (its wait since arrival then measures no pipeline).
RESET_FOR_REPLAY = """
UPDATE webhook_event SET processed_at = NULL, abandoned_at = NULL, attempts = 0, last_error = NULL, replayed_at = now()
WHERE id = $1
"""

# --- The operator's reads: CLI, operations page, timelines (reads.py) ----------------------------------------
# A Stripe thin event (its object "v2.core.event") carries no object, only the one it is about: shown as "type id".
_RELATED_OBJECT = (
    "CASE WHEN payload->>'object' = 'v2.core.event' THEN "
    "concat_ws(' ', payload->'related_object'->>'type', payload->'related_object'->>'id') END AS related_object"
)
_RECORD = (
    "id, provider, event_id, type, received_at, processed_at, attempts, last_error, abandoned_at, request_id, "
    f"replayed_at, tenant_key, sync_subject, trace_context, {_RELATED_OBJECT}"
)
STATE_CONDITIONS = {
    "pending": "processed_at IS NULL AND abandoned_at IS NULL AND attempts = 0",
    "failed": "processed_at IS NULL AND abandoned_at IS NULL AND attempts > 0",
    "set_aside": "abandoned_at IS NOT NULL AND processed_at IS NULL",
    "processed": "processed_at IS NOT NULL",
}
# Newest first, a page at a time by id ($5: the last id of the previous page); every filter optional.
PAGE = f"""
SELECT {_RECORD} FROM webhook_event
WHERE ($1::text IS NULL OR provider = $1) AND ($2::text IS NULL OR type = $2)
  AND ($3::text IS NULL OR event_id = $3) AND ($5::bigint IS NULL OR id < $5)
  AND ($6::text IS NULL OR tenant_key = $6) AND {{state}}
ORDER BY id DESC
LIMIT $4
"""
# Every event of some tenants (a workspace's Stripe customer and Clerk organization), newest first: one ordered
# read of ix_webhook_event_tenant_received per tenant, from where the last page ended ($2, $3 = its received_at and
# id), whatever the inbox's size (bench: phase timeline). A statement of its own for the first page: a cursor
# written "$2 IS NULL OR ..." would not be an index condition.
_TENANTS_PAGE = f"""
SELECT e.* FROM unnest($1::text[]) AS tenant(key)
CROSS JOIN LATERAL (
    SELECT {_RECORD} FROM webhook_event
    WHERE tenant_key = tenant.key {{before}}
    ORDER BY received_at DESC, id DESC
    LIMIT $2
) AS e
ORDER BY e.received_at DESC, e.id DESC
LIMIT $2
"""
TENANTS_PAGE = _TENANTS_PAGE.format(before="")
TENANTS_PAGE_BEFORE = _TENANTS_PAGE.format(before="AND (received_at, id) < ($3::timestamptz, $4::bigint)")
# The unprocessed events of some tenants (their jobs wait), oldest first, through ix_webhook_event_tenant.
TENANTS_UNPROCESSED = f"""
SELECT {_RECORD} FROM webhook_event
WHERE tenant_key = ANY($1::text[]) AND processed_at IS NULL AND abandoned_at IS NULL
ORDER BY received_at, id
LIMIT $2
"""
FIND = f"""
SELECT {_RECORD} FROM webhook_event
WHERE (event_id = $1 OR id = $2) AND ($3::text IS NULL OR provider = $3)
ORDER BY id
"""
GET_WITH_PAYLOAD = f"SELECT {_RECORD}, payload::text AS payload FROM webhook_event WHERE id = $1"
# Pipeline latency of the last hour per provider (the processed rows of that hour, by ix_webhook_event_processed);
# replayed events are left out, as webhook_pipeline_seconds leaves them out.
LATENCY_LAST_HOUR = """
SELECT provider, count(*) AS n,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - received_at)) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - received_at)) AS p99
FROM webhook_event WHERE processed_at > now() - interval '1 hour' AND replayed_at IS NULL GROUP BY provider
"""
# Per provider, the unprocessed rows only, read through the partial indexes of pending
# (ix_webhook_event_pending) and set-aside (ix_webhook_event_abandoned) rows: what each scrape of /metrics asks,
# cheap whatever the number of processed rows (tests/ops/test_scrape_query.py). Run after NO_TABLE_SCAN in its
# transaction: without statistics (a new or bulk-loaded table) "abandoned_at IS NOT NULL" looks like most rows,
# and the planner would read the whole table.
NO_TABLE_SCAN = "SET LOCAL enable_seqscan = off"
UNPROCESSED_COUNTS = """
SELECT provider, count(*) FILTER (WHERE attempts = 0) AS pending, count(*) FILTER (WHERE attempts > 0) AS failed,
       0 AS set_aside
FROM webhook_event WHERE processed_at IS NULL AND abandoned_at IS NULL GROUP BY provider
UNION ALL
SELECT provider, 0, 0, count(*) FROM webhook_event WHERE abandoned_at IS NOT NULL GROUP BY provider
"""
# Per provider, the tenants with unprocessed events and the age of the oldest (ix_webhook_event_tenant and
# ix_webhook_event_pending): each scrape asks, so only unprocessed rows are read.
QUEUE_TENANTS = """
SELECT provider, count(DISTINCT tenant_key) AS tenants,
       extract(epoch FROM now() - min(received_at)) AS oldest_seconds
FROM webhook_event WHERE processed_at IS NULL AND abandoned_at IS NULL GROUP BY provider
"""
# The tenants with the most unprocessed events (the overview's), and how many each.
TOP_TENANTS = """
SELECT provider, tenant_key, count(*) AS n, min(received_at) AS oldest FROM webhook_event
WHERE processed_at IS NULL AND abandoned_at IS NULL AND tenant_key IS NOT NULL
GROUP BY provider, tenant_key ORDER BY n DESC, oldest LIMIT $1
"""
# Per provider, the events processed in the last 24 hours, by ix_webhook_event_processed: the operations page's
# overview only (it reads a day of processed rows, so no scrape asks it).
PROCESSED_LAST_DAY = """
SELECT provider, count(*) AS n FROM webhook_event
WHERE processed_at IS NOT NULL AND processed_at > now() - interval '24 hours' GROUP BY provider
"""
