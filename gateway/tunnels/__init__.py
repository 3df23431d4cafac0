"""Tunnel sessions the gateway holds: the collector's socket, the platform's attachment, their lifetimes."""
