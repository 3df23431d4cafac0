"""Enrollment Service: sites, enrollment tokens, the Collector CA and the trust bootstrap."""
