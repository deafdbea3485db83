"""The house's rules, read from the code: the layers, and which module writes which table.

- ``app/core`` imports nothing of the project above it; each layer imports only
  layers to its left (docs/architecture.md), the entry points aside, which read
  the composition root.
- A module writes only its own tables (and, on a table two modules share, only
  the columns it owns: ``info={"owner": ...}`` on the model); within a feature
  module only its repository writes, and it imports no model it may not write.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from app.core.db import metadata
from app.runtime import all_modules
from tests.unit.sql_writes import Schema, Write, writes

ROOT = Path(__file__).resolve().parents[2]
LAYERS = (
    ("core",),
    ("queue",),
    ("webhooks",),
    ("identity",),
    ("billing",),
    ("clients", "system", "ops"),
    ("worker",),
    ("runtime",),
    ("asgi", "cli"),
    ("testing",),
)
"""Left to right: a layer imports only those before it (``testing``, the test kit, sits above everything)."""
ENTRY_POINTS = {"app/worker/cli.py": {"app.runtime"}}
"""The imports upward that an entry point makes: the worker's command reads ``WORKER_MODULES``."""
FEATURE_MODULES = ("webhooks", "identity", "billing")
"""The modules with tables of their own and a repository: only the repository writes."""


def project_imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every ``app.*`` module a file imports, at the top or inside a function, resolved to absolute names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            found.add(base)
    return {name for name in found if name == "app" or name.startswith("app.")}


def reaching_up(root: Path) -> list[str]:
    return sorted(
        f"{path.relative_to(root)} imports {name}"
        for path in (root / "app" / "core").rglob("*.py")
        for name in project_imports(path, root)
        if not name.startswith("app.core")
    )


def test_the_core_imports_only_the_core() -> None:
    assert not reaching_up(ROOT), "app/core must not reach up:\n" + "\n".join(reaching_up(ROOT))


def test_the_check_sees_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    core = tmp_path / "app" / "core"
    core.mkdir(parents=True)
    (core / "late.py").write_text("def late():\n    from app.worker.cli import run_worker\n")
    (core / "relative.py").write_text("from ..webhooks import inbox\nfrom . import settings\n")
    assert reaching_up(tmp_path) == [
        "app/core/late.py imports app.worker.cli",
        "app/core/relative.py imports app.webhooks",
    ]


def layer_of(name: str) -> int | None:
    """``app.ops.services`` -> the rank of ``ops``; None for ``app`` itself."""
    parts = name.split(".")
    if len(parts) < 2:
        return None
    return next((rank for rank, names in enumerate(LAYERS) if parts[1].removesuffix(".py") in names), None)


def upward_imports(root: Path) -> list[str]:
    found = []
    for path in sorted((root / "app").rglob("*.py")):
        relative = path.relative_to(root)
        own = layer_of(".".join(relative.with_suffix("").parts))
        if own is None:
            continue
        for name in project_imports(path, root):
            other = layer_of(name)
            same_package = name.split(".")[1:2] == list(relative.with_suffix("").parts[1:2])
            allowed = same_package or name in ENTRY_POINTS.get(str(relative), set())
            if other is not None and other >= own and not allowed:
                found.append(f"{relative} imports {name}")
    return found


def test_each_layer_imports_only_the_layers_to_its_left() -> None:
    assert not upward_imports(ROOT), "imports that reach up or sideways:\n" + "\n".join(upward_imports(ROOT))


def test_the_layer_check_sees_a_module_reaching_sideways_or_up(tmp_path: Path) -> None:
    for folder in ("app/ops", "app/identity", "app/worker"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "app/ops/views.py").write_text("from app.system.controllers import HealthController\n")
    (tmp_path / "app/identity/services.py").write_text("def late():\n    from app.billing import sync\n")
    (tmp_path / "app/worker/cli.py").write_text("from app.runtime import WORKER_MODULES\n")
    assert upward_imports(tmp_path) == [
        "app/identity/services.py imports app.billing",
        "app/ops/views.py imports app.system.controllers",
    ]


# Tables ---------------------------------------------------------------------------------------------------


@cache
def schema() -> Schema:
    models = {model.__name__: str(model.__tablename__) for module in all_modules() for model in module.models}
    return Schema({t.name: frozenset(c.name for c in t.columns) for t in metadata.sorted_tables}, models)


@cache
def owners() -> dict[str, dict[str, str]]:
    """Each table's columns -> the module that may write them: the table's, unless the column says otherwise."""
    found = {}
    for module in all_modules():
        for model in module.models:
            table = metadata.tables[str(model.__tablename__)]
            found[table.name] = {column.name: column.info.get("owner", module.name) for column in table.columns}
    return found


def module_writes(module: str) -> Iterator[Write]:
    for path in sorted((ROOT / "app" / module).rglob("*.py")):
        yield from writes(path, ROOT, schema())


def trespasses(module: str, found: list[Write]) -> list[str]:
    """The writes of ``module`` to what another module owns."""
    wrong = []
    for write in found:
        if write.table is None:
            continue
        columns = owners()[write.table]
        if write.columns is not None:
            allowed = all(columns[column] == module for column in write.columns)
        elif "DELETE" in write.how or "TRUNCATE" in write.how or write.how == "delete()":
            allowed = set(columns.values()) == {module}  # whole rows: only a table no one else has columns in
        else:  # columns not written out: it must own some of the table
            allowed = module in columns.values()
        if not allowed:
            wrong.append(str(write))
    return wrong


