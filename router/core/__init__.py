"""What every subsystem of the router builds on: :class:`router.core.base.RouterCore` (connections,
background tasks, post-commit effects), the task and collector state machines, the Redis side
(liveness, in-flight counters, wake-ups), the plain-SQL driver, the shared reads and the audit log."""
