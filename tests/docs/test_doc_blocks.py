"""The block reader and the diff applier the documentation checks rest on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.doc_blocks import DocBlockError, Origins, apply_diff, extract_blocks, lint

GUIDE = """# A guide

```python file=app/x.py
import os
```

1. In a list:

   ```diff file=app/y.py
    keep
   -old
   +new
   ```

```bash run
make migrate
```
"""


def test_blocks_keep_their_language_attributes_flags_and_line() -> None:
    python, diff, bash = extract_blocks(GUIDE, "docs/guide.md")

    assert (python.lang, python.file, python.line, python.text) == ("python", "app/x.py", 3, "import os\n")
    assert (diff.lang, diff.file, diff.line, diff.text) == ("diff", "app/y.py", 9, " keep\n-old\n+new\n")
    assert (bash.lang, bash.flags, bash.where) == ("bash", frozenset({"run"}), "docs/guide.md:15")


def test_a_diff_replaces_its_text_found_exactly_once() -> None:
    text = "a = 1\nb = 2\n\nc = 3\n"

    assert apply_diff(text, " a = 1\n-b = 2\n+b = 20\n@@\n \n-c = 3\n+c = 30\n") == "a = 1\nb = 20\n\nc = 30\n"
    with pytest.raises(DocBlockError, match="is not in the file"):
        apply_diff(text, "-b = 3\n+b = 30\n")
    with pytest.raises(DocBlockError, match="occurs 2 times"):
        apply_diff("x\nx\n", "-x\n+y\n")


TEXT = "CLIENTS = 1\nimport a\nimport c\na = 1\nb = 2\nc = 3\n"


@pytest.mark.parametrize(
    "diff",
    [
        " CLIENTS = 1\n+INVOICES = 2\n",
        " import a\n+import b\n import c\n",
        " a = 1\n-b = 2\n+b = 20\n",
        " a = 1\n-b = 2\n",
        " CLIENTS = 1\n+INVOICES = 2\n@@\n-c = 3\n+c = 30\n",
    ],
    ids=["an addition after its context", "an addition between", "a replacement", "a removal", "two changes"],
)
def test_a_diff_already_made_is_kept_as_it_is(diff: str) -> None:
    """A reader who followed a guide has its edits in the tree the checks copy: applying them again changes nothing."""
    once = apply_diff(TEXT, diff)

    assert once != TEXT
    assert apply_diff(once, diff) == once


def test_a_diff_half_made_gets_its_other_changes() -> None:
    diff = " CLIENTS = 1\n+INVOICES = 2\n@@\n-c = 3\n+c = 30\n"
    half = apply_diff(TEXT, " CLIENTS = 1\n+INVOICES = 2\n")

    assert apply_diff(half, diff) == apply_diff(TEXT, diff)


def test_a_document_without_python_blocks_passes(tmp_path: Path) -> None:
    assert lint(tmp_path, Origins(), tmp_path / "cache") == []
