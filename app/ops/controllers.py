"""``/ops``: the operations page (docs/operations.md). Server-rendered, no JavaScript, nothing loaded from another host.

Its routes exist only when ``OPS_PASSWORD`` is set (otherwise ``/ops`` answers
404). It reads through the inbox repository and acts through the same
operations as the command line; every action is a POST that writes an info
line naming the action, its target and the client, then redirects (303) to the
page, which shows its message once (post/redirect/get: reloading that page
does not do the action again). The message travels in the session cookie,
encrypted and signed.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from litestar import Controller, MediaType, Request, Response, get, post
from litestar.datastructures import ResponseHeader
from litestar.exceptions import HTTPException, NotFoundException
from litestar.params import FromPath
from litestar.response import Redirect, Template
from litestar.static_files import create_static_files_router

from app.core.rate_limit import SlidingWindowRateLimiter
from app.core.resources import Resources
from app.ops import auth
from app.ops.views import PAGE_SIZE, EventFilters, ago, duration, events_page, overview, pretty_json
from app.queue.crons import cron_job_id
from app.queue.job import CronTick
from app.queue.registry import JobRegistry
from app.webhooks import operations
from app.webhooks.crons import BackfillWindow, WebhookBackfillJob
from app.webhooks.inbox import STATES, Inbox
from app.webhooks.operations import OperatorError

logger = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
LOGIN_LIMITER = "ops.login_limiter"
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


def _resources(request: Request[Any, Any, Any]) -> Resources:
    resources: Resources = request.app.state.resources
    return resources


def _context(request: Request[Any, Any, Any], message: str | None, **context: Any) -> dict[str, Any]:
    return {
        "csrf": auth.csrf_token(request),
        "logged_in": auth.logged_in(request),
        "message": message,
        "now": datetime.now(UTC),
        "ago": ago,
        "duration": duration,
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


def _error_page(request: Request[Any, Any, Any], exc: HTTPException) -> Response[str]:
    """A refusal (403 without the CSRF token, 404 for an unknown event...) as a page, not as JSON."""
    if isinstance(exc, auth.NotLoggedInError):
        return auth.to_login(request, exc)
    engine = request.app.template_engine
    assert engine is not None
    html = engine.get_template("ops/error.html.j2").render(**_context(request, exc.detail, status=exc.status_code))
    headers = {header.name: str(header.value) for header in _HEADERS} | dict(exc.headers or {})
    return Response(html, status_code=exc.status_code, media_type=MediaType.HTML, headers=headers)


async def _overview(request: Request[Any, Any, Any]) -> Template:
    modules = request.app.state.runtime.worker_modules
    providers = sorted({provider for module in modules for provider in module.webhook_handlers})
    data = await overview(_resources(request), modules, providers)
    return _page(request, "overview", auth.take_flash(request), overview=data)


def _done(request: Request[Any, Any, Any], message: str, to: str = "/ops") -> Redirect:
    """An action's answer: to the page (a GET: reloading it does nothing again), which shows ``message`` once."""
    auth.flash(request, message)
    return Redirect(to, status_code=303)


def _act(request: Request[Any, Any, Any], action: str, target: str) -> None:
    client = auth.client_of(request, _resources(request).settings)
    logger.info("Operations page: %s %s, asked by %s.", action, target, client, extra={"ops_action": action})


