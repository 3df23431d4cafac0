"""PostgreSQL access: the one declared schema, the engine factory and migrations."""
