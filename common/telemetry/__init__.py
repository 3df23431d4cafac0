"""What a process tells its operators: structured logs with secrets scrubbed, and Prometheus metrics."""
