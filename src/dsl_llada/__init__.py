"""dsl-llada: Discrete Stochastic Localization adaptation of masked diffusion language models."""

from .runtime.process import configure_process  # torch-free: callable before torch is imported
from .version import __version__

__all__ = ["__version__", "configure_process"]
