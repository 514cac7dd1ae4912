"""Stages: plain Python objects implementing the contracts in ``tidemark.engine.stage``."""
