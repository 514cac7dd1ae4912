"""Kafka plumbing: the embedded broker the project starts when none is configured, and the
small admin helpers (topics, compaction) the job and the tests need."""
