"""The scale targets the fleet benchmarks print their ratio to (issue 39; docs/benchmarks.md).

A ratio is measured / target for a ceiling: at or under 1.00 the row meets it. Where the target is
stated for one fleet size (the idle rows: 10,000 collectors), other sizes print no ratio rather
than a prorated guess.
"""

from __future__ import annotations

# 10,000 idle collectors on one gateway, HTTPS and WSS alike.
IDLE_FLEET = 10_000
IDLE_GATEWAY_RSS_MIB = 512.0
IDLE_GATEWAY_CPU_PCT = 25.0
IDLE_ROUTER_CPU_PCT = 5.0
# A gateway SIGKILLed under its fleet and started again: 99 % back within, and all within.
STORM_BACK_P99_S = 60.0
STORM_BACK_ALL_S = 120.0


def ratio(measured: float | None, target: float) -> str:
    """``measured / target`` as the tables print it, marked met or over (a ceiling)."""
    if measured is None:
        return "—"
    share = measured / target
    return f"{share:.2f}x {'met' if share <= 1.0 else 'over'}"


def idle_ratios(result: dict[str, float]) -> tuple[str, str, str]:
    """Gateway RSS, gateway CPU and router CPU of one idle point against the targets."""
    if result["collectors"] != IDLE_FLEET:
        return ("—", "—", "—")
    return (
        ratio(result["gateway_rss_mib"], IDLE_GATEWAY_RSS_MIB),
        ratio(result["gateway_cpu_pct"], IDLE_GATEWAY_CPU_PCT),
        ratio(result["router_cpu_pct"], IDLE_ROUTER_CPU_PCT),
    )
