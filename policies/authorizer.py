"""CasbinAuthorizer: who may do what to which category of a profile, for which purpose.

Every read, capture, proposal, erasure, export and audit read is checked against the Casbin
model in ``model.conf`` (app x tenant x action x category x purpose; deny wins; deny by
default). Consent is not decided here: the kernel checks it separately.

Design choices:

- Checks raise (STYLE P8). ``authorize`` returns an allowing ``AccessDecision`` or raises
  ``PolicyDeniedError`` (a ``PermissionDeniedError``); ``is_allowed`` and ``decisions_for``
  return decisions for callers that filter many categories at once.
- Fail closed. A malformed request (empty app id, unknown category, purpose with a comma or a
  newline, a role posing as an app) is denied before Casbin sees it, with a reason that names
  the bad field but never repeats its value, which could hold personal data. An app or tenant
  the policy never mentions is denied without calling Casbin: pycasbin's role manager creates
  an entry for every name it is asked about, so unknown names would grow it without bound.
  Any exception from Casbin becomes a denial.
- One enforcer per tenant. Every change builds fresh enforcers for the tenants it touches
  and swaps them in under a lock, so a request sees the old policy or the new one, never
  half of a change. Decisions are cached
  per request and policy version; a change bumps the version and clears the cache.
- Policy changes are saved to the policy file (write temp file, fsync, rename) before they
  take effect, so what runs is what is on disk. The deployed policy is event-sourced
  (``uprof.services.policy``): it feeds this class through ``reload(rows, version=...)``.
"""

from __future__ import annotations

import ast
import logging
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import casbin
from casbin.effect import AllowAndDenyEffector

