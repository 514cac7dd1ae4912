"""The installed Tidemark version, one source for ``tidemark --version`` and both services'
``/healthz``: the package metadata pyproject.toml writes, so it can never disagree with
what pip installed."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def tidemark_version() -> str:
    """``"0.1.0"``; ``"unknown"`` when run from a source tree that was never installed."""
    try:
        return version("tidemark")
    except PackageNotFoundError:
        return "unknown"
