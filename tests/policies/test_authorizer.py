"""Deny rules, role changes, the decision cache, persistence and policy/model validation."""

from __future__ import annotations

import threading
from pathlib import Path

import casbin
import pytest

from domain.errors import PermissionDeniedError
from policies import (
    AccessDecision,
    CasbinAuthorizer,
    PolicyDeniedError,
    PolicyError,
    PolicyRule,
    PolicyTableRow,
    RoleAssignment,
    packaged_model_text,
)
from policies.rules import PolicySet

READ_DIET = {
    "app_id": "app:planner",
    "tenant": "default",
    "action": "read",
    "category": "diet",
    "purpose": "personalization",
}
READ_HEALTH = {**READ_DIET, "category": "health"}
DENY_DIET = PolicyRule("role:assistant", "default", "read", "diet", "*", "deny")


# --- deny wins, deny by default ----------------------------------------------------------------


@pytest.mark.parametrize("deny_first", [True, False])
def test_explicit_deny_wins_over_an_allow_in_either_row_order(deny_first: bool) -> None:
    allow = ("p", "role:researcher", "t1", "read", "any", "*", "allow")
    deny = ("p", "role:careful", "t1", "read", "health", "*", "deny")
    rows = [deny, allow] if deny_first else [allow, deny]
    authorizer = CasbinAuthorizer.from_rows(
        [
            *rows,
            ("g", "app:x", "role:researcher", "t1"),
            ("g", "app:x", "role:careful", "t1"),
            ("g", "app:y", "role:researcher", "t1"),
        ]
    )
    ask = {"tenant": "t1", "action": "read", "purpose": "research"}
    assert not authorizer.is_allowed(app_id="app:x", category="health", **ask)
    assert authorizer.is_allowed(app_id="app:x", category="family", **ask)
    # The deny binds the role that carries it, not everyone.
    assert authorizer.is_allowed(app_id="app:y", category="health", **ask)


def test_a_broad_allow_added_to_the_seed_does_not_open_health(seeded: CasbinAuthorizer) -> None:
    seeded.add_rule(PolicyRule("role:assistant", "default", "read", "any", "*"))
    assert seeded.is_allowed(**{**READ_DIET, "category": "family"})
    with pytest.raises(PolicyDeniedError) as caught:
        seeded.authorize(**READ_HEALTH)
    assert caught.value.decision.rule[-1] == "deny"


def test_a_rule_for_one_tenant_does_not_leak_into_another() -> None:
    authorizer = CasbinAuthorizer.from_rows(
        [
            ("p", "role:assistant", "t1", "read", "diet", "personalization", "allow"),
            ("g", "app:planner", "role:assistant", "t1"),
            ("g", "app:planner", "role:nothing", "t2"),
        ]
    )
    assert authorizer.is_allowed(**{**READ_DIET, "tenant": "t1"})
    assert not authorizer.is_allowed(**{**READ_DIET, "tenant": "t2"})


def test_an_empty_policy_denies_everything() -> None:
    authorizer = CasbinAuthorizer.from_rows([])
    assert not authorizer.is_allowed(**READ_DIET)


def test_a_rule_can_name_an_app_directly() -> None:
    authorizer = CasbinAuthorizer.from_rows(
        [("p", "app:planner", "default", "read", "diet", "personalization", "allow")]
    )
    assert authorizer.is_allowed(**READ_DIET)
    assert not authorizer.is_allowed(**{**READ_DIET, "app_id": "app:other"})


def test_roles_can_hold_roles() -> None:
    authorizer = CasbinAuthorizer.from_rows(
        [
            ("p", "role:reader", "default", "read", "diet", "personalization", "allow"),
            ("g", "role:assistant", "role:reader", "default"),
            ("g", "app:planner", "role:assistant", "default"),
        ]
    )
    assert authorizer.is_allowed(**READ_DIET)
    assert PolicyTableRow(
        "app:planner", "role:reader", "read", "diet", "personalization", "allow"
    ) in authorizer.policy_table("default")


# --- role changes --------------------------------------------------------------------------------


