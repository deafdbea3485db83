"""Which tables (and columns) a source file writes, read from its code: SQL text, SQLAlchemy statements, ORM writes.

What is read, per file:

- SQL in string literals (docstrings aside): ``INSERT INTO t (columns)`` (and
  its ``DO UPDATE SET``), ``UPDATE t SET columns``, ``DELETE FROM t``,
  ``TRUNCATE t``; names that are no table of the project are ignored;
- SQLAlchemy's ``insert(X)``, ``update(X)``, ``delete(X)`` (imported from
  ``sqlalchemy``), with the columns of their ``.values(...)`` and ``set_=``;
- ORM writes: ``session.add/add_all/delete/merge(...)``, ``setattr(...)``, and
  ``x.column = ...`` where ``column`` is a column of a model the file imports.

A write whose table the code does not name (a statement built for a model
passed in, an ORM object) is reported with ``table=None``: only a repository
may write that way. Columns are ``None`` when not known (a whole-row write).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

_INSERT = re.compile(r'\bINSERT\s+INTO\s+"?(\w+)"?\s*(?:\(([^)]*)\))?', re.IGNORECASE)
_UPSERT_SET = re.compile(r"\bDO\s+UPDATE\s+SET\s+(.*?)(?:\bWHERE\b|\bRETURNING\b|\)\s*$|$)", re.IGNORECASE | re.DOTALL)
_UPDATE = re.compile(
    r'(?<!\bFOR\s)(?<!\bDO\s)\bUPDATE\s+"?(\w+)"?(?:\s+(?:AS\s+)?\w+)?\s+SET\s+(.*?)(?:\bFROM\b|\bWHERE\b|\bRETURNING\b|$)',
    re.IGNORECASE | re.DOTALL,
)
_DELETE = re.compile(r'\bDELETE\s+FROM\s+"?(\w+)', re.IGNORECASE)
_TRUNCATE = re.compile(r"\bTRUNCATE\s+(?:TABLE\s+)?([\w\s,\"]+)", re.IGNORECASE)
_ASSIGNED = re.compile(r"(?:^|,)\s*(\w+)\s*=(?!=)")
_SESSION_WRITES = {"add", "add_all", "delete", "merge"}


@dataclass(frozen=True)
class Write:
    path: str
    line: int
    table: str | None
    columns: frozenset[str] | None
    how: str

    def __str__(self) -> str:
        columns = f" ({', '.join(sorted(self.columns))})" if self.columns else ""
        return f"{self.path}:{self.line} writes {self.table or 'a table it does not name'}{columns} ({self.how})"


@dataclass(frozen=True)
class Schema:
    """The project's tables: each one's columns, and each model class's table."""

    columns: Mapping[str, frozenset[str]]
    models: Mapping[str, str]


def writes(path: Path, root: Path, schema: Schema) -> list[Write]:
    tree = ast.parse(path.read_text(), filename=str(path))
    name = str(path.relative_to(root))
    docstrings = {id(node) for node in _docstrings(tree)}
    sqlalchemy_dml = _imported_from(tree, "sqlalchemy") & {"insert", "update", "delete"}
    imported_models = {model for model in _imported_from(tree, "app.") if model in schema.models}
    chained = _chained_calls(tree)
    found: list[Write] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += _sql_writes(name, node.lineno, node.value, schema)
        elif isinstance(node, ast.Call):
            found += _call_writes(name, node, sqlalchemy_dml, chained, schema)
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            found += _attribute_writes(name, node, imported_models, schema)
    return found


def _docstrings(tree: ast.Module) -> Iterator[ast.Constant]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                yield first.value
        if isinstance(node, ast.ClassDef | ast.Module):  # attribute docstrings: a string right after an assignment
            for before, after in zip(node.body, node.body[1:], strict=False):
                assigned = isinstance(before, ast.Assign | ast.AnnAssign)
                if assigned and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                    yield after.value


def _imported_from(tree: ast.Module, prefix: str) -> set[str]:
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(prefix)
        for alias in node.names
    }


def _columns(text: str | None, table: str, schema: Schema) -> frozenset[str] | None:
    if text is None:
        return None
    return frozenset(column for column in re.split(r"[\s,\"]+", text) if column in schema.columns[table]) or None