from domain.errors import PermissionDeniedError, UprofError
from policies.rules import (
    DENY,
    ROLE_PREFIX,
    PolicyError,
    PolicyRule,
    PolicySet,
    RoleAssignment,
    action_problem,
    app_id_problem,
    category_links,
    check_assignment,
    parse_policy_text,
    policy_from_rows,
    purpose_problem,
    render_policy,
    request_category_problem,
    tenant_problem,
    write_atomically,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

_log = logging.getLogger(__name__)

#: Request and policy tokens the model must define, in this order (pycasbin prefixes them).
_REQUEST_TOKENS = ("r_sub", "r_dom", "r_act", "r_cat", "r_purp")
_POLICY_TOKENS = ("p_sub", "p_dom", "p_act", "p_cat", "p_purp", "p_eft")
_DEFAULT_CACHE_ENTRIES = 65_536
_REFUSED = "<refused>"


@dataclass(frozen=True)
class AccessDecision:
    """The outcome of one policy check.

    ``rule`` is the policy row that decided (subject, tenant, action, category, purpose,
    effect), or empty when nothing matched or the request was refused before the policy.
    ``policy_version`` lets an audit entry say which policy decided. ``store_error``: set
    on a denial the policy did not decide, because its store could not be read (or is
    damaged); the error class a request that must not pass that denial off as the
    policy's raises, with ``reason`` (a slice, which filters rather than refuses: bug OL).
    """

    allowed: bool
    rule: tuple[str, ...] = ()
    reason: str = ""
    policy_version: int = 0
    store_error: type[UprofError] | None = None


class PolicyDeniedError(PermissionDeniedError):
    """The policy refused a request; ``decision`` says which rule, if any, and why."""

    def __init__(self, decision: AccessDecision) -> None:
        """Carry decision; its reason becomes the message."""
        super().__init__(decision.reason)
        self.decision = decision


@dataclass(frozen=True, order=True)
class PolicyTableRow:
    """One line of "who may do what": app, the role it holds it through, and the rule.

    ``role`` is empty when the rule names the app directly.
    """

    app: str
    role: str
    action: str
    category: str
    purpose: str
    effect: str


@dataclass(frozen=True)
class CacheStats:
    """Decision cache counters since construction; entries is the current size."""

    hits: int
    misses: int
    entries: int


# --- packaged files ----------------------------------------------------------------------------


def packaged_model_text() -> str:
    """Return the text of the model.conf shipped with this package."""
    return resources.files(__package__).joinpath("model.conf").read_text(encoding="utf-8")


def packaged_seed_policy_text() -> str:
    """Return the text of the seed_policy.csv shipped with this package."""
    return resources.files(__package__).joinpath("seed_policy.csv").read_text(encoding="utf-8")


def copy_seed_policy(destination: Path) -> bool:
    """Write the seed policy to destination unless a file is already there.

    Point the policy-path setting at a writable copy, not at the packaged seed: saved
    changes rewrite the file. Returns True when the file was written.
    """
    if destination.exists():
        return False
    write_atomically(destination, packaged_seed_policy_text())
    return True


# --- the enforcer behind one policy version ----------------------------------------------------

_RequestKey = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class _TenantEngine:
    """The enforcer of one tenant, with the rows it was built from."""

    policy: PolicySet
    enforcer: Any  # casbin.Enforcer is untyped; it never leaves this module


@dataclass(frozen=True)
class _Snapshot:
    """One policy version: an enforcer per tenant and the names each tenant knows.

    The matcher requires the request tenant to equal the rule tenant, so splitting rows by
    tenant changes no decision; it keeps Casbin's per-request cost (linear in the rows it
    scans) proportional to one tenant's policy instead of all of them.
    """

    engines: Mapping[str, _TenantEngine]
    version: int
    subjects: Mapping[str, frozenset[str]]


def _build_snapshot(
    model_text: str, policy: PolicySet, version: int, previous: Mapping[str, _TenantEngine]
) -> _Snapshot:
    """Build the engines for policy, reusing those of tenants whose rows did not change."""
    engines: dict[str, _TenantEngine] = {}
    for tenant in policy.tenants():
        rows = policy.for_tenant(tenant)
        old = previous.get(tenant)
        if old is not None and old.policy == rows:
            engines[tenant] = old
        else:
            engines[tenant] = _TenantEngine(rows, _build_enforcer(model_text, rows))
    return _Snapshot(engines, version, policy.subjects_by_tenant())


class _ParsedOnceEnforcer(casbin.Enforcer):  # type: ignore[misc]  # casbin is untyped
    """A Casbin enforcer that parses each matcher expression once per process.

    pycasbin builds its matcher evaluator with ``ast.parse`` on every ``enforce``. CPython
    3.11 keeps the AST constructor's recursion depth in interpreter-wide state, so another
    thread inside ``ast.parse`` at the same moment (a second tenant's server in the process,
    any library) can make either raise ``SystemError: AST constructor recursion depth
    mismatch`` (python/cpython#106905): a permitted request then failed closed as a
    "policy engine error". Parsed once, under a lock, a decision never enters the parser.
    The parsed tree is only read by the evaluator, so the tree is shared.
    """

    @staticmethod
    def _get_expression(expr: str, functions: Any = None) -> Any:
        parsed = _parsed_matchers.get(expr)
        if parsed is None:
            # Not a matcher an enforcer was built with (pycasbin asking with another
            # expression): pycasbin's own evaluator, parsed now and kept by no one, so
            # nothing a request sends grows the parsed matchers.
            return casbin.Enforcer._get_expression(expr, functions)
        evaluator = casbin.Enforcer._get_expression("", functions)  # parses nothing
        evaluator.expr = expr
        evaluator.ast_parsed_value = parsed
        return evaluator


_parsed_matchers: dict[str, Any] = {}
_parsing = threading.Lock()


def _parsed_matcher(expr: str) -> Any:
    """The parsed form of one matcher expression, as pycasbin's evaluator parses it."""
    parsed = _parsed_matchers.get(expr)
    if parsed is None:
        with _parsing:
            parsed = _parsed_matchers.get(expr)
            if parsed is None:
                # pycasbin's own rewriting of Casbin's operators (casbin.Enforcer._get_expression),
                # then its parse (casbin.util.SimpleEval).
                python = re.sub(r"!(?!=)", "not ", expr.replace("&&", "and").replace("||", "or"))
                parsed = _parsed_matchers[expr] = ast.parse(python.strip(), mode="eval").body
    return parsed


def _build_enforcer(model_text: str, policy: PolicySet) -> Any:
    """Build an in-memory enforcer for policy, after checking the model has the right shape."""
    try:
        enforcer = _ParsedOnceEnforcer(casbin.Enforcer.new_model(text=model_text))
    except Exception as exc:
        msg = f"model does not load: {type(exc).__name__}: {exc}"
        raise PolicyError(msg) from exc
    _check_model(enforcer.model, enforcer.eft)
    _parsed_matcher(enforcer.model["m"]["m"].value)  # parsed here, not in a request
    if policy.rules:
        enforcer.add_policies([list(rule.fields()) for rule in policy.rules])
    if policy.assignments:
        enforcer.add_named_grouping_policies("g", [list(a.fields()) for a in policy.assignments])
    enforcer.add_named_grouping_policies("g2", [list(link) for link in category_links()])
    return enforcer


def _check_model(model: Any, effector: Any) -> None:
    """Refuse a model that would silently weaken the policy.

    An edited model that drops a request field from the matcher, or switches to an
    allow-override effect, would still load and answer: it must fail at start instead.
    """
    try:
        request = tuple(model["r"]["r"].tokens)
        policy = tuple(model["p"]["p"].tokens)
        role_defs = set(model["g"].keys())
        matcher = model["m"]["m"].value
    except KeyError as exc:
        msg = f"model lacks section or key {exc}"
        raise PolicyError(msg) from None
    problems = [
        request != _REQUEST_TOKENS and "request must be r = sub, dom, act, cat, purp",
        policy != _POLICY_TOKENS and "policy must be p = sub, dom, act, cat, purp, eft",
        role_defs != {"g", "g2"} and "role definitions must be exactly g and g2",
        not isinstance(effector, AllowAndDenyEffector)
        and "effect must be: allow if some rule allows and none denies",
        # pycasbin rewrites an eval() matcher with each rule's text per decision: a rule's
        # text would be evaluated, and the matcher parsed at start not the one decided with.
        casbin.util.has_eval(matcher) is not None and "matcher must not use eval()",
        *(
            f"matcher ignores request field {token[2:]!r}"
            for token in _REQUEST_TOKENS
            if token not in matcher
        ),
    ]
    reasons = [problem for problem in problems if problem]
    if reasons:
        msg = "model rejected: " + "; ".join(reasons)
        raise PolicyError(msg)


class _DecisionCache:
    """A bounded LRU map from (policy version, request) to decision. Not thread-safe."""

    def __init__(self, max_entries: int) -> None:
        self._entries: OrderedDict[tuple[int, _RequestKey], AccessDecision] = OrderedDict()
        self._max_entries = max_entries
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[int, _RequestKey]) -> AccessDecision | None:
        decision = self._entries.get(key)
        if decision is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return decision

    def put(self, key: tuple[int, _RequestKey], decision: AccessDecision) -> None:
        self._entries[key] = decision
        if len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