def test_revoking_and_assigning_roles_takes_effect_at_once(seeded: CasbinAuthorizer) -> None:
    read_contact = {
        "app_id": "app:calendar",
        "tenant": "default",
        "action": "read",
        "category": "contact",
        "purpose": "scheduling",
    }
    assert seeded.is_allowed(**read_contact)
    assert seeded.revoke_role("app:calendar", "role:scheduler", "default")
    assert not seeded.is_allowed(**read_contact)
    assert not seeded.revoke_role("app:calendar", "role:scheduler", "default")

    assert seeded.assign_role("app:calendar", "role:assistant", "default")
    assert seeded.is_allowed(**{**READ_DIET, "app_id": "app:calendar"})
    assert not seeded.assign_role("app:calendar", "role:assistant", "default")
    assert RoleAssignment("app:calendar", "role:assistant", "default") in seeded.role_assignments()


def test_assigning_a_role_to_a_new_app_lets_it_in(seeded: CasbinAuthorizer) -> None:
    newcomer = {**READ_DIET, "app_id": "app:newcomer"}
    # Unknown apps are refused before Casbin is asked (its role manager would remember them).
    assert "no role or rule in this tenant" in seeded.decide(**newcomer).reason
    seeded.assign_role("app:newcomer", "role:assistant", "default")
    assert seeded.is_allowed(**newcomer)


@pytest.mark.parametrize(
    ("member", "role", "tenant"),
    [
        ("app:planner", "assistant", "default"),
        ("", "role:assistant", "default"),
        ("app:planner", "role:assistant", ""),
        ("app:planner", "role:assistant", "default,other"),
        ("app, planner", "role:assistant", "default"),
        ("role:assistant", "role:assistant", "default"),
    ],
)
def test_malformed_role_assignments_are_refused(
    seeded: CasbinAuthorizer, member: str, role: str, tenant: str
) -> None:
    before = seeded.role_assignments()
    with pytest.raises(PolicyError):
        seeded.assign_role(member, role, tenant)
    assert seeded.role_assignments() == before


# --- rules as data ---------------------------------------------------------------------------


def test_rules_lists_the_seed_in_file_order(seeded: CasbinAuthorizer) -> None:
    rules = seeded.rules("default")
    assert rules[0] == PolicyRule(
        "role:assistant", "default", "read", "preference", "personalization"
    )
    assert PolicyRule("role:assistant", "default", "read", "health", "*", "deny") in rules
    assert seeded.rules("acme") == ()


def test_policy_table_shows_who_may_do_what(seeded: CasbinAuthorizer) -> None:
    table = seeded.policy_table("default")
    assert table == tuple(sorted(table))
    assert (
        PolicyTableRow("app:planner", "role:assistant", "read", "diet", "personalization", "allow")
        in table
    )
    assert PolicyTableRow("app:planner", "role:assistant", "read", "health", "*", "deny") in table
    assert (
        PolicyTableRow("app:privacy-console", "role:dpo", "erase", "any", "erasure", "allow")
        in table
    )
    assert {row.app for row in table} == {
        "app:planner",
        "app:calendar",
        "app:privacy-console",
        "app:compliance-console",
        "operators",
    }
    assert seeded.policy_table("acme") == ()


@pytest.mark.parametrize(
    "rule",
    [
        PolicyRule("role:assistant", "default", "read", "heatlh", "*", "deny"),
        PolicyRule("role:assistant", "default", "delete", "diet", "*", "deny"),
        PolicyRule("role:assistant", "default", "read", "diet", "personal,ization"),
        PolicyRule("role:assistant", "default", "read", "diet", "personalization", "maybe"),
        PolicyRule("role:assistant", "default", "read", "diet", "personalization\n"),
        PolicyRule("role:Assistant", "default", "read", "diet", "personalization"),
        PolicyRule("", "default", "read", "diet", "personalization"),
        PolicyRule("role:assistant", "*", "read", "diet", "personalization"),
    ],
)
def test_malformed_rules_are_refused_and_change_nothing(
    seeded: CasbinAuthorizer, rule: PolicyRule
) -> None:
    version = seeded.policy_version
    with pytest.raises(PolicyError):
        seeded.add_rule(rule)
    assert seeded.policy_version == version
    assert rule not in seeded.rules()


def test_adding_an_existing_rule_or_removing_a_missing_one_changes_nothing(
    seeded: CasbinAuthorizer,
) -> None:
    version = seeded.policy_version
    assert not seeded.add_rule(seeded.rules()[0])
    assert not seeded.remove_rule(DENY_DIET)
    assert seeded.policy_version == version


