"""Keys and what is signed with them: Ed25519 key sets and their in-band rotation chains, the
Collector and gateway CAs, X.509 helpers and gateway TLS material, the trust bundle, signed
documents, collector JWTs and report signatures, relayed credentials and the operator master keys."""