@pytest.mark.parametrize("module", sorted({module.name for module in all_modules()} | {"worker"}))
def test_no_module_writes_what_another_module_owns(module: str) -> None:
    """E.g. billing writes only billing's tables; identity the workspace row (billing's columns included: billing
    asks identity to write them, so every change of the row is journaled)."""
    wrong = trespasses(module, list(module_writes(module)))
    assert not wrong, f"{module} writes what another module owns (ask that module's service):\n" + "\n".join(wrong)


def is_repository(path: str) -> bool:
    """``repository.py``, a file of a package that holds one (the inbox: ``inbox/repository.py``, ``sql.py``), or
    of a package named ``repository`` (identity's: ``repository/clerk.py``, ``workspaces.py``, ``journal.py``)."""
    in_subpackage = len(Path(path).parts) > 3  # app/<module>/<package>/<file>
    return Path(path).name == "repository.py" or (
        in_subpackage
        and (Path(path).parent.name == "repository" or (ROOT / Path(path).parent / "repository.py").exists())
    )


@pytest.mark.parametrize("module", FEATURE_MODULES)
def test_within_a_feature_module_only_its_repository_writes(module: str) -> None:
    outside = [str(write) for write in module_writes(module) if not is_repository(write.path)]
    assert not outside, f"{module}: statements that belong in its repository:\n" + "\n".join(outside)


@pytest.mark.parametrize("module", FEATURE_MODULES)
def test_a_repository_imports_only_models_its_module_may_write(module: str) -> None:
    """A statement built for a model passed in names no table: this keeps such a repository to its own."""
    may_write = {name for name, table in schema().models.items() if module in owners()[table].values()}
    wrong = []
    for path in sorted((ROOT / "app" / module).rglob("*.py")):
        if is_repository(str(path.relative_to(ROOT))):
            tree = ast.parse(path.read_text())
            imported = {
                alias.name
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(".models")
                for alias in node.names
            }
            models = imported & set(schema().models)  # mixins are no table
            wrong += [f"{path.relative_to(ROOT)} imports {name}" for name in sorted(models - may_write)]
    assert not wrong, "\n".join(wrong)


def foreign_models(root: Path) -> list[str]:
    """Imports of a feature module's models from outside that module."""
    return [
        f"{path.relative_to(root)} imports {name}"
        for path in sorted((root / "app").rglob("*.py"))
        for name in sorted(project_imports(path, root))
        for module in FEATURE_MODULES
        if name == f"app.{module}.models" and path.relative_to(root).parts[1] != module
    ]


def test_a_module_reads_another_modules_rows_through_that_modules_functions() -> None:
    """E.g. the worked example (``app/clients``) asks ``app/identity/directory.py`` for a workspace's members: it
    queries no identity table, so identity can change its tables without breaking it."""
    found = foreign_models(ROOT)
    assert not found, "another module's models (ask that module's functions instead):\n" + "\n".join(found)


def test_the_models_check_sees_a_module_importing_another_modules_models(tmp_path: Path) -> None:
    for folder in ("app/clients", "app/identity"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "app/clients/jobs.py").write_text("from app.identity.models import Workspace\n")
    (tmp_path / "app/identity/services.py").write_text("from app.identity.models import Workspace\n")
    assert foreign_models(tmp_path) == ["app/clients/jobs.py imports app.identity.models"]


def test_the_table_check_sees_sql_statements_and_orm_writes(tmp_path: Path) -> None:
    (tmp_path / "app" / "clients").mkdir(parents=True)
    source = tmp_path / "app" / "clients" / "jobs.py"
    source.write_text(
        '''"""UPDATE workspace SET name = 'in a docstring, not a statement'."""
from sqlalchemy import update
from app.identity.models import Workspace
SET_LIMIT = "UPDATE workspace SET member_limit = :limit WHERE id = :id"
LINK = "INSERT INTO workspace (clerk_org_id, stripe_customer_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
async def link(session, workspace):
    await session.execute(update(Workspace).where(Workspace.id == 1).values(price_id="price_1"))
    workspace.stripe_customer_id = "cus_1"
    setattr(workspace, "name", "x")
'''
    )
    found = writes(source, tmp_path, schema())
    assert sorted(str(write) for write in found) == [
        "app/clients/jobs.py:4 writes workspace (member_limit) (SQL UPDATE)",
        "app/clients/jobs.py:5 writes workspace (clerk_org_id, stripe_customer_id) (SQL INSERT)",
        "app/clients/jobs.py:7 writes workspace (price_id) (update())",
        "app/clients/jobs.py:8 writes workspace (stripe_customer_id) (attribute)",
        "app/clients/jobs.py:9 writes a table it does not name (setattr())",
    ]
    assert sorted(trespasses("billing", found)) == [
        "app/clients/jobs.py:4 writes workspace (member_limit) (SQL UPDATE)",
        "app/clients/jobs.py:5 writes workspace (clerk_org_id, stripe_customer_id) (SQL INSERT)",
        "app/clients/jobs.py:7 writes workspace (price_id) (update())",
        "app/clients/jobs.py:8 writes workspace (stripe_customer_id) (attribute)",
    ]
    assert trespasses("identity", found) == []  # the whole row is identity's, billing's columns included