# --- cache ---------------------------------------------------------------------------------------


def test_repeated_decisions_come_from_the_cache(seeded: CasbinAuthorizer) -> None:
    first = seeded.decide(**READ_DIET)
    before = seeded.cache_stats()
    assert seeded.decide(**READ_DIET) == first
    after = seeded.cache_stats()
    assert after.hits == before.hits + 1
    assert after.misses == before.misses


def test_adding_and_removing_a_rule_invalidates_cached_decisions(seeded: CasbinAuthorizer) -> None:
    assert seeded.is_allowed(**READ_DIET)
    version = seeded.policy_version
    assert seeded.add_rule(DENY_DIET)
    assert seeded.policy_version == version + 1
    denied = seeded.decide(**READ_DIET)
    assert not denied.allowed
    assert denied.policy_version == version + 1
    assert seeded.remove_rule(DENY_DIET)
    assert seeded.is_allowed(**READ_DIET)


def test_role_changes_invalidate_cached_decisions(seeded: CasbinAuthorizer) -> None:
    assert seeded.is_allowed(**READ_DIET)
    seeded.revoke_role("app:planner", "role:assistant", "default")
    assert not seeded.is_allowed(**READ_DIET)


def test_reload_from_rows_invalidates_cached_decisions(seeded: CasbinAuthorizer) -> None:
    assert seeded.is_allowed(**READ_DIET)
    seeded.reload([("g", "app:planner", "role:assistant", "default")])
    assert not seeded.is_allowed(**READ_DIET)
    assert seeded.cache_stats().entries == 1


def test_the_cache_is_bounded() -> None:
    authorizer = CasbinAuthorizer(packaged_model_text(), PolicySet(), cache_entries=4)
    for index in range(10):
        authorizer.decide(**{**READ_DIET, "app_id": f"app:a{index}"})
    assert authorizer.cache_stats().entries == 4


def test_concurrent_checks_and_changes_never_fail_or_mix(seeded: CasbinAuthorizer) -> None:
    errors: list[BaseException] = []
    stop = threading.Event()

    def check() -> None:
        try:
            while not stop.is_set():
                decision = seeded.decide(**READ_DIET)
                # Either the seed (allowed by its allow row) or seed + deny (denied by the deny).
                assert decision.rule[-1] == ("allow" if decision.allowed else "deny")
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=check) for _ in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(50):
        seeded.add_rule(DENY_DIET)
        seeded.remove_rule(DENY_DIET)
    stop.set()
    for thread in threads:
        thread.join()
    assert errors == []


# --- fail closed at the engine --------------------------------------------------------------------


def test_an_exception_inside_casbin_denies(
    seeded: CasbinAuthorizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object) -> tuple[bool, list[str]]:
        raise RuntimeError("boom")

    monkeypatch.setattr(casbin.Enforcer, "enforce_ex", broken)
    with pytest.raises(PermissionDeniedError, match="policy engine error"):
        seeded.authorize(**READ_DIET)


def test_authorize_all_refuses_an_empty_list_and_any_denial(seeded: CasbinAuthorizer) -> None:
    ask = {
        "app_id": "app:planner",
        "tenant": "default",
        "action": "read",
        "purpose": "personalization",
    }
    with pytest.raises(PolicyDeniedError, match="no categories"):
        seeded.authorize_all(**ask, categories=[])
    with pytest.raises(PolicyDeniedError, match="'health'"):
        seeded.authorize_all(**ask, categories=["diet", "health"])
    decisions = seeded.authorize_all(**ask, categories=["diet", "goal"])
    assert all(isinstance(d, AccessDecision) and d.allowed for d in decisions)


def test_decisions_for_refuses_a_bare_string(seeded: CasbinAuthorizer) -> None:
    ask = {
        "app_id": "app:planner",
        "tenant": "default",
        "action": "read",
        "purpose": "personalization",
    }
    with pytest.raises(TypeError):
        seeded.decisions_for(**ask, categories="diet")
    assert seeded.decisions_for(**ask, categories=[]) == {}


# --- persistence ---------------------------------------------------------------------------------


