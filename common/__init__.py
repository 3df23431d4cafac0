"""Code shared by every control-plane service: settings, errors, logs, metrics, persistence."""
