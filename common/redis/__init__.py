"""Redis access: client construction and checks, Sentinel groups, the one subscription per process
that fans out to local waiters, and credential revocation announcements."""