def test_changes_are_saved_to_the_policy_file_and_keep_its_comments(
    policy_file: Path, model_file: Path
) -> None:
    authorizer = CasbinAuthorizer.from_files(model_file, policy_file)
    authorizer.add_rule(DENY_DIET)
    authorizer.assign_role("app:newcomer", "role:assistant", "default")
    authorizer.revoke_role("app:calendar", "role:scheduler", "default")

    text = policy_file.read_text(encoding="utf-8")
    assert "# --- role:assistant" in text
    assert DENY_DIET.render() in text
    assert "g, app:calendar, role:scheduler, default" not in text

    reopened = CasbinAuthorizer.from_files(model_file, policy_file)
    assert reopened.rules() == authorizer.rules()
    assert reopened.role_assignments() == authorizer.role_assignments()
    assert not reopened.is_allowed(**READ_DIET)


def test_no_temporary_files_are_left_behind(policy_file: Path, model_file: Path) -> None:
    authorizer = CasbinAuthorizer.from_files(model_file, policy_file)
    authorizer.add_rule(DENY_DIET)
    assert sorted(p.name for p in policy_file.parent.iterdir()) == ["model.conf", "policy.csv"]


def test_a_failed_save_changes_neither_the_file_nor_the_policy_in_force(
    policy_file: Path, model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    authorizer = CasbinAuthorizer.from_files(model_file, policy_file)
    before = policy_file.read_text(encoding="utf-8")

    def refuse(self: Path, target: Path) -> Path:
        raise OSError("disk full")

    monkeypatch.setattr(Path, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        authorizer.add_rule(DENY_DIET)
    monkeypatch.undo()

    assert policy_file.read_text(encoding="utf-8") == before
    assert authorizer.is_allowed(**READ_DIET)
    assert DENY_DIET not in authorizer.rules()
    assert sorted(p.name for p in policy_file.parent.iterdir()) == ["model.conf", "policy.csv"]


def test_save_changes_false_leaves_the_file_alone(policy_file: Path, model_file: Path) -> None:
    before = policy_file.read_text(encoding="utf-8")
    authorizer = CasbinAuthorizer.from_files(model_file, policy_file, save_changes=False)
    authorizer.add_rule(DENY_DIET)
    assert not authorizer.is_allowed(**READ_DIET)
    assert policy_file.read_text(encoding="utf-8") == before


def test_reload_reads_edits_made_to_the_file(policy_file: Path, model_file: Path) -> None:
    authorizer = CasbinAuthorizer.from_files(model_file, policy_file)
    assert authorizer.is_allowed(**READ_DIET)
    with policy_file.open("a", encoding="utf-8") as stream:
        stream.write(DENY_DIET.render() + "\n")
    assert authorizer.is_allowed(**READ_DIET)  # not before reload
    authorizer.reload()
    assert not authorizer.is_allowed(**READ_DIET)


def test_a_bad_edit_is_refused_on_reload_and_the_old_policy_stays(
    policy_file: Path, model_file: Path
) -> None:
    authorizer = CasbinAuthorizer.from_files(model_file, policy_file)
    with policy_file.open("a", encoding="utf-8") as stream:
        stream.write("p, role:assistant, default, read, heatlh, *, deny\n")
    with pytest.raises(PolicyError, match="heatlh"):
        authorizer.reload()
    assert authorizer.is_allowed(**READ_DIET)


def test_reload_without_a_file_is_refused() -> None:
    with pytest.raises(PolicyError, match="nothing to reload"):
        CasbinAuthorizer.from_rows([]).reload()


def test_from_rows_and_from_files_decide_alike(policy_file: Path, model_file: Path) -> None:
    from_file = CasbinAuthorizer.from_files(model_file, policy_file, save_changes=False)
    rows = [("p", *rule.fields()) for rule in from_file.rules()]
    rows += [("g", *assignment.fields()) for assignment in from_file.role_assignments()]
    from_rows = CasbinAuthorizer.from_rows(rows, model_path=model_file)
    assert from_rows.policy_table("default") == from_file.policy_table("default")


# --- policy file and model validation -----------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("p, role:assistant, default, read, diet, personalization, allow # ok", "effect"),
        ("p, role:assistant, default, read, heatlh, *, deny", "heatlh"),
        ("g2, diet, preference", "g2 rows are not accepted"),
        ("p, role:assistant, default, read, diet, personalization", "6 fields"),
        ("p, role:assistant, default, read, diet, personal ization, allow", "purpose"),
        ("g, app:planner, assistant, default", "role"),
        ("x, app:planner, role:assistant, default", "expected 'p'"),
    ],
)
def test_malformed_policy_lines_are_refused_with_their_line_number(
    policy_file: Path, model_file: Path, line: str, complaint: str
) -> None:
    lines = policy_file.read_text(encoding="utf-8").splitlines()
    policy_file.write_text("\n".join([*lines, line]) + "\n", encoding="utf-8")
    with pytest.raises(PolicyError, match=complaint) as caught:
        CasbinAuthorizer.from_files(model_file, policy_file)
    assert f"line {len(lines) + 1}" in str(caught.value)


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        (
            "e = some(where (p.eft == allow)) && !some(where (p.eft == deny))",
            "e = some(where (p.eft == allow))",
            "effect",
        ),
        ("&& g2(r.cat, p.cat) ", "", "'cat'"),
        ('(p.purp == "*" || r.purp == p.purp)', "true", "'purp'"),
        ("r = sub, dom, act, cat, purp", "r = sub, dom, act, cat", "request"),
        ("g2 = _, _\n", "", "role definitions"),
    ],
)
def test_a_model_that_would_weaken_the_policy_is_refused(
    policy_file: Path, model_file: Path, old: str, new: str, complaint: str
) -> None:
    text = model_file.read_text(encoding="utf-8")
    assert old in text
    model_file.write_text(text.replace(old, new), encoding="utf-8")
    with pytest.raises(PolicyError, match=complaint):
        CasbinAuthorizer.from_files(model_file, policy_file)


