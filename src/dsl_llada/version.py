"""The package's version, in a module of its own so that modules the package imports at start can name it."""

__version__ = "0.1.0"
