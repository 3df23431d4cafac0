"""What the router hands collectors besides envelopes to keep their trust current: key set rotation
steps, newer trust bundles, and the signed documents (config, tunnel offers) it issues."""
