"""The operator web console (docs/console.md): server-rendered pages over the services' gRPC APIs.

The console holds no authority of its own. An operator signs in with an API token; every page
and every action is a gRPC call made with that token, so the router's and the enrollment
service's RBAC decide what happens, exactly as for the CLI. The console only hides the
buttons the operator's role could not use anyway (:mod:`common.access.rbac`'s table).
"""
