"""modelhost: a model inference server for Triton-layout model repositories.

The public API is the command line, the protocols it serves and `modelhost.plugin` (backends, and what
`model.py` and `inference.py` may use); every other module is internal.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
