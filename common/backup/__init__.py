"""Backups of a deployment and their restore onto fresh hosts."""