def test_a_policy_built_by_hand_is_checked_too() -> None:
    bad = PolicySet(rules=(PolicyRule("role:assistant", "default", "read", "heatlh", "*", "deny"),))
    with pytest.raises(PolicyError, match="heatlh"):
        CasbinAuthorizer(packaged_model_text(), bad)


def test_changing_one_tenant_leaves_the_others_alone() -> None:
    authorizer = CasbinAuthorizer.from_rows(
        [
            ("p", "role:assistant", "t1", "read", "diet", "personalization", "allow"),
            ("p", "role:assistant", "t2", "read", "diet", "personalization", "allow"),
            ("g", "app:planner", "role:assistant", "t1"),
            ("g", "app:planner", "role:assistant", "t2"),
        ]
    )
    authorizer.add_rule(PolicyRule("role:assistant", "t1", "read", "diet", "*", "deny"))
    assert not authorizer.is_allowed(**{**READ_DIET, "tenant": "t1"})
    assert authorizer.is_allowed(**{**READ_DIET, "tenant": "t2"})

    # A tenant that appears with the first change works at once, and goes with its last row.
    authorizer.assign_role("app:planner", "role:assistant", "t3")
    authorizer.add_rule(PolicyRule("role:assistant", "t3", "read", "diet", "personalization"))
    assert authorizer.is_allowed(**{**READ_DIET, "tenant": "t3"})
    authorizer.revoke_role("app:planner", "role:assistant", "t3")
    assert not authorizer.is_allowed(**{**READ_DIET, "tenant": "t3"})


# --- no Python parser per decision ----------------------------------------------------------------
# CPython 3.11 keeps the AST constructor's recursion depth in interpreter-wide state: two
# threads in ``ast.parse`` at once can make either raise ``SystemError: AST constructor
# recursion depth mismatch`` (python/cpython#106905). pycasbin parsed its matcher with
# ``ast.parse`` on every ``enforce``, so any other thread parsing (another tenant's server in
# the same process, a library) turned a permitted request into a "policy engine error"
# denial now and then (seen once in the two-tenant API tests, PostgreSQL).


def test_decisions_do_not_parse_python_after_the_policy_is_built(
    seeded: CasbinAuthorizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    import casbin.util.expression

    def parser_in_use_elsewhere(*_: object, **__: object) -> None:
        raise SystemError("AST constructor recursion depth mismatch (before=15, after=-123)")

    # Casbin's own reference to the parser (patching ``ast.parse`` itself would break
    # pytest's reporting, which parses too).
    monkeypatch.setattr(
        casbin.util.expression, "ast", types.SimpleNamespace(parse=parser_in_use_elsewhere)
    )
    seeded.clear_cache()
    assert seeded.decide(**READ_DIET).allowed
    assert not seeded.decide(**READ_HEALTH).allowed
    assert "engine error" not in seeded.decide(**READ_HEALTH).reason
