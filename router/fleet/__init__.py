"""Fleet management: the operator's view of collectors and their sessions, approve, deny, probe,
drain, revoke and vault settings, the calls to the enrollment service that owns collector status,
and the FleetService adapter."""
