"""How secrets are kept out of what leaves the process: URLs shown without passwords, scrubbed text.

What is secret is decided by :meth:`app.core.settings.Settings.secret_values`;
this module only knows how to hide it, so it imports nothing of ours.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

FILTERED = "[Filtered]"
# Shorter values would match ordinary words and numbers all over the logs.
MIN_SECRET_LENGTH = 6


def _password_span(url: str) -> tuple[int, int] | None:
    """Where the password of ``scheme://user:password@host...`` is, by plain string search.

    No URL parser: the URLs this shows are often the ones that do not parse.
    The last ``@`` ends the user info, so a password holding an unescaped ``@``
    or ``/`` is hidden whole (an ``@`` further on hides a little too much).
    """
    scheme_end = url.find("://")
    start = 0 if scheme_end < 0 else scheme_end + 3
    at = url.rfind("@", start)
    colon = url.find(":", start, at) if at >= 0 else -1
    if colon < 0:
        return None
    return colon + 1, at


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***``: the only form of a URL a message may show."""
    span = _password_span(url)
    if span is None:
        return url
    return f"{url[: span[0]]}***{url[span[1] :]}"


def url_passwords(url: str) -> tuple[str, ...]:
    """The URL's password as written (percent-encoded) and decoded, as either may reach a message."""
    span = _password_span(url)
    if span is None or span[0] == span[1]:
        return ()
    written = url[span[0] : span[1]]
    decoded = unquote(written)
    return (written,) if decoded == written else (written, decoded)


def written_forms(secret: str) -> set[str]:
    """The secret as rendered text may carry it: as it is, inside a ``repr`` and inside a JSON string.

    A JSON string escapes quotes, backslashes and control characters (msgspec's
    and ``json.dumps``' escapes; the latter's ASCII ones for non-ASCII too), a
    ``repr`` escapes its own set; an object's repr inside a JSON string carries
    both. For the usual secrets (letters, digits, ``_`` and ``-``) every form is
    the secret itself.
    """
    forms = {secret}
    for _ in range(2):
        forms |= {
            escaped
            for form in forms
            for escaped in (repr(form)[1:-1], json.dumps(form, ensure_ascii=False)[1:-1], json.dumps(form)[1:-1])
        }
    return forms


class SecretScrubber:
    """Replaces every configured secret inside strings with ``[Filtered]``.

    One compiled pattern (longest values first, so a secret holding another is
    removed whole); with no secret configured it does nothing at all. With
    ``written=True`` it also finds each secret as a rendered line writes it
    (:func:`written_forms`): for text that was already rendered, such as a whole log line.
    """

    def __init__(self, secrets: Iterable[str], *, written: bool = False) -> None:
        values = {value for value in secrets if len(value) >= MIN_SECRET_LENGTH}
        if written:
            values = {form for value in values for form in written_forms(value)}
        kept = sorted(values, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, kept))) if kept else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def found_in(self, value: str) -> bool:
        return self._pattern is not None and self._pattern.search(value) is not None

    def text(self, value: str) -> str:
        if self._pattern is None:
            return value
        return self._pattern.sub(FILTERED, value)

    def deep(self, value: Any) -> Any:
        """Strings inside dicts, lists and tuples (keys included) scrubbed; anything else as it is."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.deep(key): self.deep(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.deep(item) for item in value]
        if isinstance(value, tuple):
            return tuple(self.deep(item) for item in value)
        return value
