"""Where a process gets its configuration: the typed settings object (environment and file), the
addresses it dials, the state directory and its file modes, and files read again on change."""
