"""Device sessions: a platform's byte stream paired with a collector's dial-back through the gateway."""
