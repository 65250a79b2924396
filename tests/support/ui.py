"""The admin UI in process: ``create_router`` behind ``httpx.ASGITransport``, with a
client that sends state changes the way the UI's own pages do (same origin, the
double-submit CSRF token)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.settings import TaskQSettings
from taskq.ui import create_router
from taskq.ui.security import CSRF_COOKIE

ORIGIN = "http://admin.test"


class UIClient:
    """An ``httpx.AsyncClient`` on the app with ``post_form`` adding the CSRF fields."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.http = client

    async def get(self, path: str, **kwargs: Any) -> httpx.Response:
        """GET ``path``."""
        return await self.http.get(path, **kwargs)

    async def token(self) -> str:
        """The CSRF token, loading a page first when no cookie is set yet."""
        if CSRF_COOKIE not in self.http.cookies:
            response = await self.http.get("/workers")
            assert response.status_code == 200, response.text
        return str(self.http.cookies[CSRF_COOKIE])

    async def post_form(
        self,
        path: str,
        data: dict[str, Any] | list[tuple[str, str]] | None = None,
        *,
        headers: dict[str, str] | None = None,
        token: str | None = None,
    ) -> httpx.Response:
        """POST a form as a page of the UI would: same origin, with the CSRF token."""
        fields: list[tuple[str, str]] = (
            list(data.items()) if isinstance(data, dict) else list(data or [])
        )
        fields.append(("csrf_token", token if token is not None else await self.token()))
        form: dict[str, list[str]] = {}
        for name, value in fields:
            form.setdefault(name, []).append(value)
        sent = {"Origin": ORIGIN, "Sec-Fetch-Site": "same-origin", **(headers or {})}
        return await self.http.post(path, data=form, headers=sent)


def settings_with(settings: TaskQSettings, **changes: Any) -> TaskQSettings:
    """``settings`` with some fields changed (it is frozen)."""
    return settings.model_copy(update=changes)


@asynccontextmanager
async def ui_client(
    engine: AsyncEngine, settings: TaskQSettings, **kwargs: Any
) -> AsyncIterator[UIClient]:
    """A :class:`UIClient` on ``create_router(engine=engine, settings=settings, **kwargs)``."""
    app = create_router(engine=engine, settings=settings, **kwargs)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=ORIGIN) as client:
        yield UIClient(client)


def sse_events(body: str) -> list[dict[str, str]]:
    """The events of a Server-Sent Events body: each one's ``id`` and ``data`` fields."""
    events = []
    for block in body.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith(":") or ":" not in line:
                continue
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        if "data" in fields:
            events.append(fields)
    return events


def nonce_of(html: str) -> str:
    """The CSP nonce on the page's script tag."""
    found = re.search(r'<script nonce="([^"]+)"', html)
    assert found is not None, "the page has no nonced script tag"
    return found.group(1)
