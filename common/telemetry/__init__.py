"""What a process tells its operators: logs with secrets scrubbed, Prometheus metrics, and traces."""
