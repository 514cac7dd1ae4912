"""The ``tidemark`` command line."""
