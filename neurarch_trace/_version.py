"""The package version, read by packaging and written into every graph."""

__version__ = "0.1.0"
