"""dsl-llada: Discrete Stochastic Localization adaptation of masked diffusion language models."""

__version__ = "0.1.0"
