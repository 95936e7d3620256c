"""`dsl-llada ray-serve`: the serving app as a Ray Serve deployment, so that one model is served by several replicas
on one machine or on a Ray cluster of many, behind Ray Serve's HTTP proxy.

Each replica is a Ray actor that opens the model once, through the same call as `dsl-llada serve`
(`server.open_serve_app(ServeSettings)`), and answers requests with the same FastAPI app (`app.create_app`): the
same API, batching, limits, streams and errors. Ray Serve's proxy spreads requests over the replicas; every response
names the replica that served it in the `x-dsl-llada-replica` header.

    run_ray_serve(RayServeSettings(serve=ServeSettings(source=ModelSource(path="CKPT")), ray=RayConfig(num_replicas=2)))

`ray_app.app_builder` is the same deployment for Ray Serve's own `serve run` / `serve deploy`. Ray is imported only
when a deployment is built or run; without it every entry point raises one ValueError
saying how to install it (`pip install "dsl-llada[ray]"`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ConfigBase, _check, check_number
from ..runtime.environment import MAX_THREADS
from .server import ServeSettings, check_port_free
from .settings import RAY_INSTALL, REPLICA_HEADER

__all__ = ["APP_NAME", "DEPLOYMENT_NAME", "MAX_REPLICAS", "RAY_INSTALL", "REPLICA_HEADER", "RayConfig",
           "RayServeSettings", "build_ray_app", "deployment_options", "import_ray", "ray_serve",
           "replica_serve_settings", "run_ray_serve"]

APP_NAME = "dsl-llada"
"""The Ray Serve application's name (`serve status` lists it)."""
DEPLOYMENT_NAME = "dsl-llada"
"""The deployment's name inside the application (a `serve deploy` config's `deployments:` entry uses it)."""
MAX_REPLICAS = 1024
"""Most replicas one deployment may ask for."""
MAX_ONGOING = 4096
"""Largest `max_ongoing_requests`."""
CONSTRUCTOR_RETRIES = 3
"""Failed replica starts after which Ray Serve marks the deployment failed (and `ray-serve` exits with its error)."""
MAX_CPUS = 1024
MAX_GPUS = 16


def import_ray() -> tuple[Any, Any]:
    """(ray, ray.serve), or one ValueError saying how to install them."""
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise ValueError(f"Ray Serve is not installed ({e}); install it with: {RAY_INSTALL}") from None
    return ray, serve


@dataclass(frozen=True)
class RayConfig(ConfigBase):
    """How many replicas serve the model and what each one reserves on the Ray cluster."""

    num_replicas: int | None = None
    """Fixed number of replicas (default 1; not together with autoscaling's --max-replicas)."""
    min_replicas: int | None = None
    """Autoscaling: fewest replicas, 0 allowed (default 1; needs --max-replicas)."""
    max_replicas: int | None = None
    """Autoscaling: most replicas; giving it turns autoscaling on."""
    target_ongoing_requests: float | None = None
    """Autoscaling: ongoing requests per replica the autoscaler aims for (default: --max-batch, one full batch per
    replica, at most --max-ongoing-requests; needs --max-replicas)."""
    num_cpus: float = 1.0
    """CPUs Ray reserves for each replica (its torch threads: this, rounded down, at least 1)."""
    num_gpus: float = 0.0
    """GPUs Ray reserves for each replica (0: the replica runs on CPU; above 0 its model goes to cuda)."""
    max_ongoing_requests: int = 16
    """Most requests one replica holds at once (running or in its own queue); Ray's proxy queues the rest and hands
    them to the replica with the fewest ongoing requests."""

    def __post_init__(self) -> None:
        for name, lo in (("num_replicas", 1), ("min_replicas", 0), ("max_replicas", 1)):
            v = getattr(self, name)
            if v is not None:
                check_number(name, v, lo=lo, hi=MAX_REPLICAS, integer=True)
        if self.target_ongoing_requests is not None:
            check_number("target_ongoing_requests", self.target_ongoing_requests, lo=0, lo_open=True, hi=MAX_ONGOING)
        check_number("num_cpus", self.num_cpus, lo=0, lo_open=True, hi=MAX_CPUS,
                     reason="a replica needs CPU time to run its model")
        check_number("num_gpus", self.num_gpus, lo=0, hi=MAX_GPUS)
        check_number("max_ongoing_requests", self.max_ongoing_requests, lo=1, hi=MAX_ONGOING, integer=True)
        if self.max_replicas is None:
            _check(self.min_replicas is None and self.target_ongoing_requests is None,
                   f"min_replicas={self.min_replicas!r} / target_ongoing_requests={self.target_ongoing_requests!r} "
                   f"are autoscaling settings: give max_replicas too (or use num_replicas for a fixed count)")
        else:
            _check(self.num_replicas is None,
                   f"num_replicas={self.num_replicas} and max_replicas={self.max_replicas} cannot be combined: "
                   f"give num_replicas for a fixed count, or min_replicas/max_replicas to autoscale")
            _check(self.min_replicas is None or self.min_replicas <= self.max_replicas,
                   f"min_replicas={self.min_replicas} must be <= max_replicas={self.max_replicas}")
            if self.target_ongoing_requests is not None:
                _check(self.target_ongoing_requests <= self.max_ongoing_requests,
                       f"target_ongoing_requests={self.target_ongoing_requests:g} must be <= "
                       f"max_ongoing_requests={self.max_ongoing_requests} (a replica never holds more)")

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None


