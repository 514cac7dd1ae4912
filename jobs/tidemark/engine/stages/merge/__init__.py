"""Merge engines at the sink: how records with the same primary key merge into one row.

Paimon's model, rebuilt as a keyed stage: ``options`` reads and validates the table options,
``aggregators`` holds the per-field aggregate functions, ``ordering`` decides the order in
which one key's records apply, the engine modules fold them, ``producers`` turns the
before/after rows into the changelog the sink writes, and ``stage`` ties it together.
"""