# --- the authorizer ----------------------------------------------------------------------------


class CasbinAuthorizer:
    """Decide requests against a Casbin policy; raise PolicyDeniedError on deny.

    Thread-safe: checks and changes take one lock. Build it with ``from_files`` (policy file
    is a setting; changes are saved back to it), ``from_rows`` (rows loaded by the caller,
    changes kept in memory) or ``seeded`` (the packaged seed, in memory).
    """

    def __init__(
        self,
        model_text: str,
        policy: PolicySet,
        *,
        policy_path: Path | None = None,
        save_changes: bool = False,
        cache_entries: int = _DEFAULT_CACHE_ENTRIES,
        policy_text: str = "",
    ) -> None:
        """Build from model text and a policy.

        ``policy_text`` is the file the policy came from; saving keeps its comments.
        Raises PolicyError when the model or any row of the policy is malformed.
        """
        policy = policy.checked()
        self._model_text = model_text
        self._policy_path = policy_path
        self._save_changes = save_changes and policy_path is not None
        self._policy_text = policy_text
        self._policy = policy
        self._lock = threading.RLock()
        self._cache = _DecisionCache(cache_entries)
        # Checks the model even when the policy is empty and builds no tenant engine.
        _build_enforcer(model_text, PolicySet())
        self._snapshot = _build_snapshot(model_text, policy, 1, {})

    @classmethod
    def from_files(
        cls, model_path: Path | str, policy_path: Path | str, *, save_changes: bool = True
    ) -> CasbinAuthorizer:
        """Load model.conf and a policy CSV; with save_changes, changes rewrite the CSV."""
        policy_path = Path(policy_path)
        text = policy_path.read_text(encoding="utf-8")
        return cls(
            Path(model_path).read_text(encoding="utf-8"),
            parse_policy_text(text, source=policy_path.name),
            policy_path=policy_path,
            save_changes=save_changes,
            policy_text=text,
        )

    @classmethod
    def from_rows(
        cls, rows: Iterable[Sequence[str]], *, model_path: Path | str | None = None
    ) -> CasbinAuthorizer:
        """Build from casbin-style rows such as ``("p", subject, tenant, ...)``, in memory."""
        model_text = (
            packaged_model_text()
            if model_path is None
            else Path(model_path).read_text(encoding="utf-8")
        )
        return cls(model_text, policy_from_rows(rows))

    @classmethod
    def seeded(cls) -> CasbinAuthorizer:
        """Build from the packaged model and seed policy; changes stay in memory."""
        text = packaged_seed_policy_text()
        policy = parse_policy_text(text, source="seed_policy.csv")
        return cls(packaged_model_text(), policy, policy_text=text)

    # --- checks --------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """Return the version of the policy in force; it grows by one per change or reload."""
        return self._snapshot.version

    def authorize(
        self, *, app_id: str, tenant: str, action: str, category: str, purpose: str
    ) -> AccessDecision:
        """Return the allowing decision, or raise PolicyDeniedError (a PermissionDeniedError).

        The error message names app, action, category, purpose and tenant (malformed fields
        are shown as ``<refused>``) and the deciding rule; never any profile data.
        """
        decision = self.decide(
            app_id=app_id, tenant=tenant, action=action, category=category, purpose=purpose
        )
        if not decision.allowed:
            raise PolicyDeniedError(decision)
        return decision

    def is_allowed(
        self, *, app_id: str, tenant: str, action: str, category: str, purpose: str
    ) -> bool:
        """Return whether the policy allows the request; never raises."""
        return self.decide(
            app_id=app_id, tenant=tenant, action=action, category=category, purpose=purpose
        ).allowed

    def decisions_for(
        self, *, app_id: str, tenant: str, action: str, purpose: str, categories: Iterable[str]
    ) -> dict[str, AccessDecision]:
        """Decide one request per category, for a slice builder filtering what it may serve.

        Never raises for a denial; an empty iterable gives an empty dict (nothing allowed).
        """
        if isinstance(categories, str):
            msg = "categories must be an iterable of category names, not one string"
            raise TypeError(msg)
        return {
            category: self.decide(
                app_id=app_id, tenant=tenant, action=action, category=category, purpose=purpose
            )
            for category in categories
        }

    def authorize_all(
        self, *, app_id: str, tenant: str, action: str, purpose: str, categories: Iterable[str]
    ) -> tuple[AccessDecision, ...]:
        """Authorize every category (e.g. a whole-profile export), or raise on the first deny.

        An empty list is refused: a combined check over nothing must not pass (STYLE P8).
        """
        decisions = self.decisions_for(
            app_id=app_id, tenant=tenant, action=action, purpose=purpose, categories=categories
        )
        if not decisions:
            empty = AccessDecision(False, (), "denied: no categories to check", self.policy_version)
            raise PolicyDeniedError(empty)
        for decision in decisions.values():
            if not decision.allowed:
                raise PolicyDeniedError(decision)
        return tuple(decisions.values())

    def decide(
        self, *, app_id: str, tenant: str, action: str, category: str, purpose: str
    ) -> AccessDecision:
        """Return the decision for one request, allowed or not; never raises."""
        problem = _request_problem(app_id, tenant, action, category, purpose)
        if problem is not None:
            summary = _summary(app_id, tenant, action, category, purpose)
            return AccessDecision(False, (), f"{summary}: {problem}", self.policy_version)
        request: _RequestKey = (app_id, tenant, action, category, purpose)
        with self._lock:
            snapshot = self._snapshot
            cached = self._cache.get((snapshot.version, request))
            if cached is not None:
                return cached
            decision = _evaluate(snapshot, request)
            self._cache.put((snapshot.version, request), decision)
            return decision

    def cache_stats(self) -> CacheStats:
        """Return decision cache hits, misses and size."""
        with self._lock:
            return CacheStats(self._cache.hits, self._cache.misses, len(self._cache))

    def clear_cache(self) -> None:
        """Drop every cached decision (the policy is unchanged)."""
        with self._lock:
            self._cache.clear()

    # --- the policy as data --------------------------------------------------------------------

    def rules(self, tenant: str | None = None) -> tuple[PolicyRule, ...]:
        """Return the policy rules in file order, optionally of one tenant."""
        return tuple(r for r in self._policy.rules if tenant is None or r.tenant == tenant)

    def role_assignments(self, tenant: str | None = None) -> tuple[RoleAssignment, ...]:
        """Return the role assignments in file order, optionally of one tenant."""
        assignments = self._policy.assignments
        return tuple(a for a in assignments if tenant is None or a.tenant == tenant)

    def policy_table(self, tenant: str) -> tuple[PolicyTableRow, ...]:
        """Return "who may do what" in tenant: one row per app and rule that applies to it.

        Roles held through other roles are followed. Categories are shown as written in the
        rule (``any`` stands for the whole catalogue); a deny row overrides allows for the
        same app, action, category and purpose.
        """
        policy = self._policy
        roles_of: dict[str, set[str]] = {}
        for assignment in policy.assignments:
            if assignment.tenant == tenant:
                roles_of.setdefault(assignment.member, set()).add(assignment.role)
        tenant_rules = [rule for rule in policy.rules if rule.tenant == tenant]
        apps = {name for name in roles_of if not name.startswith(ROLE_PREFIX)}
        apps |= {r.subject for r in tenant_rules if not r.subject.startswith(ROLE_PREFIX)}
        rows: list[PolicyTableRow] = []
        for app in apps:
            holders = {app: "", **{role: role for role in _roles_held(app, roles_of)}}
            rows.extend(
                PolicyTableRow(app, holders[rule.subject], *rule.fields()[2:])
                for rule in tenant_rules
                if rule.subject in holders
            )
        return tuple(sorted(rows))

    # --- changes -------------------------------------------------------------------------------

    def add_rule(self, rule: PolicyRule) -> bool:
        """Add a rule (saved first when file-backed); return False if it was already there.

        Raises PolicyError for a malformed rule; the policy in force is then unchanged.
        """
        with self._lock:
            return self._commit(self._policy.with_rule(rule))

    def remove_rule(self, rule: PolicyRule) -> bool:
        """Remove a rule (saved first when file-backed); return False if it was absent."""
        with self._lock:
            return self._commit(self._policy.without_rule(rule))

    def assign_role(self, app_id: str, role: str, tenant: str) -> bool:
        """Give app_id a role within tenant; return False if it already held it."""
        assignment = check_assignment(RoleAssignment(app_id, role, tenant))
        with self._lock:
            return self._commit(self._policy.with_assignment(assignment))

    def revoke_role(self, app_id: str, role: str, tenant: str) -> bool:
        """Take a role away from app_id within tenant; return False if it did not hold it."""
        with self._lock:
            return self._commit(
                self._policy.without_assignment(RoleAssignment(app_id, role, tenant))
            )

    def reload(
        self, rows: Iterable[Sequence[str]] | None = None, *, version: int | None = None
    ) -> None:
        """Replace the policy in force: with rows when given, else by re-reading the file.

        Rows come from wherever the caller keeps policy (the event-sourced policy store);
        they are not written to the file. ``version`` (rows only) is the store's version of
        them, reported as ``policy_version`` by every decision; without it the version
        grows by one. Raises PolicyError, keeping the old policy, when the new one is
        malformed or there is no file to read.
        """
        with self._lock:
            if rows is not None:
                policy = policy_from_rows(rows)
                self._install(policy, self._next_snapshot(policy, version))
                return
            if self._policy_path is None:
                msg = "nothing to reload: this authorizer was not built from a policy file"
                raise PolicyError(msg)
            text = self._policy_path.read_text(encoding="utf-8")
            self._swap(parse_policy_text(text, source=self._policy_path.name))
            self._policy_text = text

    def _commit(self, policy: PolicySet) -> bool:
        """Save policy (when file-backed), then put it in force. Caller holds the lock."""
        if policy == self._policy:
            return False
        snapshot = self._next_snapshot(policy)
        if self._save_changes and self._policy_path is not None:
            text = render_policy(policy, self._policy_text)
            write_atomically(self._policy_path, text)
            self._policy_text = text
        self._install(policy, snapshot)
        return True

    def _swap(self, policy: PolicySet) -> None:
        self._install(policy, self._next_snapshot(policy))

    def _next_snapshot(self, policy: PolicySet, version: int | None = None) -> _Snapshot:
        current = self._snapshot
        number = current.version + 1 if version is None else version
        return _build_snapshot(self._model_text, policy, number, current.engines)

    def _install(self, policy: PolicySet, snapshot: _Snapshot) -> None:
        self._snapshot = snapshot
        self._policy = policy
        self._cache.clear()


