"""Clerk's end state: each user, organization and membership, by the webhooks alone and after reconciliation.

Before the Clerk reconciliation (``webhooks_alone``, on a snapshot), every
entity none of whose events the endpoint outage dropped must already be what its
events say (the ordering rules of docs/architecture.md, identity): reconciliation must not be what
makes the webhook path look right. After it (``reconciled``), every entity must
be as Clerk holds it (``ClerkControl``): one Clerk still has holds its newest
version, not deleted; one Clerk no longer has holds one of its versions whole (or
none) and is deleted, at its deletion event's time when that was delivered, at
the reconciliation's otherwise, or has no row at all if nothing ever made one. A
dropped event whose entity is still wrong after reconciliation is lost.
"""

from __future__ import annotations

from typing import Any

from bench.soak.clerk_state import ClerkControl
from bench.soak.findings import Findings, ms
from bench.soak.plan import ClerkEntity, Membership, Plan
from bench.soak.runtime import Db

Rows = dict[str, dict[str, Any]]  # kind -> the Clerk id -> its row
_QUERIES = {
    "user": "SELECT clerk_user_id AS key, email, first_name, last_name, clerk_updated_at, deleted_at FROM app_user",
    "organization": (
        "SELECT clerk_org_id AS key, name, slug, clerk_updated_at, deleted_at FROM workspace "
        "WHERE clerk_org_id IS NOT NULL"
    ),
    "organizationMembership": (
        "SELECT m.clerk_membership_id AS key, m.role, m.clerk_updated_at, m.deleted_at, w.clerk_org_id, "
        "u.clerk_user_id FROM workspace_member m JOIN workspace w ON w.id = m.workspace_id "
        "JOIN app_user u ON u.id = m.user_id"
    ),
}
_LABEL = {"user": "user", "organization": "organization", "organizationMembership": "membership"}
_TIMES = ("clerk_updated_at", "deleted_at")


async def clerk_rows(db: Db) -> dict[str, Rows]:
    """Every Clerk-synced row, by kind and Clerk id."""
    return {kind: {r["key"]: dict(r) for r in await db.fetch(query)} for kind, query in _QUERIES.items()}


def _fields(entity: ClerkEntity, version: dict[str, Any]) -> dict[str, Any]:
    """The row's columns for one version (``updated_at`` None: no version, only what a membership carried)."""
    fields = {name: version[name] for name in version if name != "updated_at"}
    if isinstance(entity, Membership):
        assert entity.org is not None and entity.user is not None
        fields.update(clerk_org_id=entity.org.clerk_id, clerk_user_id=entity.user.clerk_id)
    return {**fields, "clerk_updated_at": version["updated_at"]}


def _held(entity: ClerkEntity, row: dict[str, Any]) -> dict[str, Any]:
    """The version a deleted row holds, whole: the one its ``clerk_updated_at`` names, or none.

    A deletion is the newest change of its object: a version arriving after it
    writes nothing, and which versions came first (sent newest first, shuffled or
    concurrently) is not known here. No ``clerk_updated_at``: its fields are what a
    membership or the deletion carried.
    """
    held = ms(row["clerk_updated_at"])
    if held is None:
        return {**{name: row[name] for name in entity.newest if name != "updated_at"}, "updated_at": None}
    return next((version for version in entity.versions if version["updated_at"] == held), entity.newest)


class ClerkCheck:
    def __init__(self, plan: Plan, clerk: ClerkControl, findings: Findings) -> None:
        self.clerk = clerk
        self.findings = findings
        self.entities: list[ClerkEntity] = []
        for bundle in plan.bundles:
            self.entities += [bundle.org, *bundle.users, *bundle.memberships]
        self.entities = [e for e in self.entities if all(event.emitted for event in e.events)]

    def webhooks_alone(self, rows: dict[str, Rows]) -> None:
        for entity in self.entities:
            if not any(event.dropped for event in entity.events):
                row = rows[entity.kind].get(entity.clerk_id)
                self._compare(entity, row, self._by_events(entity, row), when=" (webhooks alone)")

    def reconciled(self, rows: dict[str, Rows]) -> None:
        for entity in self.entities:
            self.findings.entities_checked += 1
            row = rows[entity.kind].get(entity.clerk_id)
            deletion = next((event for event in entity.events if event.type.endswith(".deleted")), None)
            if not self.clerk.gone(entity):
                right = self._compare(entity, row, {**_fields(entity, entity.newest), "deleted_at": None})
            elif deletion is not None and not deletion.dropped:
                right = self._compare(entity, row, self._by_events(entity, row))
            elif row is None:
                right = True  # never stored, and Clerk no longer has it
            else:  # deleted by reconciliation, at its time: only that it is deleted is known
                want = {**_fields(entity, _held(entity, row)), "deleted_at": "any time"}
                right = self._compare(entity, {**row, "deleted_at": "any time" if row["deleted_at"] else None}, want)
            if not right:
                self.findings.dropped_lost += sum(1 for event in entity.events if event.dropped)

    @staticmethod
    def _by_events(entity: ClerkEntity, row: dict[str, Any] | None) -> dict[str, Any]:
        """What the entity's events make of it: the newest version, or for a deleted one the version it holds."""
        version = entity.newest if entity.deleted_ms is None or row is None else _held(entity, row)
        return {**_fields(entity, version), "deleted_at": entity.deleted_ms}

    def _compare(self, entity: ClerkEntity, row: dict[str, Any] | None, want: dict[str, Any], when: str = "") -> bool:
        what = _LABEL[entity.kind] + when
        if row is None:
            self.findings.mismatch(what, entity.clerk_id, {}, want)
            return False
        got = {k: (ms(row[k]) if k in _TIMES and not isinstance(row[k], str) else row[k]) for k in want}
        if got != want:
            self.findings.mismatch(what, entity.clerk_id, got, want)
            return False
        return True
