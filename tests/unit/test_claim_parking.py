"""Whether a claim parks in the gateway or goes to the router (gateway/parking/decide.py), fed values."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.parking.decide import PARK_MIN_HOLD_S, ClaimNews, Forward, ParkState, forward_reason
from gateway.parking.hub import LIVENESS_WINDOW_S
from router.core.fleet_state import DEAD_AFTER_S

NEWS = ClaimNews(
    session_id="s-1", transport="wss", protocol=5, draining=False, agent_version="1.2.0",
    vault_mode="local", config_version=3, max_tasks=4, key_versions=(("dispatch", 2), ("trust", 1)),
    free_slots=(("ssh", 4),), held_task_ids=(),
)  # fmt: skip
REFRESH_S = 300.0


def reason(state: ParkState, news: ClaimNews = NEWS, now: float = 10.0, **kw: object) -> Forward | None:
    args: dict[str, object] = {"subscribed": True, "resume": False, "refresh_s": REFRESH_S, "hold_s": 25.0}
    args.update(kw)
    return forward_reason(state, news, now, **args)  # type: ignore[arg-type]


def quiet_state(at: float = 0.0) -> ParkState:
    """A collector whose last claim went to the router at ``at`` and was answered with nothing."""
    state = ParkState()
    state.forwarding(at)
    state.answered(NEWS, empty=True)
    return state


def test_the_first_claim_a_gateway_sees_goes_to_the_router() -> None:
    assert reason(ParkState()) is Forward.FIRST


def test_a_repeated_claim_answered_empty_parks() -> None:
    assert reason(quiet_state()) is None


def test_an_answer_with_anything_in_it_sends_the_next_claim_to_the_router() -> None:
    # Work, offers, verdicts, a config: the next claim confirms what it received (the ladder).
    state = ParkState()
    state.forwarding(0.0)
    state.answered(NEWS, empty=False)
    assert reason(state) is Forward.FIRST


@pytest.mark.parametrize(
    "change",
    [
        {"session_id": "s-2"},
        {"transport": "https"},
        {"protocol": 4},
        {"draining": True},
        {"agent_version": "1.3.0"},
        {"vault_mode": "external"},
        {"config_version": 4},
        {"max_tasks": 1},
        {"key_versions": (("dispatch", 3), ("trust", 1))},
        {"free_slots": (("ssh", 3),)},
        {"held_task_ids": ("tsk-1",)},
        {"update_status": (("state", "applied"), ("version", "1.3.0"))},
    ],
)
def test_anything_new_in_a_claim_goes_to_the_router(change: dict[str, object]) -> None:
    assert reason(quiet_state(), dataclasses.replace(NEWS, **change)) is Forward.NEWS  # type: ignore[arg-type]


def test_a_wake_up_since_the_last_forwarded_claim_sends_the_next_one() -> None:
    state = quiet_state()
    state.mark(Forward.WOKEN)
    state.mark(Forward.LIVENESS)  # the first reason is the one reported
    assert reason(state) is Forward.WOKEN
    state.forwarding(11.0)
    state.answered(NEWS, empty=True)
    assert reason(state, now=12.0) is None


def test_a_wake_up_while_a_claim_is_with_the_router_is_kept_for_the_next() -> None:
    state = quiet_state()
    state.forwarding(5.0)
    state.mark(Forward.WOKEN)  # announced after the router looked, before it answered
    state.answered(NEWS, empty=True)
    assert reason(state) is Forward.WOKEN


def test_a_replaced_subscription_forgets_the_quiet_claim() -> None:
    state = quiet_state()
    state.forget()
    assert reason(state) is Forward.FIRST


def test_without_a_subscription_nothing_parks() -> None:
    assert reason(quiet_state(), subscribed=False) is Forward.UNSUBSCRIBED


def test_a_resume_claim_and_a_poll_go_to_the_router() -> None:
    assert reason(quiet_state(), resume=True) is Forward.RESUME
    assert reason(quiet_state(), hold_s=PARK_MIN_HOLD_S - 0.01) is Forward.SHORT
    assert reason(quiet_state(), hold_s=PARK_MIN_HOLD_S) is None


def test_a_claim_goes_to_the_router_at_least_once_per_refresh_period() -> None:
    assert reason(quiet_state(at=0.0), now=REFRESH_S - 0.1) is None
    assert reason(quiet_state(at=0.0), now=REFRESH_S) is Forward.REFRESH


def test_parked_heartbeats_use_the_routers_liveness_window() -> None:
    assert LIVENESS_WINDOW_S == DEAD_AFTER_S
