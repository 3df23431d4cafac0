"""Lifecycle of a service process: signals caught from the first instant, systemd readiness, the
gRPC service entry point, and the draining HTTPS server."""
