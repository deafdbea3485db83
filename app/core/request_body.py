"""The API's request class: a JSON body nested deeper than the decoder can go is the client's error (400).

Litestar decodes a route's JSON body (a ``data`` parameter) with msgspec, which
raises ``RecursionError`` past Python's recursion limit (about a thousand
nested arrays, a few KB of body); Litestar answers that with a 500 and we
would report it as a fault. It is bad input, so it gets a 400 that says why.
The webhook routes read their raw bytes and check depth themselves; this
covers every other route with a JSON body, a SaaS developer's own included.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.exceptions import ClientException

TOO_DEEP = "The JSON body is nested too deeply to read: send a flatter document."


class AppRequest(Request[Any, Any, Any]):
    async def json(self) -> Any:
        try:
            return await super().json()
        except RecursionError:
            raise ClientException(detail=TOO_DEEP) from None
