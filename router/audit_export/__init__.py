"""Audit events leaving for an operator's own systems: CloudEvents JSON lines to a rotated file, RFC 5424
syslog over TLS, an HMAC-signed HTTPS webhook — each sink reading the audit log through its own cursor
in PostgreSQL, delivered at least once, in commit order (docs/operations.md, "Audit export")."""
