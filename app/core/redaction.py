"""How secrets are kept out of what leaves the process: URLs shown without passwords, scrubbed text.

What is secret is decided by :meth:`app.core.settings.Settings.secret_values`;
this module only knows how to hide it, so it imports nothing of ours.
"""

from __future__ import annotations

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


class SecretScrubber:
    """Replaces every configured secret inside strings with ``[Filtered]``.

    One compiled pattern (longest values first, so a secret holding another is
    removed whole); with no secret configured it does nothing at all.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        kept = sorted({value for value in secrets if len(value) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
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
