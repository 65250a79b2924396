"""The admin UI's browser protections: security headers with a per-response CSP nonce,
and CSRF checks on every state change.

CSRF is stateless (no server sessions): a request that changes anything must come from
the UI's own origin (``Sec-Fetch-Site: same-origin`` where the browser sends it, else a
matching ``Origin``) and carry the double-submit token, the value of the ``taskq_csrf``
cookie repeated in the form (``csrf_token``) or the ``X-CSRF-Token`` header. Another
site can make a browser send the cookie but can neither read it nor set the field.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "CsrfError",
    "SecurityHeaders",
    "check_csrf",
    "csrf_token",
]

CSRF_COOKIE = "taskq_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
_TOKEN_BYTES = 32


class CsrfError(Exception):
    """A state-changing request failed the CSRF checks (answered 403)."""


def _csp(nonce: str) -> str:
    return "; ".join(
        (
            "default-src 'none'",
            f"script-src 'nonce-{nonce}'",
            "style-src 'self'",
            "img-src 'self' data:",
            "connect-src 'self'",
            "form-action 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
        )
    )


class SecurityHeaders:
    """ASGI middleware: a fresh CSP nonce per request (``request.state.csp_nonce``), the
    CSP naming it, ``X-Frame-Options: DENY``, ``Referrer-Policy: same-origin``,
    ``X-Content-Type-Options: nosniff`` and ``Cache-Control: no-store`` on pages."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        nonce = secrets.token_urlsafe(16)
        scope.setdefault("state", {})["csp_nonce"] = nonce
        is_static = "/static/" in scope.get("path", "")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Content-Security-Policy"] = _csp(nonce)
                headers["X-Frame-Options"] = "DENY"
                headers["Referrer-Policy"] = "same-origin"
                headers["X-Content-Type-Options"] = "nosniff"
                if not is_static and "cache-control" not in headers:
                    headers["Cache-Control"] = "no-store"
            await send(message)

        await self.app(scope, receive, send_with_headers)


def csrf_token(request: Request) -> str:
    """The request's double-submit token: the cookie's, or a new one (the page sets it)."""
    existing = request.cookies.get(CSRF_COOKIE, "")
    if len(existing) >= 32 and existing.replace("-", "").replace("_", "").isalnum():
        return existing
    token: str = request.state.__dict__.setdefault("csrf_new", secrets.token_urlsafe(_TOKEN_BYTES))
    return token


def _origin_of(request: Request) -> str:
    url = request.url
    default = {"http": 80, "https": 443}.get(url.scheme)
    port = f":{url.port}" if url.port is not None and url.port != default else ""
    return f"{url.scheme}://{url.hostname}{port}"


def check_csrf(request: Request, form: Any) -> None:
    """Raise :class:`CsrfError` unless ``request`` is same-origin and carries the token."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise CsrfError(f"cross-site request refused (Sec-Fetch-Site: {site})")
    origin = request.headers.get("origin")
    if origin is not None and origin != _origin_of(request):
        raise CsrfError(f"cross-origin request refused (Origin: {origin})")
    cookie = request.cookies.get(CSRF_COOKIE)
    sent = request.headers.get(CSRF_HEADER)
    if sent is None and form is not None:
        value = form.get(CSRF_FIELD)
        sent = value if isinstance(value, str) else None
    if not cookie or not sent or not hmac.compare_digest(cookie.encode(), sent.encode()):
        raise CsrfError("missing or mismatched CSRF token: reload the page and try again")