# --- helpers -----------------------------------------------------------------------------------


def _request_problem(
    app_id: object, tenant: object, action: object, category: object, purpose: object
) -> str | None:
    """Return the first reason the request is malformed, or None."""
    for problem in (
        app_id_problem(app_id),
        tenant_problem(tenant),
        action_problem(action),
        request_category_problem(category),
        purpose_problem(purpose),
    ):
        if problem is not None:
            return f"denied before policy: {problem}"
    return None


def _summary(
    app_id: object, tenant: object, action: object, category: object, purpose: object
) -> str:
    """Describe the request, showing each field only if it is well formed."""
    app = _REFUSED if app_id_problem(app_id) else repr(app_id)
    verb = _REFUSED if action_problem(action) else action
    cat = _REFUSED if request_category_problem(category) else repr(category)
    purp = _REFUSED if purpose_problem(purpose) else repr(purpose)
    ten = _REFUSED if tenant_problem(tenant) else repr(tenant)
    return f"app {app} may not {verb} category {cat} for purpose {purp} in tenant {ten}"


def _evaluate(snapshot: _Snapshot, request: _RequestKey) -> AccessDecision:
    """Ask Casbin about a well-formed request; any failure denies."""
    app_id, tenant = request[0], request[1]
    summary = _summary(*request)
    version = snapshot.version
    engine = snapshot.engines.get(tenant)
    if engine is None or app_id not in snapshot.subjects.get(tenant, frozenset()):
        reason = f"{summary}: the app has no role or rule in this tenant (deny by default)"
        return AccessDecision(False, (), reason, version)
    try:
        allowed, matched = engine.enforcer.enforce_ex(*request)
    except Exception as exc:  # fail closed: a policy engine failure must never allow
        _log.exception("policy engine failed; request denied")
        return AccessDecision(
            False, (), f"{summary}: policy engine error ({type(exc).__name__})", version
        )
    rule = tuple(str(field) for field in matched)
    if allowed:
        return AccessDecision(True, rule, "allowed by rule: " + ", ".join(rule), version)
    if rule and rule[-1] == DENY:
        return AccessDecision(False, rule, f"{summary}: denied by rule: {', '.join(rule)}", version)
    return AccessDecision(False, (), f"{summary}: no rule allows it (deny by default)", version)


def _roles_held(member: str, roles_of: Mapping[str, set[str]]) -> set[str]:
    """Return every role member holds, directly or through other roles (cycles are safe)."""
    held: set[str] = set()
    pending = list(roles_of.get(member, ()))
    while pending:
        role = pending.pop()
        if role not in held:
            held.add(role)
            pending.extend(roles_of.get(role, ()))
    return held
