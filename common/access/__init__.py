"""Who may call what: roles, principals and the per-RPC policy table (``rbac``, pure), and the API
tokens that carry them - issued, looked up, listed, revoked (``api_tokens``, PostgreSQL)."""
