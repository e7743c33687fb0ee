"""effectgate: a LangGraph agent whose side effects are safe to replay."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
