"""Reading the change journal (``workspace_change``) in tests: what a scenario wrote, oldest first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from app.core.db import Database
from app.identity.models import WorkspaceChange


@dataclass(frozen=True)
class Change:
    source: str
    entity: str
    entity_id: int
    workspace_id: int | None
    changes: dict[str, list[Any]]

    def columns(self) -> set[str]:
        return set(self.changes)


async def journal(db: Database, *, entity: str | None = None) -> list[Change]:
    query = select(WorkspaceChange).order_by(WorkspaceChange.id)
    if entity is not None:
        query = query.where(WorkspaceChange.entity == entity)
    async with db.session() as session:
        rows = (await session.scalars(query)).all()
    return [Change(row.source, row.entity, row.entity_id, row.workspace_id, row.changes) for row in rows]
