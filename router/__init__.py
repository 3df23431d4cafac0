"""Task Router: placement, device leases, signed dispatch, the unknown-outcome ladder, fleet control."""
