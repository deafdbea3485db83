"""Every statement on identity's tables: ``app_user``, ``workspace``, ``workspace_member`` and ``workspace_change``.

Users are one aggregate (:class:`UserRepository`); a workspace and its members
are another (:class:`WorkspaceRepository`); the change journal a third
(:class:`JournalRepository`). A repository runs its statements in the caller's
session and never commits: the caller's transaction decides. Every write of a
row journals, in the same statement, what it changed (``journal_sql``).
"""

from app.identity.repository.clerk import (
    ClerkChange,
    ClerkDeletion,
    ClerkModel,
    ClerkRows,
    MemberRows,
    UserRepository,
    Version,
    key_column,
)
from app.identity.repository.journal import JournalRepository, JournalRow
from app.identity.repository.workspaces import (
    MemberLimitResult,
    WorkspaceRepository,
    WorkspaceSummary,
    clerk_rows,
)

__all__ = [
    "ClerkChange",
    "ClerkDeletion",
    "ClerkModel",
    "ClerkRows",
    "JournalRepository",
    "JournalRow",
    "MemberLimitResult",
    "MemberRows",
    "UserRepository",
    "Version",
    "WorkspaceRepository",
    "WorkspaceSummary",
    "clerk_rows",
    "key_column",
]
