"""modelhost: a model inference server for Triton-layout model repositories."""

__version__ = "0.1.0"

__all__ = ["__version__"]
