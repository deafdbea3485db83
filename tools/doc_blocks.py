"""Check every ```python block of README.md and docs/*.md with ruff check, ruff format --check and mypy.

    python -m tools.doc_blocks [DOCUMENT.md ...]      (`make lint` runs it on every document)

Each block is written to a temporary copy of the project's Python files as a
module of its own, named after its document and line (``docs_jobs_line_123.py``),
and checked with the project's own settings (its ``pyproject.toml``), so a
block must be a complete module, imports included. Two kinds of block change
that copy first, in the order a reader meets them (the example guides first):

- ```python file=app/invoices/jobs.py: a file the guide tells the reader to
  create; it is written at that path, so the guide's later blocks import it;
- ```diff file=app/runtime.py: an edit of an existing file. Lines starting
  with ' ' or '-' are the text to find (exactly once), lines with ' ' or '+'
  its replacement; a line starting with ``@@`` begins another such change.
  A change the tree has already (the reader followed the guide) is kept as it is.

Failures print as ``docs/jobs.md:123: <message>``, 123 being the line in the
document; the exit status is non-zero if there is any.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
EXAMPLE_GUIDES = ("docs/models.md", "docs/jobs.md")
"""The guides that build the invoices example, in the order a reader follows them."""

MYPY_CACHE = ".mypy_cache/doc_blocks"
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<info>.*)$")
_LOCATION = re.compile(r"^(?P<path>[^:\s]+\.py):(?P<line>\d+):(?P<rest>.*)$")
_HUNK = re.compile(r"^@@ -(?P<start>\d+)")


class DocBlockError(Exception):
    """A block cannot be used as written: the message names the document and line."""


@dataclass(frozen=True)
class Block:
    document: str
    """Path of the markdown file, relative to the project root."""
    line: int
    """Line of the opening fence; the block's first line of code is the next one."""
    lang: str
    text: str
    attrs: dict[str, str] = field(default_factory=dict)
    flags: frozenset[str] = frozenset()

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}"

    @property
    def file(self) -> str | None:
        return self.attrs.get("file")

    @property
    def is_python(self) -> bool:
        return self.lang in ("python", "py")


def parse_info(info: str) -> tuple[str, dict[str, str], frozenset[str]]:
    """```python file=app/x.py -> ("python", {"file": "app/x.py"}, {}); bare words are flags (```bash run)."""
    words = shlex.split(info)
    if not words:
        return "", {}, frozenset()
    attrs = dict(word.split("=", 1) for word in words[1:] if "=" in word)
    return words[0], attrs, frozenset(word for word in words[1:] if "=" not in word)


def extract_blocks(text: str, document: str) -> list[Block]:
    """The fenced blocks of a markdown text, their indentation (a block inside a list item) removed."""
    blocks: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body, end = _block_body(lines, index + 1, indent, fence, f"{document}:{index + 1}")
        lang, attrs, flags = parse_info(opening["info"])
        blocks.append(Block(document, index + 1, lang, "".join(f"{line}\n" for line in body), attrs, flags))
        index = end + 1
    return blocks


def _block_body(lines: Sequence[str], start: int, indent: int, fence: str, where: str) -> tuple[list[str], int]:
    for end in range(start, len(lines)):
        if lines[end].strip() == fence:
            return [_dedent(line, indent) for line in lines[start:end]], end
    raise DocBlockError(f"{where}: the block opened here is never closed.")


def _dedent(line: str, indent: int) -> str:
    """The fence's indentation removed (or what there is of it: a blank line may have less)."""
    return line[min(indent, len(line) - len(line.lstrip(" "))) :]


def read_blocks(root: Path, document: str) -> list[Block]:
    return extract_blocks((root / document).read_text(encoding="utf-8"), document)


def diff_changes(diff: str) -> list[tuple[list[str], list[str]]]:
    """A diff block's changes as (lines to find, replacement lines); ``@@`` lines separate them."""
    changes: list[tuple[list[str], list[str]]] = []
    old: list[str] = []
    new: list[str] = []
    for line in [*diff.splitlines(), "@@"]:
        if line.startswith("@@"):
            if old or new:
                changes.append((old, new))
            old, new = [], []
            continue
        marker, content = (line[:1], line[1:]) if line else (" ", "")
        if marker not in " -+":
            raise DocBlockError(f"diff line {line!r} starts with neither ' ', '-', '+' nor '@@'")
        if marker in " -":
            old.append(content)
        if marker in " +":
            new.append(content)
    return changes


