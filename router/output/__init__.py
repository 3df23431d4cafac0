"""Streamed task output (protocol 4): chunks appended in order, acknowledged, digested, bounded per
task and per tenant, and purged after retention."""