@dataclass(frozen=True)
class RayServeSettings:
    """One Ray Serve deployment of the server: what each replica serves (`serve`: the model, batching, limits,
    access rules; its host/port are where Ray Serve's HTTP proxy listens), how many replicas (`ray`), and which
    Ray instance runs them."""

    serve: ServeSettings
    ray: RayConfig = field(default_factory=RayConfig)
    address: str | None = None
    """The Ray cluster to deploy on: None starts a Ray instance on this machine for this process alone (stopped
    with it); 'auto' joins the cluster this machine belongs to (`ray start`); 'HOST:PORT' joins that cluster's
    head node."""
    temp_dir: str | None = None
    """Ray's session files and logs of a Ray instance started here (default: Ray's own, /tmp/ray)."""

    def __post_init__(self) -> None:
        if self.serve.ui:
            raise ValueError("--ui is not available under Ray Serve (the web UI keeps state per process); run "
                             "`dsl-llada ui` separately")
        max_queue = self.serve.server.max_queue
        _check(self.ray.max_ongoing_requests <= max_queue,
               f"max_ongoing_requests={self.ray.max_ongoing_requests} must be <= max_queue={max_queue}: a replica "
               f"would answer 429 to requests Ray's proxy could queue")
        _check(self.serve.port != 0, "port=0 is not available under Ray Serve: its HTTP proxy listens on a fixed "
                                     "port on every node; pick one with --port")
        _check(self.address is None or (isinstance(self.address, str) and self.address.strip() != ""),
               f"address={self.address!r} must be 'auto' or HOST:PORT of a Ray cluster (leave it out to start Ray "
               f"on this machine)")
        _check(self.temp_dir is None or self.address is None,
               f"temp_dir={self.temp_dir!r} applies only to a Ray instance started here (no address)")

    @property
    def local(self) -> bool:
        """Whether Ray is started here, for this process alone."""
        return self.address is None


def replica_serve_settings(settings: RayServeSettings) -> ServeSettings:
    """The ServeSettings each replica opens its model with: a model with no --device goes to cuda when the replica
    reserves a GPU and to the CPU otherwise (Ray places a replica by what it reserves, not by what the machine
    has); no --threads: as many torch threads as the CPUs it reserves (at least 1)."""
    s = settings.serve
    source = s.source
    if source.device is None:
        source = source.replace(device="cuda" if settings.ray.num_gpus > 0 else "cpu")
    if source.threads is None:
        source = source.replace(threads=min(MAX_THREADS, max(1, int(settings.ray.num_cpus))))
    return dataclasses.replace(s, source=source)


