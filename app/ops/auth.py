"""Who may use ``/ops``: one password (``OPS_PASSWORD``), a signed session cookie, CSRF tokens, limited tries.

The session is Litestar's client-side cookie session (encrypted and signed
with a key derived from the password, so changing the password ends every
session), ``HttpOnly``, ``SameSite=Strict``, ``Secure`` in production, and
limited to ``/ops``. Each session carries a CSRF token; every form posts it
back and a POST without the right one is refused (403). The token is checked
here rather than by Litestar's CSRF middleware, which is app-wide and would
sit on the webhook routes' hot path. Login tries are limited per client (10
failed ones a minute, then 429) with the same Redis limiter as the webhooks.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException, PermissionDeniedException
from litestar.handlers import BaseRouteHandler
from litestar.middleware.session.client_side import CookieBackendConfig
from litestar.response import Redirect

from app.core.rate_limit import SlidingWindowRateLimiter
from app.core.resources import Resources
from app.core.settings import Settings
from app.webhooks.client_ip import client_ip, forwarded_for

LOGIN_FAILURES_PER_MINUTE = 10
SESSION_HOURS = 12
_CSRF = "csrf"
_OPERATOR = "operator"
_FLASH = "flash"


def session_config(settings: Settings) -> CookieBackendConfig:
    assert settings.ops_password, "the /ops routes exist only with OPS_PASSWORD set"
    key = hashlib.sha256(b"saas-jobs ops session\0" + settings.ops_password.encode()).digest()
    return CookieBackendConfig(
        secret=key,
        key="ops_session",
        path="/ops",
        max_age=SESSION_HOURS * 3600,
        httponly=True,
        samesite="strict",
        secure=settings.is_production,
    )


def password_matches(given: str, settings: Settings) -> bool:
    expected = hashlib.sha256((settings.ops_password or "").encode()).digest()
    return hmac.compare_digest(hashlib.sha256(given.encode()).digest(), expected)


class LoginLimiter:
    """Failed logins per client, in Redis (every API process's): past the limit, every try waits out the minute."""

    _SCOPE = "ops-login"

    def __init__(self, resources: Resources) -> None:
        self.limit = LOGIN_FAILURES_PER_MINUTE
        self._window = SlidingWindowRateLimiter(
            resources.redis, limit=self.limit, key_prefix=resources.settings.redis_namespace, timeout=1.0
        )

    async def exhausted(self, client: str) -> bool:
        return await self._window.used(self._SCOPE, client) >= self.limit

    async def count_failure(self, client: str) -> None:
        await self._window.hit(self._SCOPE, client)


class LoginCheck(enum.Enum):
    LIMITED = "limited"
    WRONG = "wrong"
    ACCEPTED = "accepted"


async def check_login(limiter: LoginLimiter, settings: Settings, client: str, password: str) -> LoginCheck:
    """The limit first: a client past it is refused even with the right password, until the minute has passed."""
    if await limiter.exhausted(client):
        return LoginCheck.LIMITED
    if not password_matches(password, settings):
        await limiter.count_failure(client)
        return LoginCheck.WRONG
    return LoginCheck.ACCEPTED


def csrf_token(request: Request[Any, Any, Any]) -> str:
    """The session's token (made on its first page): every form of it carries it."""
    token = request.session.get(_CSRF)
    if not token:
        token = secrets.token_urlsafe(32)
        request.set_session({**request.session, _CSRF: token})
    return str(token)


async def check_csrf(request: Request[Any, Any, Any]) -> dict[str, str]:
    """The posted form, if it carries the session's CSRF token; otherwise 403."""
    form = {key: str(value) for key, value in (await request.form()).items()}
    expected = request.session.get(_CSRF) or ""
    if not expected or not hmac.compare_digest(form.get("_csrf", "").encode(), str(expected).encode()):
        raise PermissionDeniedException(detail="The form's CSRF token is missing or wrong: reload the page and retry.")
    return form


def flash(request: Request[Any, Any, Any], message: str) -> None:
    """A message for the page the answer redirects to (the session is encrypted and signed: it cannot be forged)."""
    request.set_session({**request.session, _FLASH: message})


def take_flash(request: Request[Any, Any, Any]) -> str | None:
    """The message an action left for this page, shown once (a reload shows the page without it)."""
    if _FLASH not in request.session:
        return None
    session = dict(request.session)
    message = session.pop(_FLASH)
    request.set_session(session)
    return str(message)


def log_in(request: Request[Any, Any, Any]) -> None:
    """A fresh session (and token) at login: a token seen before the login is not the session's."""
    request.set_session({_OPERATOR: True, _CSRF: secrets.token_urlsafe(32)})


def logged_in(connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
    return bool(connection.session.get(_OPERATOR))


class NotLoggedInError(HTTPException):
    status_code = 303


async def operator_guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Pages past the login: without a session, back to the login form."""
    if not logged_in(connection):
        raise NotLoggedInError(headers={"Location": "/ops"})


def to_login(_: Request[Any, Any, Any], __: NotLoggedInError) -> Redirect:
    return Redirect("/ops", status_code=303)  # a GET after any POST: the login form


def client_of(request: Request[Any, Any, Any], settings: Settings) -> str:
    peer = request.client.host if request.client else None
    lines = request.headers.getall("x-forwarded-for", []) if settings.trusted_proxies else []
    return client_ip(peer, forwarded_for(lines), settings.trusted_proxies)
