"""The deployment's key and CA material as one value: the bundle, a host's copy on disk, the sealed
row in PostgreSQL, and the start-up rule that makes every host serve the same material."""
