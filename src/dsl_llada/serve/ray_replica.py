"""One Ray Serve replica of the server (imported only where Ray is installed: `ray_deploy.build_ray_app`).

The replica opens its model once, in its constructor, through `server.open_serve_app` (as `dsl-llada serve` does),
then hands Ray Serve that app as its ASGI ingress; Ray runs the app's lifespan (the batcher's worker starts, and
drains when the replica stops). Every response carries the replica's id in the `x-dsl-llada-replica` header.
"""

from __future__ import annotations

from typing import Any

from ray import serve

from .server import ServeSettings, freeze_startup_objects, open_serve_app
from .settings import REPLICA_HEADER

__all__ = ["Replica", "ReplicaHeader"]

class ReplicaHeader:
    """ASGI middleware: add `x-dsl-llada-replica: <id>` to every HTTP response (errors and streams included)."""

    def __init__(self, app: Any, replica: str) -> None:
        self.app, self.value = app, replica.encode("latin-1")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER.encode(), self.value)]}
            await send(message)

        return await self.app(scope, receive, send_with_header)


@serve.ingress()
class Replica:
    """A replica: the model opened once from `settings`, served by the same FastAPI app as `dsl-llada serve`."""

    def __init__(self, settings: ServeSettings) -> None:
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.served = open_serve_app(settings)
        print(self.served.banner(settings, f"Ray Serve replica {self.replica_id}"), flush=True)
        freeze_startup_objects()

    def __serve_build_asgi_app__(self) -> Any:
        app = self.served.app
        app.add_middleware(ReplicaHeader, replica=self.replica_id)
        return app