def apply_diff(text: str, diff: str) -> str:
    """Each change's lines must occur exactly once, as consecutive whole lines; a change already made is kept.

    A change counts as made when its replacement occurs once and its text to
    find does not, or only inside that replacement (an addition after a context
    line). The checks copy the reader's tree, and a reader who followed the
    guides has their edits there, committed or not; no pristine tree to start
    from exists once they are committed (git's HEAD then has them too), and
    HEAD is not what `make lint` is asked about, the working tree is.
    """
    lines = text.splitlines()
    for old, new in diff_changes(diff):
        if _made(lines, old, new):
            continue
        starts = _occurrences(lines, old)
        if len(starts) != 1 or not old:
            found = "is not in the file (has the code changed?)" if not starts else f"occurs {len(starts)} times"
            raise DocBlockError(f"the text to change {found}: {old[0] if old else '(empty)'!r}")
        lines[starts[0] : starts[0] + len(old)] = new
    return "".join(f"{line}\n" for line in lines)


def _occurrences(lines: Sequence[str], wanted: Sequence[str]) -> list[int]:
    """Where ``wanted`` starts as consecutive whole lines of ``lines``."""
    if not wanted:
        return []
    return [at for at in range(len(lines) - len(wanted) + 1) if lines[at : at + len(wanted)] == wanted]


def _made(lines: Sequence[str], old: Sequence[str], new: Sequence[str]) -> bool:
    found = _occurrences(lines, new)
    if len(found) != 1:
        return False
    start, end = found[0], found[0] + len(new)
    return all(start <= at and at + len(old) <= end for at in _occurrences(lines, old))


def apply_guide(tree: Path, blocks: Iterable[Block]) -> list[tuple[Block, Path]]:
    """Write the guide's ``file=`` python blocks and apply its ``file=`` diffs, in order; each with its path."""
    touched: list[tuple[Block, Path]] = []
    for block in blocks:
        if block.lang == "diff" and not block.file:
            raise DocBlockError(f"{block.where}: a diff block names the file it edits (```diff file=PATH).")
        if not block.file or not (block.is_python or block.lang == "diff"):
            continue
        path = tree / block.file
        try:
            if block.is_python:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(block.text, encoding="utf-8")
            else:
                path.write_text(apply_diff(path.read_text(encoding="utf-8"), block.text), encoding="utf-8")
        except (DocBlockError, OSError) as exc:
            raise DocBlockError(f"{block.where}: {block.file}: {exc}") from None
        touched.append((block, path))
    return touched


def documents(root: Path) -> list[str]:
    """README.md, then the example guides in reading order, then the other guides."""
    guides = sorted(str(path.relative_to(root)) for path in (root / "docs").glob("*.md"))
    ordered = [guide for guide in EXAMPLE_GUIDES if guide in guides]
    return ["README.md", *ordered, *(guide for guide in guides if guide not in ordered)]


def tracked_files(root: Path, pattern: str | None = None) -> list[str]:
    """The files git tracks; outside a git checkout (an unpacked archive), every file but hidden ones."""
    command = ["git", "ls-files", "-z", *([pattern] if pattern else [])]
    listed = subprocess.run(command, cwd=root, capture_output=True)
    if listed.returncode != 0:
        found = (path.relative_to(root) for path in root.rglob(pattern or "*") if path.is_file())
        return sorted(str(path) for path in found if not any(part.startswith(".") for part in path.parts))
    return [name for name in listed.stdout.decode().split("\0") if name and (root / name).is_file()]


def copy_files(root: Path, names: Iterable[str], dest: Path) -> None:
    """Copied with their times, so mypy's cache knows them again."""
    for name in names:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, dest / name)


@dataclass
class Origins:
    """Where each checked file of the tree comes from, to report a failure at its line in the documents."""

    modules: dict[str, Block] = field(default_factory=dict)
    diffs: dict[str, Block] = field(default_factory=dict)
    others: set[str] = field(default_factory=set)
    """Files checked as they are (a migration the guides generate)."""

    def locate(self, path: str, line: int) -> str:
        if path in self.modules:
            block = self.modules[path]
            return f"{block.document}:{block.line + line}:"
        if path in self.diffs:
            return f"{self.diffs[path].where}: {path}:{line}:"
        return f"{path}:{line}:"

    def files(self) -> list[str]:
        return sorted({*self.modules, *self.diffs, *self.others})

    def add(self, written: Iterable[tuple[Block, Path]], tree: Path) -> None:
        for block, path in written:
            target = self.modules if block.is_python else self.diffs
            target[str(path.relative_to(tree))] = block


