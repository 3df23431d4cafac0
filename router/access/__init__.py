"""AccessService: API tokens and the audit log, over gRPC (storage is common/access/)."""
