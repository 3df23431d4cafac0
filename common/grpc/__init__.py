"""gRPC plumbing every service shares: the server base (auth, request ids, error mapping, health,
reflection), client channels that present an API token, where a process finds that token, and
the protobuf time and Struct conversions used at the edge."""
