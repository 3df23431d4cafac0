"""Gateway: the only component collectors talk to (HTTPS long-poll and WebSockets on 443)."""
