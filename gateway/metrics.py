"""Gateway metrics for the collector API (exposed on the gateway's /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

CLAIMS_HELD = Gauge("versus_gateway_claims_held", "Claims currently held open waiting for work.")
CLAIM_OUTCOMES = Counter("versus_gateway_claims_total", "Claims answered, by outcome.", ["outcome"])
AUTH_FAILURES = Counter(
    "versus_gateway_auth_failures_total", "Refused bearer tokens, by error code.", ["code"]
)
REPLAY_CHECKS = Counter(
    "versus_gateway_replay_checks_total",
    "Bearer token ids checked against the replay cache: accepted, replayed, unavailable (refused), "
    "skipped (a read while the cache was down).",
    ["result"],
)
REPORT_OUTCOMES = Counter("versus_gateway_reports_total", "Reports accepted, by outcome.", ["outcome"])
CONTROL_SOCKETS = Gauge("versus_gateway_control_sockets", "Open WebSocket control channels.")
SOCKETS_SHED = Counter(
    "versus_gateway_sockets_shed_total", "WebSocket handshakes refused 503 gateway_busy (admission limit)."
)
EDGE_REFUSALS = Counter(
    "versus_gateway_edge_refusals_total",
    "Connections refused or cut at the edge before the app saw them (gateway/edge.py), by code.",
    ["code"],
)
CLAIMS_PARKED = Counter(
    "versus_gateway_claims_parked_total",
    "Claims that waited in the gateway without a router call (gateway/parking/).",
)
CLAIMS_FORWARDED = Counter(
    "versus_gateway_claims_forwarded_total",
    "Claims taken to the router, by why (gateway/parking/decide.py Forward).",
    ["reason"],
)
PARKING_WATCHES = Gauge(
    "versus_gateway_parking_watches", "Collectors whose wake-ups this gateway is subscribed to."
)
HANDSHAKES = Counter(
    "versus_gateway_tls_handshakes_total",
    "TLS handshakes the listener started (gateway/listener.py), by how they ended: done or failed.",
    ["outcome"],
)
HANDSHAKES_IN_PROGRESS = Gauge(
    "versus_gateway_tls_handshakes_in_progress",
    "TLS handshakes in progress (at most VERSUS_GATEWAY_MAX_HANDSHAKES).",
)
HANDSHAKES_WAITING = Gauge(
    "versus_gateway_tls_handshakes_waiting",
    "Accepted connections waiting for a TLS handshake slot (gateway/admission.py).",
)
HANDSHAKE_BUDGET = Gauge(
    "versus_gateway_tls_handshake_budget",
    "TLS handshakes allowed at once now: VERSUS_GATEWAY_MAX_HANDSHAKES, less while the event loop is late.",
)
LOOP_LAG = Gauge(
    "versus_gateway_event_loop_lag_seconds",
    "How late the gateway's event loop ran a 100 ms timer at its last sample.",
)
TRACES_DROPPED = Counter(
    "versus_gateway_report_traces_dropped_total",
    "Reports whose trace member did not fit its limits: the spans were dropped, the report recorded.",
)
TUNNEL_SESSIONS = Gauge(
    "versus_gateway_tunnel_sessions", "Tunnel sessions this gateway holds, by tunnel protocol.", ["protocol"]
)
TUNNEL_ENDS = Counter(
    "versus_gateway_tunnel_sessions_ended_total",
    'Tunnel sessions ended here, by reason (docs/gateway.md, "Tunnels").',
    ["reason"],
)
TUNNEL_RESUMES = Counter(
    "versus_gateway_tunnel_resumes_total",
    "Collector sockets that picked a dropped tunnel session up again (its second and later legs).",
)
TUNNEL_BYTES = Counter(
    "versus_gateway_tunnel_bytes_total",
    "Tunnel bytes relayed between attached platforms and collectors, by direction.",
    ["direction"],
)
CONNECTIONS = Gauge("versus_gateway_connections", "Connections open (TLS done), collectors' and others'.")
CONNECTIONS_LIMIT = Gauge(
    "versus_gateway_connections_limit",
    "Most connections the gateway keeps open (past it, new ones are shed).",
)
