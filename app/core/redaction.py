"""How secrets are kept out of what leaves the process: URLs shown without passwords, scrubbed text.

What is secret is decided by :meth:`app.core.settings.Settings.secret_values`;
this module only knows how to hide it, so it imports nothing of ours.
"""

from __future__ import annotations

from urllib.parse import unquote


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