class OpsController(Controller):
    path = "/ops"
    response_headers = _HEADERS
    exception_handlers = {HTTPException: _error_page}

    @get("/", name="ops-home", include_in_schema=False)
    async def home(self, request: Request[Any, Any, Any]) -> Template:
        if not auth.logged_in(request):
            return _page(request, "login", auth.take_flash(request))
        return await _overview(request)

    @post("/login", status_code=200, include_in_schema=False)
    async def login(self, request: Request[Any, Any, Any]) -> Template | Redirect:
        form = await auth.check_csrf(request)
        resources = _resources(request)
        client = auth.client_of(request, resources.settings)
        limiter: SlidingWindowRateLimiter = resources.extensions[LOGIN_LIMITER]
        if await limiter.used("ops-login", client) >= auth.LOGIN_FAILURES_PER_MINUTE:
            logger.warning("Operations page: a login from %s refused, too many failed tries.", client)
            message = f"{auth.LOGIN_FAILURES_PER_MINUTE} failed logins in a minute from your address: wait a minute."
            return _page(request, "login", message, status_code=429, headers={"Retry-After": "60"})
        if not auth.password_matches(form.get("password", ""), resources.settings):
            await limiter.hit("ops-login", client)
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
    async def events(self, request: Request[Any, Any, Any]) -> Template:
        filters = EventFilters.of(dict(request.query_params))
        before = request.query_params.get("before")
        rows = await events_page(_resources(request), filters, int(before) if before and before.isdigit() else None)
        return _page(request, "events", rows=rows, filters=filters, states=STATES, page_size=PAGE_SIZE)

    @get("/events/{row_id:int}", guards=[auth.operator_guard], include_in_schema=False)
    async def event(self, request: Request[Any, Any, Any], row_id: FromPath[int]) -> Template:
        return await _event_page(request, row_id)

    @post("/events/{row_id:int}/retry", guards=[auth.operator_guard], include_in_schema=False)
    async def retry(self, request: Request[Any, Any, Any], row_id: FromPath[int]) -> Redirect:
        await auth.check_csrf(request)
        _act(request, "retry", f"webhook event row {row_id}")
        return _done(request, await _operate(operations.retry, request, row_id), f"/ops/events/{row_id}")

    @post("/events/{row_id:int}/replay", guards=[auth.operator_guard], include_in_schema=False)
    async def replay(self, request: Request[Any, Any, Any], row_id: FromPath[int]) -> Redirect:
        await auth.check_csrf(request)
        _act(request, "replay", f"webhook event row {row_id}")
        return _done(request, await _operate(operations.replay, request, row_id), f"/ops/events/{row_id}")

    @post("/reopen", guards=[auth.operator_guard], include_in_schema=False)
    async def reopen(self, request: Request[Any, Any, Any]) -> Redirect:
        await auth.check_csrf(request)
        _act(request, "reopen", "every set-aside webhook event")
        return _done(request, await operations.reopen_all(_resources(request)))

    @post("/crons/{name:str}/run", guards=[auth.operator_guard], include_in_schema=False)
    async def run_cron(self, request: Request[Any, Any, Any], name: FromPath[str]) -> Redirect:
        await auth.check_csrf(request)
        cron = JobRegistry.from_modules(request.app.state.runtime.worker_modules).crons.get(name)
        if cron is None:
            raise NotFoundException(detail=f"No cron named {name!r}.")
        now = datetime.now(UTC)
        await _resources(request).queue.add(
            cron, CronTick(slot=now), deduplication_id=cron_job_id(name, now, manual=True)
        )
        _act(request, "run cron", name)
        return _done(request, f"Cron {name} queued: a worker runs it now.")

    @post("/backfill", guards=[auth.operator_guard], include_in_schema=False)
    async def backfill(self, request: Request[Any, Any, Any]) -> Redirect:
        form = await auth.check_csrf(request)
        hours = int(form["hours"]) if form.get("hours", "").isdigit() else 0
        if not 1 <= hours <= 720:
            return _done(request, "Give the hours to look back: a whole number from 1 to 720.")
        until = datetime.now(UTC)
        window = BackfillWindow("stripe", until - timedelta(hours=hours), until)
        await _resources(request).queue.add(WebhookBackfillJob, window)
        _act(request, "backfill", f"Stripe events of the last {hours} h")
        return _done(request, f"Backfill of the last {hours} hours of Stripe events queued: a worker runs it.")


async def _operate(action: Any, request: Request[Any, Any, Any], row_id: int) -> str:
    """The action's message; an event that does not exist is a 404, as its page would be."""
    try:
        outcome = await action(_resources(request), str(row_id))
    except OperatorError as exc:
        if await Inbox(_resources(request).db).get(row_id) is None:
            raise NotFoundException(detail=f"No webhook event with row id {row_id}.") from exc
        return str(exc)
    return str(outcome.message)


async def _event_page(request: Request[Any, Any, Any], row_id: int) -> Template:
    event = await Inbox(_resources(request).db).get(row_id)
    if event is None:
        raise NotFoundException(detail=f"No webhook event with row id {row_id}.")
    return _page(request, "event", auth.take_flash(request), event=event, payload=pretty_json(event.payload))


def ops_routes(resources: Resources) -> list[Any]:
    """The page's routes behind their session (the webhook routes carry no session middleware), and its CSS."""
    settings = resources.settings
    resources.extensions[LOGIN_LIMITER] = SlidingWindowRateLimiter(
        resources.redis, limit=auth.LOGIN_FAILURES_PER_MINUTE, key_prefix=settings.redis_namespace, timeout=1.0
    )
    # The session sits on the controller, not on a Router: registering a Router deep-copies it, and the
    # session backend's AES key object cannot be copied.
    page = type("OpsPage", (OpsController,), {"middleware": [auth.session_config(settings).middleware]})
    static = create_static_files_router(
        path="/ops/static", directories=[STATIC], name="ops-static", include_in_schema=False
    )
    return [page, static]
