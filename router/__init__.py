"""Task Router: placement, device leases, signed dispatch, the unknown-outcome ladder, fleet control.

One package per subsystem, each with its domain code, its SQL and its gRPC adapter; they import
only downward (tests/unit/test_layering.py): ``core`` at the bottom, then ``access``,
``credentials``, ``output``, ``releases``, ``trust`` and ``tunnels``, then ``dispatch``, then
``fleet``; :mod:`router.server` composes the process."""
