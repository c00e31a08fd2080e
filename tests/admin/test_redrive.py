"""What a redrive takes: the filter of final dlqIds, refused in words naming the key."""

from __future__ import annotations

import pytest

from daemon.admin.redrive import RedriveFieldError, RedriveFilter


def refusal(data: object) -> str:
    with pytest.raises(RedriveFieldError) as refused:
        RedriveFilter.from_json(data)
    return str(refused.value)


def test_a_mistyped_state_is_refused_with_the_nearest_final_state() -> None:
    """`faild` is not a state: the refusal lists the final states and names `failed`."""
    assert refusal({"states": ["faild"]}) == (
        "states: 'faild' is not a final state (done, dry-run, failed, gone, skipped); "
        "did you mean 'failed'?"
    )


def test_a_state_that_is_not_final_is_refused_without_a_guess() -> None:
    """`received` is a state, but not one a redrive takes; no final state is near it."""
    assert refusal({"state": "received"}) == (
        "states: 'received' is not a final state (done, dry-run, failed, gone, skipped)"
    )


def test_an_unknown_key_is_refused_with_the_nearest_key() -> None:
    """A key the filter does not take is an unknown key, with the nearest one."""
    assert refusal({"stats": ["failed"]}) == "stats: unknown key 'stats'; did you mean 'states'?"


def test_an_empty_selection_of_dlq_ids_is_refused() -> None:
    """`dlqIds: []` would select nothing by mistake: refused, naming the field."""
    assert refusal({"dlqIds": []}).startswith("dlqIds: ")


def test_a_selection_of_dlq_ids_is_taken_as_given() -> None:
    assert RedriveFilter.from_json({"dlqIds": ["b", "a"]}).dlqIds == ("b", "a")
