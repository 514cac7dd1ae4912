"""Client side of the delta-join index: the index data structure shared with the index
service (``store``), in-process and HTTP lookups (``local``, ``http``), the wire format."""

# The index service's bearer token: read by ``tidemark index``, handed by the control
# service to the embedded index service and to its jobs (``tidemark run --index-token``).
INDEX_TOKEN_ENV = "TIDEMARK_INDEX_TOKEN"

# Keys per ``POST /v1/lookup``: the service refuses more (one request's work and body are
# bounded), and the HTTP client splits a larger batch into requests of at most this many.
MAX_LOOKUP_KEYS = 10_000
