"""The package version, in one place (the package, the command line and the format header read it)."""

__version__ = "0.1.0"
