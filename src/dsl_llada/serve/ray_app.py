"""The application builder for Ray Serve's own commands: `serve run dsl_llada.serve.ray_app:app_builder model=CKPT
num_replicas=2`, or a `serve deploy` config whose application has `import_path: dsl_llada.serve.ray_app:app_builder`
and the options under `args:`. It builds the same deployment as `dsl-llada ray-serve` (`ray_deploy.build_ray_app`)."""

from __future__ import annotations

import argparse
from typing import Any

from .ray_deploy import build_ray_app
from ..cli.serve_cli import add_ray_serve_args, ray_serve_settings

__all__ = ["app_builder"]


class _ArgsParser(argparse.ArgumentParser):
    """A parser whose errors are one ValueError (an application builder must not exit the process)."""

    def error(self, message: str) -> Any:
        raise ValueError(message)


def app_builder(args: dict[str, Any]) -> Any:
    """Ray Serve's application builder for `serve run` / `serve deploy`: `args` holds `dsl-llada ray-serve`'s
    options by field name (`model`, `max_batch`, `num_replicas`, ...), as strings on `serve run`'s command line
    (`serve run dsl_llada.serve.ray_deploy:app_builder model=CKPT num_replicas=2`) or typed in a config file's
    `args:`; they are parsed and checked by the same parser as the command's flags. The keys are the flags without
    their dashes (`ray_address` included); a true/false value turns a switch on/off, a list repeats a flag."""
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + str(key).replace("_", "-")
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, bool) or (isinstance(v, str) and v.lower() in ("true", "false")):
                on = v if isinstance(v, bool) else v.lower() == "true"
                argv.append(flag if on else "--no-" + flag[2:])
            else:
                argv += [flag, str(v)]
    parser = _ArgsParser(prog="app_builder", add_help=False)
    add_ray_serve_args(parser)
    return build_ray_app(ray_serve_settings(parser.parse_args(argv)))
