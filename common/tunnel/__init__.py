"""Device sessions' byte streams: the parts both ends of a tunnel leg must agree on (docs/gateway.md)."""
