"""The delta-join index service (``tidemark index``): see ``app`` and ``docs/delta-join.md``."""
