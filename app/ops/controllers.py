"""``/ops``: the operations page (docs/operations.md). Server-rendered, no JavaScript, nothing loaded from another host.

Its routes exist only when ``OPS_PASSWORD`` is set (otherwise ``/ops`` answers
404). Thin: each route parses the request, asks the page's services
(``OpsPages``, ``OpsActions``, injected by ``deps``) and answers. Every action
is a POST that writes an info line naming the action, its target and the
client, then redirects (303) to the page, which shows its message once
(post/redirect/get: reloading that page does not do the action again). The
message travels in the session cookie, encrypted and signed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from litestar import Controller, MediaType, Request, Response, get, post
from litestar.datastructures import ResponseHeader
from litestar.di import NamedDependency
from litestar.exceptions import HTTPException, NotFoundException
from litestar.params import FromPath
from litestar.response import Redirect, Template
from litestar.static_files import create_static_files_router
from litestar.types import ControllerRouterHandler

from app.core.commands import parse_duration
from app.core.resources import Resources
from app.ops import auth
from app.ops.services import BACKFILL_HOURS, NotFound, OpsActions, OpsPages
from app.ops.timeline import Cursor
from app.ops.views import PAGE_SIZE, EventFilters, ago, breakable, duration, pretty_json
from app.webhooks.inbox import STATES
from app.webhooks.preview import shown

logger = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
# Only what this server sends: no script at all, styles and images from here, forms to here, never framed.
_HEADERS = [
    ResponseHeader(
        name="Content-Security-Policy",
        value="default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'",
    ),
    ResponseHeader(name="X-Content-Type-Options", value="nosniff"),
    ResponseHeader(name="Referrer-Policy", value="no-referrer"),
    ResponseHeader(name="Cache-Control", value="no-store"),
]


def _context(request: Request[Any, Any, Any], message: str | None, **context: Any) -> dict[str, Any]:
    return {
        "csrf": auth.csrf_token(request),
        "logged_in": auth.logged_in(request),
        "message": message,
        "now": datetime.now(UTC),
        "ago": ago,
        "duration": duration,
        "breakable": breakable,
        **context,
    }


def _page(
    request: Request[Any, Any, Any],
    name: str,
    message: str | None = None,
    *,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
    **context: Any,
) -> Template:
    return Template(
        template_name=f"ops/{name}.html.j2",
        context=_context(request, message, **context),
        status_code=status_code,
        headers=headers,
    )


def _event_page(request: Request[Any, Any, Any], event: Any, message: str | None, **context: Any) -> Template:
    return _page(request, "event", message, event=event, payload=pretty_json(event.payload), **context)


def _error_page(request: Request[Any, Any, Any], exc: HTTPException) -> Response[str]:
    """A refusal (403 without the CSRF token, 404 for an unknown event...) as a page, not as JSON."""
    if isinstance(exc, auth.NotLoggedInError):
        return auth.to_login(request, exc)
    engine = request.app.template_engine
    assert engine is not None
    html = engine.get_template("ops/error.html.j2").render(**_context(request, exc.detail, status=exc.status_code))
    headers = {header.name: str(header.value) for header in _HEADERS} | dict(exc.headers or {})
    return Response(html, status_code=exc.status_code, media_type=MediaType.HTML, headers=headers)


def _not_found(request: Request[Any, Any, Any], exc: NotFound) -> Response[str]:
    return _error_page(request, NotFoundException(detail=str(exc)))


def _done(request: Request[Any, Any, Any], message: str, to: str = "/ops") -> Redirect:
    """An action's answer: to the page (a GET: reloading it does nothing again), which shows ``message`` once."""
    auth.flash(request, message)
    return Redirect(to, status_code=303)


def _log_action(request: Request[Any, Any, Any], ops_actions: OpsActions, action: str, target: str) -> None:
    client = auth.client_of(request, ops_actions.resources.settings)
    logger.info("Operations page: %s %s, asked by %s.", action, target, client, extra={"ops_action": action})


async def _action(
    request: Request[Any, Any, Any],
    ops_actions: OpsActions,
    action: str,
    target: str,
    service: Awaitable[str],
    to: str = "/ops",
) -> Redirect:
    """An action's answer, once its form passed the CSRF check: ``service`` done, an info line naming the action, its
    target and the client, and the service's message shown once on ``to``.

    A target the service does not know is its :class:`NotFound` (404) before any line is written: the log names
    only real rows, crons and upstreams, never whatever a path segment held.
    """
    message = await service
    _log_action(request, ops_actions, action, target)
    return _done(request, message, to)