def module_name(block: Block) -> str:
    stem = re.sub(r"\W", "_", block.document.removesuffix(".md").lower())
    return f"{stem}_line_{block.line}.py"


def build_tree(root: Path, tree: Path, names: Sequence[str]) -> Origins:
    """The project's Python files, the documents' blocks written and applied, each block's module."""
    copy_files(root, [*tracked_files(root, "*.py"), "pyproject.toml"], tree)
    origins = Origins()
    for document in names:
        blocks = read_blocks(root, document)
        origins.add(apply_guide(tree, blocks), tree)
        for block in blocks:
            if block.is_python and not block.file:
                (tree / module_name(block)).write_text(block.text, encoding="utf-8")
                origins.modules[module_name(block)] = block
    return origins


def _run(tree: Path, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=tree, capture_output=True, text=True)


def _located(output: str, origins: Origins) -> list[str]:
    failures = []
    for line in output.splitlines():
        found = _LOCATION.match(line)
        if found:
            failures.append(f"{origins.locate(found['path'], int(found['line']))}{found['rest']}")
    return failures


def ruff_check(tree: Path, origins: Origins) -> list[str]:
    result = _run(tree, [str(BIN / "ruff"), "check", "--quiet", "--output-format", "concise", *origins.files()])
    return [f"{line} (ruff)" for line in _located(result.stdout, origins)]


def ruff_format(tree: Path, origins: Origins) -> list[str]:
    """One failure per changed stretch, at its first line, with ruff's diff of it."""
    result = _run(tree, [str(BIN / "ruff"), "format", "--diff", "--quiet", *origins.files()])
    failures: list[str] = []
    path = ""
    for line in result.stdout.splitlines():
        if line.startswith("--- "):
            path = line[4:].strip()
        elif (hunk := _HUNK.match(line)) is not None:
            failures.append(f"{origins.locate(path, int(hunk['start']))} ruff format would change this:")
        elif failures and not line.startswith("+++ "):
            failures[-1] += f"\n    {line}"
    if result.returncode != 0 and not failures:
        failures.append(f"ruff format failed: {result.stderr.strip()}")
    return failures


def mypy(tree: Path, origins: Origins, cache_dir: Path) -> list[str]:
    # Module names from the tree's root: tests/ has no __init__.py, and a test imports its neighbours by them.
    options = ["--no-error-summary", "--explicit-package-bases", "--cache-dir", str(cache_dir)]
    command = [str(BIN / "mypy"), *options, *origins.files()]
    result = _run(tree, command)
    failures = [f"{line} (mypy)" for line in _located(result.stdout, origins)]
    if result.returncode != 0 and not failures:
        failures.append(f"mypy failed: {(result.stdout + result.stderr).strip()}")
    return failures


def lint(tree: Path, origins: Origins, cache_dir: Path) -> list[str]:
    if not origins.files():  # documents without a python block: nothing to check (mypy refuses no files)
        return []
    return [*ruff_check(tree, origins), *ruff_format(tree, origins), *mypy(tree, origins, cache_dir)]


def check(root: Path, names: Sequence[str], cache_dir: Path | None = None) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="doc-blocks-") as tmp:
        tree = Path(tmp)
        try:
            origins = build_tree(root, tree, names)
        except DocBlockError as exc:
            return [str(exc)]
        return lint(tree, origins, cache_dir or root / MYPY_CACHE)


def with_prerequisites(names: Sequence[str]) -> list[str]:
    """An example guide builds on the ones before it (docs/jobs.md on docs/models.md): they come first."""
    needed: list[str] = []
    for name in names:
        if name in EXAMPLE_GUIDES:
            needed += [guide for guide in EXAMPLE_GUIDES[: EXAMPLE_GUIDES.index(name)] if guide not in needed]
        if name not in needed:
            needed.append(name)
    return needed


def main(argv: Sequence[str]) -> int:
    names = with_prerequisites(argv) if argv else documents(ROOT)
    failures = check(ROOT, names)
    for failure in failures:
        print(failure)
    if failures:
        print(f"doc_blocks: {len(failures)} failure(s) in the python blocks of {', '.join(names)}.", file=sys.stderr)
        return 1
    print(f"doc_blocks: every python block of {', '.join(names)} passes ruff and mypy.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
