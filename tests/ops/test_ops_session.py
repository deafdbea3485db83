"""The session cookie in production, where it must also be ``Secure`` (the browser tests run over plain HTTP)."""

from __future__ import annotations

import re

from litestar.testing import AsyncTestClient

from app.asgi import build_app
from app.core.settings import load_settings
from tests.ops.conftest import OPS_PASSWORD


async def test_in_production_the_session_cookie_is_secure_httponly_and_strict(settings_env: dict[str, str]) -> None:
    settings = load_settings({**settings_env, "APP_ENV": "production", "OPS_PASSWORD": OPS_PASSWORD})
    async with AsyncTestClient(build_app(settings), base_url="https://ops.example.test") as client:
        form = await client.get("/ops")
        token = re.search(r'name="_csrf" value="([^"]+)"', form.text)
        assert token is not None

        response = await client.post(
            "/ops/login", data={"_csrf": token.group(1), "password": OPS_PASSWORD}, follow_redirects=False
        )
        overview = await client.get("/ops")

    assert response.status_code == 303 and response.headers["location"] == "/ops"
    assert overview.status_code == 200 and "Logged in." in overview.text
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("ops_session=")
    flags = {flag.strip().lower() for flag in cookie.split(";")[1:]}
    assert {"secure", "httponly", "samesite=strict", "path=/ops"} <= flags
    assert OPS_PASSWORD not in cookie
