"""Client side of the delta-join index: the index data structure shared with the index
service (``store``), in-process and HTTP lookups (``local``, ``http``), the wire format."""
