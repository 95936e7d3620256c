"""dsl-llada: Discrete Stochastic Localization adaptation of masked diffusion language models."""

__version__ = "0.1.0"

from .process import configure_process  # noqa: E402  (torch-free: callable before torch is imported)

__all__ = ["__version__", "configure_process"]
