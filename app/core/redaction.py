"""How secrets are kept out of what leaves the process: URLs shown without passwords, scrubbed text.

What is secret is decided by :meth:`app.core.settings.Settings.secret_values`;
this module only knows how to hide it, so it imports nothing of ours.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote, unquote_plus

FILTERED = "[Filtered]"
# Shorter values would match ordinary words and numbers all over the logs.
MIN_SECRET_LENGTH = 6

SENSITIVE_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "stripe-signature", "svix-signature", "x-api-key"}
)
"""Headers dropped from whatever leaves the process (a Sentry event's request, a span), whatever else is
scrubbed: they are credentials."""


# A password given as a query parameter (``?password=...``), which asyncpg and redis-py both accept.
_QUERY_PASSWORD = re.compile(r"[?&]password=([^&#]*)", re.IGNORECASE)


def _password_spans(url: str) -> list[tuple[int, int]]:
    """Where the URL's passwords are, by plain string search: the user info's, and any ``password=`` parameter.

    No URL parser: the URLs this shows are often the ones that do not parse.
    The last ``@`` before the query ends the user info, so a password holding
    an unescaped ``@`` or ``/`` is hidden whole (an ``@`` further on hides a
    little too much). The spans are in order and do not overlap.
    """
    query = [match.span(1) for match in _QUERY_PASSWORD.finditer(url) if match.end(1) > match.start(1)]
    end = len(url)
    if query:
        first = query[0][0] - len("password=") - 1  # its ? or &
        question = url.rfind("?", 0, first + 1)
        end = first if question < 0 else question
    scheme_end = url.find("://", 0, end)
    start = 0 if scheme_end < 0 else scheme_end + 3
    at = url.rfind("@", start, end)
    colon = url.find(":", start, at) if at >= 0 else -1
    return ([(colon + 1, at)] if colon >= 0 else []) + query


def redact_url(url: str) -> str:
    """The URL with its passwords replaced by ``***``: the only form of a URL a message may show."""
    for start, end in reversed(_password_spans(url)):
        url = f"{url[:start]}***{url[end:]}"
    return url


def url_passwords(url: str) -> tuple[str, ...]:
    """The URL's passwords as written (percent-encoded) and decoded, as any of them may reach a message.

    A query parameter's value is decoded both ways (``+`` kept, or read as a space as a query string's is).
    """
    found: dict[str, None] = {}
    for start, end in _password_spans(url):
        written = url[start:end]
        if written:
            found.update(dict.fromkeys((written, unquote(written), unquote_plus(written))))
    return tuple(found)


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
