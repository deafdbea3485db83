"""Property: any order of any repetition of a Clerk history ends at the history's newest state.

Hypothesis draws users, organizations and memberships, each with a history of
changes and maybe a deletion, shuffles every event and delivers each one or
more times (a redelivery keeps its svix id, a replay gets a new one, so the
handlers themselves see repeats). After the last delivery every row must hold
its newest change, and every deleted object must be deleted at its deletion time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text

from app.core.resources import Resources
from app.identity.models import AppUser, Workspace, WorkspaceMember
from app.identity.services import clerk_time
from app.testing import Delivery, clerk_event, process_delivery, signed_clerk_delivery

T0 = 1_750_000_000_000
NAMES = ("Ada", "Grace", "Edsger", "Barbara")
ROLES = ("org:admin", "org:member")


@dataclass
class History:
    """One Clerk object's events, oldest first: its field value per change, then maybe its deletion time."""

    clerk_id: str
    values: list[str]
    changed_at: list[int]
    deleted_at: int | None
    links: tuple[str, str] | None = None  # a membership's (organization id, user id)

    @property
    def newest(self) -> tuple[str | None, int | None]:
        return (self.values[-1], self.changed_at[-1]) if self.values else (None, None)


@dataclass
class Scenario:
    histories: dict[str, list[History]] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (message id, event)


def _history(
    draw: st.DrawFn, clerk_id: str, values: st.SearchStrategy[str], clock: list[int], must_exist: bool
) -> History:
    changes = draw(st.lists(values, min_size=1 if must_exist else 0, max_size=3))
    deleted = draw(st.booleans())
    times = []
    for _ in changes:
        clock[0] += draw(st.integers(1, 5_000))
        times.append(clock[0])
    clock[0] += 1
    return History(clerk_id, changes, times, clock[0] if deleted else None)


def _membership_data(history: History, value: str | None) -> dict[str, Any]:
    assert history.links is not None
    base = clerk_event("organizationMembership.created")["data"]
    org_id, user_id = history.links
    return {
        "id": history.clerk_id,
        "role": value,
        "organization": {**base["organization"], "id": org_id, "name": "carried"},
        "public_user_data": {**base["public_user_data"], "user_id": user_id},
    }


def _events(kind: str, history: History) -> list[dict[str, Any]]:
    field_name = {"user": "first_name", "organization": "name", "organizationMembership": "role"}[kind]
    events = []
    for position, (value, at) in enumerate(zip(history.values, history.changed_at, strict=True)):
        data = _membership_data(history, value) if history.links else {"id": history.clerk_id, field_name: value}
        action = "created" if position == 0 else "updated"
        events.append(clerk_event(f"{kind}.{action}", timestamp=at, **data))
    if history.deleted_at is not None:
        data = _membership_data(history, None) if history.links else {"id": history.clerk_id}
        events.append(clerk_event(f"{kind}.deleted", timestamp=history.deleted_at, **data))
    return events


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    clock = [T0]
    users = [_history(draw, f"user_{n}", st.sampled_from(NAMES), clock, False) for n in range(draw(st.integers(1, 2)))]
    orgs = [_history(draw, f"org_{n}", st.sampled_from(NAMES), clock, False) for n in range(draw(st.integers(1, 2)))]
    members = []
    for n in range(draw(st.integers(0, 3))):
        history = _history(draw, f"orgmem_{n}", st.sampled_from(ROLES), clock, True)
        history.links = (draw(st.sampled_from(orgs)).clerk_id, draw(st.sampled_from(users)).clerk_id)
        members.append(history)
    scenario = Scenario({"user": users, "organization": orgs, "organizationMembership": members})
    events = [event for kind, histories in scenario.histories.items() for h in histories for event in _events(kind, h)]
    for number, event in enumerate(events):
        for copy in range(draw(st.integers(1, 3))):
            replay = draw(st.booleans())  # a replay is a new message; a redelivery reuses the svix id
            scenario.events.append((f"msg_{number}_{copy if replay else 0}", event))
    scenario.events = draw(st.permutations(scenario.events))
    return scenario


async def _empty_tables(resources: Resources) -> None:
    async with resources.db.session() as session:
        await session.execute(
            text("TRUNCATE workspace_member, app_user, workspace, webhook_event RESTART IDENTITY CASCADE")
        )
        await session.commit()


async def _rows(resources: Resources) -> dict[str, dict[str, tuple[Any, ...]]]:
    """Each table's rows as (field, clerk_updated_at, deleted_at[, org id, user id]) keyed by Clerk id."""
    async with resources.db.session() as session:
        users = {u.id: u for u in (await session.scalars(select(AppUser))).all()}
        orgs = {w.id: w for w in (await session.scalars(select(Workspace))).all()}
        members = (await session.scalars(select(WorkspaceMember))).all()
    return {
        "user": {u.clerk_user_id: (u.first_name, u.clerk_updated_at, u.deleted_at) for u in users.values()},
        "organization": {w.clerk_org_id or "": (w.name, w.clerk_updated_at, w.deleted_at) for w in orgs.values()},
        "organizationMembership": {
            m.clerk_membership_id: (
                m.role,
                m.clerk_updated_at,
                m.deleted_at,
                orgs[m.workspace_id].clerk_org_id,
                users[m.user_id].clerk_user_id,
            )
            for m in members
        },
    }


def _expected(history: History) -> tuple[Any, ...]:
    value, at = history.newest
    state = (value, clerk_time(at) if at else None, clerk_time(history.deleted_at) if history.deleted_at else None)
    return state + history.links if history.links else state


def _assert_newest_state(scenario: Scenario, rows: dict[str, dict[str, tuple[Any, ...]]]) -> None:
    referenced: dict[str, set[str]] = {"organization": set(), "user": set()}
    for member in scenario.histories["organizationMembership"]:
        assert member.links is not None
        referenced["organization"].add(member.links[0])
        referenced["user"].add(member.links[1])
    for kind, histories in scenario.histories.items():
        for history in histories:
            if history.values:
                assert rows[kind][history.clerk_id] == _expected(history)
            elif history.deleted_at is not None:  # only ever deleted: its fields are whatever a membership carried
                assert rows[kind][history.clerk_id][1:] == _expected(history)[1:]
            elif history.clerk_id in referenced.get(kind, set()):
                assert rows[kind][history.clerk_id][1:] == (None, None), "a minimal row has no Clerk version"
            else:
                assert history.clerk_id not in rows[kind]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=scenarios())
async def test_any_order_and_repetition_of_a_clerk_history_ends_at_its_newest_state(
    clerk_worker: Resources, webhook_secrets: dict[str, str], scenario: Scenario
) -> None:
    await _empty_tables(clerk_worker)
    for message_id, event in scenario.events:
        delivery: Delivery = signed_clerk_delivery(event, webhook_secrets["clerk"], msg_id=message_id)
        assert (await process_delivery(clerk_worker, delivery)).processed

    _assert_newest_state(scenario, await _rows(clerk_worker))
