"""How each kind of environment value is read and checked: one parser per kind, each naming the fix.

A parser gets the variable's name and its (stripped, non-empty) text and
returns the typed value, or raises :class:`SettingsError` with one line that
names the variable and what to set it to. ``Settings`` declares which parser
reads each field; unset variables keep the field's default.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from croniter import croniter
from sentry_sdk.utils import BadDsn, Dsn
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from app.core.redaction import redact_url

Parser = Callable[[str, str], Any]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class SettingsError(Exception):
    """A setting is missing or malformed; the message names the variable and the fix."""


def text(_: str, raw: str) -> str:
    return raw


def password(min_length: int) -> Parser:
    """A password people may guess at: refused when short, without ever showing it."""

    def parse(name: str, raw: str) -> str:
        if len(raw) < min_length:
            raise SettingsError(
                f"{name} is shorter than {min_length} characters: set a longer one, "
                "e.g. the output of `openssl rand -base64 24`."
            )
        return raw

    return parse


def choice(*allowed: str, upper: bool = False) -> Parser:
    def parse(name: str, raw: str) -> str:
        value = raw.lower()
        if value not in allowed:
            raise SettingsError(f"{name}={value!r} is not valid: use one of {', '.join(allowed)}.")
        return value.upper() if upper else value

    return parse


def choices(*allowed: str) -> Parser:
    """One or several of ``allowed``, separated by commas (``snapshot,thin``): a set, in ``allowed``'s order."""

    def parse(name: str, raw: str) -> tuple[str, ...]:
        given = [part.strip().lower() for part in raw.split(",")]
        if not all(given) or not set(given) <= set(allowed):
            combined = ",".join(allowed)
            raise SettingsError(
                f"{name}={raw!r} is not valid: use {', '.join(allowed)}, or several separated by commas "
                f"(e.g. {combined})."
            )
        return tuple(item for item in allowed if item in given)

    return parse


def flag(name: str, raw: str) -> bool:
    value = raw.lower()
    if value not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        raise SettingsError(f"{name}={raw!r} is not valid: use true or false.")
    return value in ("true", "1", "yes", "on")


def whole(minimum: int = 0, maximum: int | None = None) -> Parser:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise SettingsError(f"{name}={raw!r} is not a whole number: set it to an integer >= {minimum}.") from None
        if value < minimum:
            raise SettingsError(f"{name}={value} is too small: set it to an integer >= {minimum}.")
        if maximum is not None and value > maximum:
            raise SettingsError(f"{name}={value} is too large: set it to an integer <= {maximum}.")
        return value

    return parse


def number(minimum: float = 0.0) -> Parser:
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{name}={raw!r} is not a number: set it to a number >= {minimum}.") from None
        if not value >= minimum:  # NaN too
            raise SettingsError(f"{name}={value} is too small: set it to a number >= {minimum}.")
        return value

    return parse


def database_url(name: str, raw: str) -> str:
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise SettingsError(
            f"{name}={redact_url(raw)!r} does not parse: use postgresql+asyncpg://user:password@host:5432/db."
        ) from None
    if url.get_backend_name() != "postgresql":
        raise SettingsError(
            f"{name} uses {url.drivername!r}: only PostgreSQL is supported; "
            "use postgresql+asyncpg://user:password@host:5432/db."
        )
    return url.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


def redis_url(name: str, raw: str) -> str:
    scheme, sep, rest = raw.partition("://")
    if not sep or scheme not in ("redis", "rediss", "unix") or not rest:
        raise SettingsError(
            f"{name}={redact_url(raw)!r} does not parse: use redis://host:6379/0 (or rediss:// for TLS)."
        )
    return raw


def http_url(name: str, raw: str) -> str:
    scheme, sep, rest = raw.partition("://")
    if scheme not in ("http", "https") or not sep or not rest.split("/")[0]:
        raise SettingsError(f"{name}={redact_url(raw)!r} does not parse: use an http(s) URL such as https://host/path.")
    return raw.rstrip("/")


def header_values(name: str, raw: str) -> tuple[str, ...]:
    """``key=value`` pairs separated by commas (values percent-encoded), as OpenTelemetry reads them: the values.

    Only the values are kept: they are the credentials (an API key, ``sentry sentry_key=...``) to scrub.
    """
    values: list[str] = []
    for pair in (part.strip() for part in raw.split(",") if part.strip()):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise SettingsError(f"{name} does not parse: use key=value pairs separated by commas (values URL-encoded).")
        values.extend(dict.fromkeys((value.strip(), unquote(value).strip())))
    return tuple(dict.fromkeys(values))


def whsec(name: str, raw: str) -> str:
    """A ``whsec_`` secret must carry base64 after its prefix (svix decodes it; Stripe's do too)."""
    if not raw.startswith("whsec_"):
        raise SettingsError(
            f"{name} must start with 'whsec_': copy the signing secret from the provider's webhook settings."
        )
    body = raw.removeprefix("whsec_")
    try:
        decoded = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        decoded = b""
    if len(decoded) < 8:
        raise SettingsError(
            f"{name} has a 'whsec_' secret that does not decode (base64 expected after 'whsec_'): "
            "copy it again from the provider's webhook settings."
        )
    return raw


def whsec_list(name: str, raw: str) -> tuple[str, ...]:
    """One secret, or several separated by commas while rotating."""
    return tuple(whsec(name, part.strip()) for part in raw.split(",") if part.strip())


def trusted_proxies(name: str, raw: str) -> tuple[Network, ...]:
    """Comma-separated CIDRs or bare addresses; host bits are tolerated (``10.0.0.7/8`` is ``10.0.0.0/8``).

    Anything unparsable stops the process: a typo must not silently trust nobody, or everybody.
    """
    networks: list[Network] = []
    for part in (entry.strip() for entry in raw.split(",")):
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise SettingsError(
                f"{name}: {part!r} is not an IP address or CIDR network; expected e.g. 10.0.0.0/8, 192.0.2.7 or "
                "2001:db8::/32"
            ) from None
    return tuple(networks)


def sentry_dsn(name: str, raw: str) -> str:
    """Checked at start with the SDK's own parser, rather than at the first fault."""
    try:
        Dsn(raw)
    except BadDsn:
        raise SettingsError(
            f"{name} does not parse: copy the DSN from Sentry (Settings > Client Keys), "
            "e.g. https://<key>@o0.ingest.sentry.io/<project>, or unset it to switch Sentry off."
        ) from None
    return raw


def cron_pattern(name: str, raw: str) -> str:
    """Exactly five croniter fields, read in UTC: croniter also takes 6 and 7 (seconds last), which we refuse."""
    if len(raw.split()) != 5 or not croniter.is_valid(raw, strict=True):
        raise SettingsError(
            f"{name}={raw!r} is not a valid cron pattern: use 5 fields "
            "(minute hour day-of-month month day-of-week), e.g. '*/10 * * * *'."
        )
    return raw
