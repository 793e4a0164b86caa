"""The router's ASGI app: the OpenAI (/v1/chat/completions, /v1/completions, /v1/responses) and
Anthropic (/v1/messages) endpoints forwarded to engines (forward.py), GET /v1/models (the first
available engine's), /health (ok while an engine of each needed role is available), /engines (the
pool as JSON) and /metrics (the router's own)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dsgraph.runtime.router.config import RouterConfig
from dsgraph.runtime.router.cost import QuadraticCost
from dsgraph.runtime.router.forward import Forwarder
from dsgraph.runtime.router.metrics import RouterMetrics
from dsgraph.runtime.router.pool import Pool
from dsgraph.runtime.router.routes import ROUTES, Route
from dsgraph.runtime.router.select import DEFAULT_PRIOR, Selector
from dsgraph.runtime.server.access import install_access
from dsgraph.runtime.server.errors import ApiError
from dsgraph.runtime.server.limits import ServerLimits


class Router:
    """Pool, policies, metrics and the HTTP client of one router."""

    def __init__(self, cfg: RouterConfig, prior: QuadraticCost = DEFAULT_PRIOR) -> None:
        self.cfg = cfg
        # idle connections are dropped before an engine's server closes them (uvicorn: after 5 s, the
        # client's default too): reusing one the engine is closing fails the request and takes the
        # engine out of the pool
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0)
        timeout = httpx.Timeout(cfg.request_timeout_s, connect=cfg.connect_timeout_s)
        self.client = httpx.AsyncClient(limits=limits, timeout=timeout)
        self.pool = Pool(cfg, self.client)
        self.selector = Selector(cfg, self.pool, prior)
        self.metrics = RouterMetrics(self.pool, self.selector)
        self.forwarder = Forwarder(cfg, self.pool, self.selector, self.metrics, self.client, ServerLimits())

    @property
    def ready(self) -> bool:
        roles = ("prefill", "decode") if self.cfg.prefill else ("normal",)
        return all(self.pool.available(r) for r in roles)


def _add_route(app: FastAPI, router: Router, route: Route) -> None:
    async def handle(request: Request) -> Response:
        try:
            resp = await router.forwarder.handle(route, request)
        except ApiError as exc:  # the body was too large or could not be read
            resp = JSONResponse(route.error_body(exc.body), status_code=exc.status)
        router.metrics.requests.labels(route.name, str(resp.status_code)).inc()
        return resp

    app.post(route.path, name=route.name)(handle)


def create_router_app(cfg: RouterConfig, prior: QuadraticCost = DEFAULT_PRIOR) -> FastAPI:
    """The router app; `app.state.router` holds the pool. It polls its engines while it serves."""
    router = Router(cfg, prior)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await router.pool.poll_all()  # engines already up are routable from the first request
        poller = asyncio.create_task(router.pool.run())
        try:
            yield
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            await router.client.aclose()

    app = FastAPI(title="dsgraph router", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.router = router
    for route in ROUTES:
        _add_route(app, router, route)
    install_access(app, cfg.api_key, ())

    @app.get("/health")
    async def health() -> JSONResponse:
        if router.ready:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "no engine available"}, status_code=503)

    @app.get("/engines")
    async def engines() -> dict[str, Any]:
        return {
            "engines": [e.status() for e in router.pool.engines],
            "cost": router.selector.cost.model.as_text(),
        }

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        for e in router.pool.engines:
            if e.available:
                auth = {k: v for k, v in request.headers.items() if k in ("authorization", "x-api-key")}
                with contextlib.suppress(httpx.HTTPError):
                    r = await router.client.get(
                        f"{e.url}/v1/models", headers=auth, timeout=cfg.poll_timeout_s
                    )
                    return Response(r.content, status_code=r.status_code, media_type="application/json")
        err = ApiError.internal("no engine is available", status=503)
        return JSONResponse(err.body, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
