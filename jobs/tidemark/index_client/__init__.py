"""Client side of the delta-join index: the index data structure shared with the index
service (``store``), in-process and HTTP lookups (``local``, ``http``), the wire format."""

# The index service's bearer token: read by ``tidemark index``, handed by the control
# service to the embedded index service and to its jobs (``tidemark run --index-token``).
INDEX_TOKEN_ENV = "TIDEMARK_INDEX_TOKEN"
