"""The collector update repository shared through PostgreSQL, for control planes on several hosts."""
