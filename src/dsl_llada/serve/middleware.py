"""ASGI middleware in front of every route: the Host-header check (DNS rebinding), the body-size limit (413), the
optional API key, and per-endpoint request counts / latency."""

from __future__ import annotations

import hmac
import ipaddress
import time
from typing import Any

from fastapi.responses import JSONResponse

from .schemas import error_body

WILDCARDS = {"0.0.0.0", "::", ""}
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def _error(status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


def allowed_hosts(bind: str, extra: list[str] | None = None) -> set[str]:
    """Host names a request may address this server by: the bound name/address, the loopback names when bound to
    loopback or every interface, and `extra` (--allowed-host). A bound wildcard also accepts any IP literal (a
    DNS-rebinding page can only use a name); other names must be listed."""
    hosts = {bind.strip("[]").lower()} | {h.strip("[]").lower() for h in (extra or [])}
    try:
        loopback = ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        loopback = bind.lower() == "localhost"
    if loopback or bind in WILDCARDS:
        hosts |= LOOPBACK_NAMES
    return hosts


def host_name(header: str) -> str:
    """'example.com' from 'example.com:8000', '::1' from '[::1]:8000'."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def host_allowed(header: str, hosts: set[str], bind: str) -> bool:
    name = host_name(header)
    if name in hosts:
        return True
    if bind in WILDCARDS:
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return False
    return False


class Gate:
    """Host check, body limit, API key (constant-time compare; /health is open), request counts + latency of
    non-streamed responses (streams count themselves when they end)."""

    def __init__(self, app, service, hosts: set[str] | None = None, bind: str = "127.0.0.1"):
        self.app, self.svc, self.hosts, self.bind = app, service, hosts, bind

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, svc = scope["path"], self.svc
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.hosts is not None and not host_allowed(headers.get("host", ""), self.hosts, self.bind):
            svc.metrics.request_done(path, 403)
            response = _error(403, f"Host header {headers.get('host', '')!r} is not a name of this server; start it "
                                   f"with --allowed-host NAME to allow that name", "invalid_request_error",
                              code="host_not_allowed")
            return await response(scope, receive, send)
        if svc.api_key is not None and path != "/health":
            given = headers.get("authorization", "")
            token = given[7:] if given[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(token.encode(), svc.api_key.encode()):
                svc.metrics.request_done(path, 401)
                response = _error(401, "missing or wrong API key (send the header 'Authorization: Bearer KEY')",
                                  "invalid_request_error", code="invalid_api_key")
                return await response(scope, receive, send)
        if scope.get("method") in ("POST", "PUT", "PATCH"):
            limit = svc.limits.max_body_bytes
            too_large = _error(413, f"the request body is larger than this server's limit of {limit} bytes "
                                    f"(--max-body-bytes)", "invalid_request_error", code="body_too_large")
            declared = headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                svc.metrics.request_done(path, 413)
                return await too_large(scope, receive, send)
            body, more = [], True
            size = 0
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client left before sending its body
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    svc.metrics.request_done(path, 413)
                    return await too_large(scope, receive, send)
                body.append(chunk)
                more = message.get("more_body", False)
            receive = _replay(b"".join(body), receive)
        if not path.startswith("/v1/"):
            return await self.app(scope, receive, send)
        t0 = time.monotonic()
        state: dict[str, Any] = {}

        async def counting_send(message):
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                state["stream"] = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                                      for k, v in message.get("headers", []))
            elif message["type"] == "http.response.body" and not message.get("more_body") and not state.get("stream"):
                timed = path in ("/v1/completions", "/v1/chat/completions")
                svc.metrics.request_done(path, state.get("status", 500), time.monotonic() - t0 if timed else None)
            await send(message)

        return await self.app(scope, receive, counting_send)


def _replay(body: bytes, receive):
    """A receive() that hands the already-read body over once, then passes through (disconnect notices)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
