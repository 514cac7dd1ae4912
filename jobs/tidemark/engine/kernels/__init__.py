"""Batch kernels: keyed stages under the ``process_batch`` contract (``tidemark.engine.driver``)."""