def _sql_writes(path: str, line: int, sql: str, schema: Schema) -> list[Write]:
    found = []
    for match in _INSERT.finditer(sql):
        table = match.group(1).lower()
        if table in schema.columns:
            columns = _columns(match.group(2), table, schema)
            upsert = _UPSERT_SET.search(sql, match.end())
            if upsert is not None and columns is not None:
                columns |= frozenset(c for c in _ASSIGNED.findall(upsert.group(1)) if c in schema.columns[table])
            found.append(Write(path, line, table, columns, "SQL INSERT"))
    for match in _UPDATE.finditer(sql):
        table = match.group(1).lower()
        if table in schema.columns:
            assigned = [c for c in _ASSIGNED.findall(match.group(2)) if c in schema.columns[table]]
            found.append(Write(path, line, table, frozenset(assigned) or None, "SQL UPDATE"))
    for match in _DELETE.finditer(sql):
        if match.group(1).lower() in schema.columns:
            found.append(Write(path, line, match.group(1).lower(), None, "SQL DELETE"))
    for match in _TRUNCATE.finditer(sql):
        for table in re.split(r"[\s,\"]+", match.group(1).lower()):
            if table in schema.columns:
                found.append(Write(path, line, table, None, "SQL TRUNCATE"))
    return found


def _call_writes(
    path: str, call: ast.Call, dml: set[str], chained: Mapping[int, list[ast.Call]], schema: Schema
) -> list[Write]:
    func = call.func
    if isinstance(func, ast.Name) and func.id in dml:
        table = _model_table(call.args[0], schema) if call.args else None
        columns = None if func.id == "delete" else _values_columns(chained.get(id(call), []), table, schema)
        return [Write(path, call.lineno, table, columns, f"{func.id}()")]
    if isinstance(func, ast.Name) and func.id == "setattr":
        return [Write(path, call.lineno, None, None, "setattr()")]
    on_session = isinstance(func, ast.Attribute) and ast.unparse(func.value).lower().endswith("session")
    if on_session and isinstance(func, ast.Attribute) and func.attr in _SESSION_WRITES:
        first = call.args[0] if call.args else None
        table = _model_table(first.func, schema) if isinstance(first, ast.Call) else None
        return [Write(path, call.lineno, table, None, f"session.{func.attr}()")]
    return []


def _model_table(node: ast.expr, schema: Schema) -> str | None:
    if isinstance(node, ast.Attribute) and node.attr == "__table__":
        node = node.value
    return schema.models.get(node.id) if isinstance(node, ast.Name) else None


def _chained_calls(tree: ast.Module) -> dict[int, list[ast.Call]]:
    """For each call, the calls chained on it: ``insert(X).values(...).on_conflict_do_update(set_=...)``."""
    chained: dict[int, list[ast.Call]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            inner = node.func.value
            while isinstance(inner, ast.Call | ast.Attribute):
                if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name):
                    chained.setdefault(id(inner), []).append(node)
                    break
                inner = inner.func if isinstance(inner, ast.Call) else inner.value
    return chained


def _values_columns(chain: list[ast.Call], table: str | None, schema: Schema) -> frozenset[str] | None:
    """The columns ``.values(...)`` and ``set_=`` name, when every one is written out (else None: unknown)."""
    if table is None:
        return None
    names: set[str] = set()
    for call in chain:
        if not isinstance(call.func, ast.Attribute) or call.func.attr not in ("values", "on_conflict_do_update"):
            continue
        given = [keyword for keyword in call.keywords if call.func.attr == "values" or keyword.arg == "set_"]
        dicts = [*(keyword.value for keyword in given if keyword.arg == "set_"), *call.args]
        for keyword in given:
            if keyword.arg is None:
                return None
            if keyword.arg != "set_":
                names.add(keyword.arg)
        for value in dicts:
            if not isinstance(value, ast.Dict) or not all(isinstance(key, ast.Constant) for key in value.keys):
                return None
            names.update(str(key.value) for key in value.keys if isinstance(key, ast.Constant))
    return frozenset(name for name in names if name in schema.columns[table]) or None


def _attribute_writes(
    path: str, node: ast.Assign | ast.AugAssign | ast.AnnAssign, models: set[str], schema: Schema
) -> list[Write]:
    given = node.targets if isinstance(node, ast.Assign) else [node.target]
    targets = [part for target in given for part in (target.elts if isinstance(target, ast.Tuple) else [target])]
    found = []
    for target in targets:
        if not isinstance(target, ast.Attribute) or ast.unparse(target.value) in ("self", "cls"):
            continue
        tables = {schema.models[model] for model in models if target.attr in schema.columns[schema.models[model]]}
        if tables:
            table = tables.pop() if len(tables) == 1 else None
            found.append(Write(path, node.lineno, table, frozenset({target.attr}), "attribute"))
    return found
