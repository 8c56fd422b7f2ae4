"""I3, I4, I5: randomized multi-agent, multi-app, multi-subject histories; 0 leaks."""

from __future__ import annotations

import pytest

from benchmarks.reliability import Target, leakage_scenario, visible_oracle


def test_visibility_oracle_is_strict() -> None:
    # The test's own oracle, checked against the documented I4 rules.
    assert visible_oracle("agent:a", "private", "agent:a", "")
    assert not visible_oracle("agent:a", "private", "agent:b", "coach")
    assert not visible_oracle("agent:a", "Shared!", "agent:b", "")
    assert not visible_oracle("agent:a", "", "agent:b", "")
    assert visible_oracle("agent:a", "shared", "agent:b", "")
    assert visible_oracle("agent:a", "shared:coach", "agent:b", "coach")
    assert not visible_oracle("agent:a", "shared:coach", "agent:b", "travel")


@pytest.mark.parametrize("seed", [7, 8])
def test_no_leak_across_agents_apps_and_subjects(target: Target, seed: int) -> None:
    r = leakage_scenario(target, subjects=4, captures=50, slices=150, seed=seed)
    assert r["items_served"] > 50, "too few items served for the check to mean anything"
    assert r["private_items_served_to_their_owner"] > 0
    assert r["unverifiable_items"] == 0
    assert r["private_to_non_owner"] == 0, r["leak_samples"]
    assert r["outside_policy_or_consent"] == 0, r["leak_samples"]
    # An app with no consent of the subject learns nothing of it, not even that it exists.
    assert r["served_without_consent"] == 0, r["leak_samples"]
    assert r["refused_without_consent"] > 0  # app:rogue asked, so the check ran
    assert r["refused_with_consent"] == 0
    assert r["other_subject"] == 0, r["leak_samples"]