def _row_id(text: str | None) -> int | None:
    """A row id from the query string; anything else (or past a bigint) is no id."""
    return int(text) if text and text.isdigit() and len(text) < 19 else None


class OpsController(Controller):
    path = "/ops"
    response_headers = _HEADERS
    exception_handlers = {HTTPException: _error_page, NotFound: _not_found}

    @get("/", name="ops-home", include_in_schema=False)
    async def home(self, request: Request[Any, Any, Any], ops_pages: NamedDependency[OpsPages]) -> Template:
        if not auth.logged_in(request):
            return _page(request, "login", auth.take_flash(request))
        return _page(request, "overview", auth.take_flash(request), overview=await ops_pages.overview())

    @post("/login", status_code=200, include_in_schema=False)
    async def login(
        self,
        request: Request[Any, Any, Any],
        resources: NamedDependency[Resources],
        login_limiter: NamedDependency[auth.LoginLimiter],
    ) -> Template | Redirect:
        form = await auth.check_csrf(request)
        client = auth.client_of(request, resources.settings)
        check = await auth.check_login(login_limiter, resources.settings, client, form.get("password", ""))
        if check is auth.LoginCheck.LIMITED:
            logger.warning("Operations page: a login from %s refused, too many failed tries.", client)
            message = f"{login_limiter.limit} failed logins in a minute from your address: wait a minute."
            return _page(request, "login", message, status_code=429, headers={"Retry-After": "60"})
        if check is auth.LoginCheck.WRONG:
            logger.warning("Operations page: a failed login from %s.", client)
            return _page(request, "login", "Wrong password.", status_code=401)
        auth.log_in(request)
        logger.info("Operations page: a login from %s.", client, extra={"ops_action": "login"})
        return _done(request, "Logged in.")

    @post("/logout", guards=[auth.operator_guard], include_in_schema=False)
    async def logout(self, request: Request[Any, Any, Any]) -> Redirect:
        await auth.check_csrf(request)
        request.clear_session()
        return _done(request, "Logged out.")

    @get("/events", guards=[auth.operator_guard], include_in_schema=False)
    async def events(self, request: Request[Any, Any, Any], ops_pages: NamedDependency[OpsPages]) -> Template:
        filters = EventFilters.of(dict(request.query_params))
        rows = await ops_pages.events(filters, _row_id(request.query_params.get("before")))
        return _page(request, "events", rows=rows, filters=filters, states=STATES, page_size=PAGE_SIZE)

    @get("/events/{row_id:int}", guards=[auth.operator_guard], include_in_schema=False)
    async def event(
        self, request: Request[Any, Any, Any], ops_pages: NamedDependency[OpsPages], row_id: FromPath[int]
    ) -> Template:
        return _event_page(request, await ops_pages.event(row_id), auth.take_flash(request))

    @post("/events/{row_id:int}/{action:str}", guards=[auth.operator_guard], include_in_schema=False)
    async def event_action(
        self,
        request: Request[Any, Any, Any],
        ops_actions: NamedDependency[OpsActions],
        row_id: FromPath[int],
        action: FromPath[str],
    ) -> Redirect:
        """``retry`` or ``replay`` the event (``preview``, answered with the page itself, has its own route)."""
        await auth.check_csrf(request)
        services = {"retry": ops_actions.retry, "replay": ops_actions.replay}
        if action not in services:
            raise NotFoundException(detail=f"No event action {action[:20]!r}: retry or replay.")
        target, page = f"webhook event row {row_id}", f"/ops/events/{row_id}"
        return await _action(request, ops_actions, action, target, services[action](row_id), page)

    @post("/events/{row_id:int}/preview", status_code=200, guards=[auth.operator_guard], include_in_schema=False)
    async def preview(
        self,
        request: Request[Any, Any, Any],
        ops_pages: NamedDependency[OpsPages],
        ops_actions: NamedDependency[OpsActions],
        row_id: FromPath[int],
    ) -> Template:
        """The event's page with what a replay would change: answered at once (it writes nothing to redo)."""
        await auth.check_csrf(request)
        preview = await ops_actions.preview(row_id)
        _log_action(request, ops_actions, "preview replay", f"webhook event row {row_id}")
        event = await ops_pages.event(row_id)
        if isinstance(preview, str):  # it could not run: why, as a refusal
            return _event_page(request, event, preview)
        return _event_page(request, event, None, preview=preview, shown=shown)

    @get("/workspaces", guards=[auth.operator_guard], include_in_schema=False)
    async def workspaces(self, request: Request[Any, Any, Any], ops_pages: NamedDependency[OpsPages]) -> Template:
        query = request.query_params.get("q", "")[:255]
        return _page(request, "workspaces", query=query, rows=await ops_pages.workspaces(query))

    @get("/workspaces/{workspace_id:int}", guards=[auth.operator_guard], include_in_schema=False)
    async def workspace(
        self, request: Request[Any, Any, Any], ops_pages: NamedDependency[OpsPages], workspace_id: FromPath[int]
    ) -> Template:
        cursor = Cursor.parse(request.query_params.get("before"))
        found = await ops_pages.timeline(workspace_id, cursor)
        return _page(request, "workspace", timeline=found, shown=shown, first_page=cursor is None)

    @post("/reopen", guards=[auth.operator_guard], include_in_schema=False)
    async def reopen(self, request: Request[Any, Any, Any], ops_actions: NamedDependency[OpsActions]) -> Redirect:
        await auth.check_csrf(request)
        return await _action(request, ops_actions, "reopen", "every set-aside webhook event", ops_actions.reopen_all())

    @post("/crons/{name:str}/run", guards=[auth.operator_guard], include_in_schema=False)
    async def run_cron(
        self, request: Request[Any, Any, Any], ops_actions: NamedDependency[OpsActions], name: FromPath[str]
    ) -> Redirect:
        await auth.check_csrf(request)
        return await _action(request, ops_actions, "run cron", name, ops_actions.run_cron(name))

    @post("/backfill", guards=[auth.operator_guard], include_in_schema=False)
    async def backfill(self, request: Request[Any, Any, Any], ops_actions: NamedDependency[OpsActions]) -> Redirect:
        form = await auth.check_csrf(request)
        hours = int(form["hours"]) if form.get("hours", "").isdigit() and len(form["hours"]) < 4 else 0
        if hours not in BACKFILL_HOURS:
            return _done(request, "Give the hours to look back: a whole number from 1 to 720.")
        target = f"Stripe events of the last {hours} h"
        return await _action(request, ops_actions, "backfill", target, ops_actions.backfill(hours))

    @post("/upstreams/{name:str}/{action:str}", guards=[auth.operator_guard], include_in_schema=False)
    async def upstream(
        self,
        request: Request[Any, Any, Any],
        ops_actions: NamedDependency[OpsActions],
        name: FromPath[str],
        action: FromPath[str],
    ) -> Redirect:
        """``pause`` (its form's ``for``: a duration, or none: until resumed) or ``resume`` an upstream."""
        form = await auth.check_csrf(request)
        if action == "resume":
            return await _action(request, ops_actions, "resume upstream", name, ops_actions.resume_upstream(name))
        if action != "pause":
            raise NotFoundException(detail=f"No upstream action {action[:20]!r}: pause or resume.")
        written = form.get("for", "").strip()
        duration = parse_duration(written) if written else None
        if written and not duration:
            return _done(request, f"{written[:20]!r} is not a duration: give one like 30m, 2h or 7d, or none.")
        target = f"{name} for {written}" if written else f"{name} until resumed"
        return await _action(request, ops_actions, "pause upstream", target, ops_actions.pause_upstream(name, duration))


def ops_routes(resources: Resources) -> list[ControllerRouterHandler]:
    """The page's routes behind their session (the webhook routes carry no session middleware), and its CSS."""
    # The session sits on the controller, not on a Router: registering a Router deep-copies it, and the
    # session backend's AES key object cannot be copied.
    page = type("OpsPage", (OpsController,), {"middleware": [auth.session_config(resources.settings).middleware]})
    static = create_static_files_router(
        path="/ops/static", directories=[STATIC], name="ops-static", include_in_schema=False
    )
    return [page, static]
