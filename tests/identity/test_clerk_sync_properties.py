"""Property: any order of any repetition of a Clerk history ends at the history's newest state.

Hypothesis draws users, organizations and memberships, each with a history of
changes and maybe a deletion, shuffles every event and delivers each one or
more times (a redelivery keeps its svix id, a replay gets a new one, so the
handlers themselves see repeats). After the last delivery every live row must
hold its newest change, and every deleted object must be deleted at its
deletion time and hold the newest of its changes that arrived before the
deletion (a deletion is the newest change: no older one writes the row after it).
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
    # The change the row must end at: the newest, or once deleted, the newest to arrive before the deletion.
    applied: int | None = None

    @property
    def newest(self) -> tuple[str | None, int | None]:
        return (self.values[self.applied], self.changed_at[self.applied]) if self.applied is not None else (None, None)

    def settle(self, change_arrivals: list[int], deletion_arrival: int | None) -> None:
        """Given when each change and the deletion first arrived, find the change that must end in the row."""
        arrived = [n for n, at in enumerate(change_arrivals) if deletion_arrival is None or at < deletion_arrival]
        self.applied = max(arrived, default=None)  # changes are oldest first


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
    events = [(h, e) for kind, histories in scenario.histories.items() for h in histories for e in _events(kind, h)]
    deliveries = []  # (event number, message id)
    for number in range(len(events)):
        for copy in range(draw(st.integers(1, 3))):
            replay = draw(st.booleans())  # a replay is a new message; a redelivery reuses the svix id
            deliveries.append((number, f"msg_{number}_{copy if replay else 0}"))
    deliveries = draw(st.permutations(deliveries))
    scenario.events = [(message_id, events[number][1]) for number, message_id in deliveries]
    _settle(events, deliveries)
    return scenario


def _settle(events: list[tuple[History, dict[str, Any]]], deliveries: list[tuple[int, str]]) -> None:
    """Each history learns when its events first arrived (a history's events are its changes, then its deletion)."""
    arrivals: dict[int, int] = {}
    for position, (number, _) in enumerate(deliveries):
        arrivals.setdefault(number, position)
    histories: dict[int, tuple[History, list[int]]] = {}
    for number, (history, _) in enumerate(events):
        histories.setdefault(id(history), (history, []))[1].append(arrivals[number])
    for history, times in histories.values():
        if history.deleted_at is None:
            history.settle(times, None)
        else:
            history.settle(times[:-1], times[-1])


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
            if history.applied is not None:
                assert rows[kind][history.clerk_id] == _expected(history)
            elif history.deleted_at is not None:  # no change before the deletion: fields as a membership carried them
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