def deployment_options(settings: RayServeSettings) -> dict[str, Any]:
    """The keyword arguments of `serve.deployment` for these settings."""
    r = settings.ray
    options: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "max_ongoing_requests": r.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": r.num_cpus, "num_gpus": r.num_gpus},
        # a replica being stopped drains like `serve` on SIGTERM: the app's grace period, then 2 s to answer
        "graceful_shutdown_timeout_s": settings.serve.shutdown_grace_s + 2,
        # a model that does not load (a damaged checkpoint, a wrong path) fails the same way again: give up early
        "max_constructor_retry_count": CONSTRUCTOR_RETRIES,
    }
    if r.autoscaling:
        options["autoscaling_config"] = {
            "min_replicas": 1 if r.min_replicas is None else r.min_replicas, "max_replicas": r.max_replicas,
            "target_ongoing_requests": (r.target_ongoing_requests if r.target_ongoing_requests is not None
                                        else float(min(settings.serve.server.max_batch, r.max_ongoing_requests)))}
    else:
        options["num_replicas"] = 1 if r.num_replicas is None else r.num_replicas
    return options


def build_ray_app(settings: RayServeSettings) -> Any:
    """The Ray Serve application (`serve.run(...)` / `serve run`'s target): the deployment of `ray_replica.Replica`
    with `deployment_options(settings)`, each replica opening `replica_serve_settings(settings)`."""
    _, serve = import_ray()
    from .ray_replica import Replica

    return serve.deployment(Replica, **deployment_options(settings)).bind(replica_serve_settings(settings))


@contextlib.contextmanager
def ray_serve(settings: RayServeSettings) -> Iterator[str]:
    """Deploy the app and yield the URL of Ray Serve's HTTP proxy once every replica has loaded its model; on exit
    remove the application (and stop Ray when it was started here)."""
    ray, serve = import_ray()
    s = settings.serve
    if settings.local:
        check_port_free(s.host, s.port)
        if s.source.path is not None and not s.source.allow_download and not Path(s.source.path).is_dir():
            raise ValueError(f"checkpoint folder {s.source.path!r} does not exist")
    app = build_ray_app(settings)
    init: dict[str, Any] = {"address": "local" if settings.local else settings.address, "include_dashboard": False,
                            "configure_logging": False}
    if settings.temp_dir is not None:
        init["_temp_dir"] = str(Path(settings.temp_dir).resolve())
    ray.init(**init)
    try:
        serve.start(http_options={"host": s.host, "port": s.port})
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
        except RuntimeError as e:  # "Deploying application ... failed"; the replica's own error is in the status
            raise ValueError(f"the replicas could not start ({CONSTRUCTOR_RETRIES} tries): "
                             f"{_replica_error(serve) or str(e).splitlines()[0]}") from None
        host = f"[{s.host}]" if ":" in s.host else s.host
        yield f"http://{host}:{s.port}"
    finally:
        try:
            if settings.local:
                serve.shutdown()
            else:
                serve.delete(APP_NAME)
        finally:
            ray.shutdown()


def _replica_error(serve: Any) -> str | None:
    """The last exception line of the deployment's status message (a replica's failed start), if any."""
    try:
        message = serve.status().applications[APP_NAME].deployments[DEPLOYMENT_NAME].message
    except (KeyError, AttributeError):
        return None
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    return next((ln for ln in reversed(lines) if "Error:" in ln or "Exception:" in ln), None)


def run_ray_serve(settings: RayServeSettings) -> int:
    """Deploy the app on Ray Serve and keep it up until SIGINT/SIGTERM (exit code 0); then the replicas drain and
    the application is removed."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with ray_serve(settings) as url:
            r = settings.ray
            count = (f"autoscaling {deployment_options(settings)['autoscaling_config']['min_replicas']}-"
                     f"{r.max_replicas} replicas" if r.autoscaling else
                     f"{deployment_options(settings)['num_replicas']} replica(s)")
            c = settings.serve.server
            print(f"serving {settings.serve.source.path} on {url} through Ray Serve: {count}, each with "
                  f"{r.num_cpus:g} CPU / {r.num_gpus:g} GPU, max_ongoing_requests={r.max_ongoing_requests} "
                  f"(max_batch={c.max_batch}, max_queue={c.max_queue}); Ctrl-C stops", flush=True)
            while not stop.wait(1.0):
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
