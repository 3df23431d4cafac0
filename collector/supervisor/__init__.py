"""The collector's supervisor: keeps the collector running and upgrades it (docs/upgrades.md).

- :mod:`collector.supervisor.layout` - versioned install directories and the atomic switch;
- :mod:`collector.supervisor.fetch` - the TUF client that downloads and verifies a release;
- :mod:`collector.supervisor.child` - the collector process, its restarts and its health window;
- :mod:`collector.supervisor.loop` - the upgrade sequence: verify, stage, switch, watch, roll back;
- :mod:`collector.supervisor.service` - the systemd unit ``install-service`` writes.
"""
