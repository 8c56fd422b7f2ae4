"""Policy rows as typed values: validation, the CSV file format, and the category hierarchy.

The policy file holds pycasbin rows, one per line, comments on their own lines::

    p, subject, tenant, action, category, purpose, effect
    g, app-or-agent, role, tenant

Every field is checked when a row is loaded or added, so a typo cannot slip into the
enforcer: a misspelt category in a ``deny`` row would otherwise never match, and the data it
was meant to protect would be served. The check also guarantees that no field holds a comma,
quote, whitespace or newline, so rows render back to CSV without quoting.

The category hierarchy (``g2``) is not policy data: it is derived from
``domain.values.CATEGORIES`` (every category directly under the root ``any``), so it cannot
drift from the catalogue that consent and items share. A ``g2`` row in a policy file is refused.
"""

from __future__ import annotations

import csv
import os
import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from domain.errors import InvalidInputError
from domain.values import CATEGORIES

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

#: Everything a policy row can grant or deny.
ACTIONS: tuple[str, ...] = (
    "read",
    "capture",
    "propose",
    "consent",
    "erase",
    "export",
    "audit",
    "inspect",
    "policy",
    "operate",
)
#: Root of the category hierarchy; usable in rules, never in requests.
ROOT_CATEGORY = "any"
#: A rule purpose that matches every purpose.
ANY_PURPOSE = "*"
ALLOW = "allow"
DENY = "deny"
EFFECTS: tuple[str, ...] = (ALLOW, DENY)
ROLE_PREFIX = "role:"

# fullmatch, never match + "$": "$" also matches before a trailing newline.
_APP_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
_ROLE_RE = re.compile(r"role:[a-z0-9][a-z0-9_.-]{0,63}")
_TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_PURPOSE_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")

APP_ID_FORMAT = "1-128 characters of A-Z a-z 0-9 _ . : @ -, not starting with 'role:'"
ROLE_FORMAT = "'role:' then 1-64 characters of a-z 0-9 _ . -"
TENANT_FORMAT = "1-64 characters of A-Z a-z 0-9 _ . -"
PURPOSE_FORMAT = "1-64 characters of a-z 0-9 _ . -"

_HEADER = (
    "# uprof authorization policy, written by policies.CasbinAuthorizer.\n"
    "#   p, subject, tenant, action, category, purpose, effect\n"
    "#   g, app-or-agent, role, tenant\n"
    "# The category hierarchy (g2) comes from domain.values.CATEGORIES and is not stored here.\n"
)


class PolicyError(InvalidInputError):
    """A policy row, file or model is malformed; the policy in force did not change."""

    hint = "fix the named policy row or file; the policy in force was not changed"


# --- field checks --------------------------------------------------------------------------
# Each returns None when the value is acceptable, else a reason that never echoes the value:
# a caller that misuses a field could put personal data in it.


def app_id_problem(value: object) -> str | None:
    """Say why value is not a valid app or agent id, or return None."""
    if not isinstance(value, str) or not value:
        return "app id is empty"
    if value.startswith(ROLE_PREFIX):
        return "app id names a role; roles are granted, never claimed"
    if not _APP_ID_RE.fullmatch(value):
        return f"app id is malformed (expected {APP_ID_FORMAT})"
    return None


def role_problem(value: object) -> str | None:
    """Say why value is not a valid role name, or return None."""
    if not isinstance(value, str) or not _ROLE_RE.fullmatch(value):
        return f"role is malformed (expected {ROLE_FORMAT})"
    return None


def tenant_problem(value: object) -> str | None:
    """Say why value is not a valid tenant, or return None."""
    if not isinstance(value, str) or not _TENANT_RE.fullmatch(value):
        return f"tenant is malformed (expected {TENANT_FORMAT})"
    return None


def action_problem(value: object) -> str | None:
    """Say why value is not a known action, or return None."""
    if not isinstance(value, str) or value not in ACTIONS:
        return f"action is unknown (expected one of {', '.join(ACTIONS)})"
    return None


def purpose_problem(value: object) -> str | None:
    """Say why value is not a valid request purpose, or return None."""
    if not isinstance(value, str) or not _PURPOSE_RE.fullmatch(value):
        return f"purpose is malformed (expected {PURPOSE_FORMAT})"
    return None


def request_category_problem(value: object) -> str | None:
    """Say why value is not a category a request may ask for, or return None."""
    if not isinstance(value, str) or value not in CATEGORIES:
        # "any" is refused too: a request for every category at once would slip past a deny
        # row on one category (g2 links child to parent, not parent to child).
        return "category is not in the catalogue (domain.values.CATEGORIES)"
    return None


def _rule_category_problem(value: object) -> str | None:
    if value != ROOT_CATEGORY and value not in CATEGORIES:
        return f"category {value!r} is neither {ROOT_CATEGORY!r} nor in the catalogue"
    return None


def _subject_problem(value: object) -> str | None:
    if isinstance(value, str) and value.startswith(ROLE_PREFIX):
        return role_problem(value)
    return app_id_problem(value)


# --- rows ------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class PolicyRule:
    """One ``p`` row: subject (role or app) may or may not act on a category for a purpose."""

    subject: str
    tenant: str
    action: str
    category: str
    purpose: str
    effect: str = ALLOW

    def fields(self) -> tuple[str, str, str, str, str, str]:
        """Return the row's fields in model order (without the ``p`` type)."""
        return (self.subject, self.tenant, self.action, self.category, self.purpose, self.effect)

    def render(self) -> str:
        """Render the row as one line of the policy file."""
        return "p, " + ", ".join(self.fields())


@dataclass(frozen=True, order=True)
class RoleAssignment:
    """One ``g`` row: member (an app, agent or role) holds role within tenant."""

    member: str
    role: str
    tenant: str

    def fields(self) -> tuple[str, str, str]:
        """Return the row's fields in model order (without the ``g`` type)."""
        return (self.member, self.role, self.tenant)

    def render(self) -> str:
        """Render the row as one line of the policy file."""
        return "g, " + ", ".join(self.fields())


def check_rule(rule: PolicyRule) -> PolicyRule:
    """Return rule unchanged, or raise PolicyError naming the bad field."""
    problems = [
        _subject_problem(rule.subject),
        tenant_problem(rule.tenant),
        action_problem(rule.action),
        _rule_category_problem(rule.category),
        None if rule.purpose == ANY_PURPOSE else purpose_problem(rule.purpose),
        None if rule.effect in EFFECTS else f"effect must be {ALLOW!r} or {DENY!r}",
    ]
    _raise_first(problems, what="policy rule")
    return rule


def check_assignment(assignment: RoleAssignment) -> RoleAssignment:
    """Return assignment unchanged, or raise PolicyError naming the bad field."""
    problems = [
        _subject_problem(assignment.member),
        role_problem(assignment.role),
        tenant_problem(assignment.tenant),
        "a role cannot be assigned to itself" if assignment.member == assignment.role else None,
    ]
    _raise_first(problems, what="role assignment")
    return assignment


def _raise_first(problems: Sequence[str | None], *, what: str) -> None:
    for problem in problems:
        if problem is not None:
            msg = f"invalid {what}: {problem}"
            raise PolicyError(msg)


def category_links() -> tuple[tuple[str, str], ...]:
    """Return the ``g2`` rows: every catalogue category directly under the root ``any``."""
    return tuple((category, ROOT_CATEGORY) for category in CATEGORIES)


# --- a whole policy --------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicySet:
    """The rules and role assignments in force, deduplicated, in file order."""

    rules: tuple[PolicyRule, ...] = ()
    assignments: tuple[RoleAssignment, ...] = ()

    def checked(self) -> PolicySet:
        """Return self after checking every row; raise PolicyError for the first bad one."""
        for rule in self.rules:
            check_rule(rule)
        for assignment in self.assignments:
            check_assignment(assignment)
        return self

    def with_rule(self, rule: PolicyRule) -> PolicySet:
        """Return a copy that also holds rule (checked first)."""
        check_rule(rule)
        return self if rule in self.rules else replace(self, rules=(*self.rules, rule))

    def without_rule(self, rule: PolicyRule) -> PolicySet:
        """Return a copy without rule."""
        return replace(self, rules=tuple(r for r in self.rules if r != rule))

    def with_assignment(self, assignment: RoleAssignment) -> PolicySet:
        """Return a copy that also holds assignment (checked first)."""
        check_assignment(assignment)
        if assignment in self.assignments:
            return self
        return replace(self, assignments=(*self.assignments, assignment))

    def without_assignment(self, assignment: RoleAssignment) -> PolicySet:
        """Return a copy without assignment."""
        return replace(self, assignments=tuple(a for a in self.assignments if a != assignment))

    def tenants(self) -> tuple[str, ...]:
        """Return every tenant named by a rule or an assignment, in first-seen order."""
        named = [r.tenant for r in self.rules] + [a.tenant for a in self.assignments]
        return tuple(dict.fromkeys(named))

    def for_tenant(self, tenant: str) -> PolicySet:
        """Return the rules and assignments of one tenant."""
        return PolicySet(
            tuple(r for r in self.rules if r.tenant == tenant),
            tuple(a for a in self.assignments if a.tenant == tenant),
        )

    def subjects_by_tenant(self) -> dict[str, frozenset[str]]:
        """Map each tenant to every name that appears as a subject or member in it."""
        names: dict[str, set[str]] = {}
        for rule in self.rules:
            names.setdefault(rule.tenant, set()).add(rule.subject)
        for assignment in self.assignments:
            names.setdefault(assignment.tenant, set()).add(assignment.member)
        return {tenant: frozenset(members) for tenant, members in names.items()}


def policy_from_rows(rows: Iterable[Sequence[str]], *, source: str = "rows") -> PolicySet:
    """Build a checked PolicySet from casbin-style rows (``("p", ...)`` or ``("g", ...)``).

    Raises PolicyError naming the row number and field for the first bad row.
    """
    numbered = ((f"row {n}", tuple(str(f).strip() for f in row)) for n, row in enumerate(rows, 1))
    return _collect(numbered, source=source)


def parse_policy_text(text: str, *, source: str = "policy") -> PolicySet:
    """Parse the policy file format; lines starting with ``#`` and blank lines are skipped.

    Raises PolicyError naming the file line and field for the first bad row.
    """
    numbered = (
        (f"line {number}", row)
        for number, row in enumerate(map(_parse_line, text.splitlines()), start=1)
        if row is not None
    )
    return _collect(numbered, source=source)


def _collect(numbered_rows: Iterable[tuple[str, tuple[str, ...]]], *, source: str) -> PolicySet:
    # Dicts keep the first occurrence's order and drop duplicates: casbin's batch add refuses a
    # whole batch when one row is already present.
    rules: dict[PolicyRule, None] = {}
    assignments: dict[RoleAssignment, None] = {}
    for where, row in numbered_rows:
        try:
            item = _row_to_item(row)
        except PolicyError as exc:
            msg = f"{source}, {where}: {exc}"
            raise PolicyError(msg) from None
        if isinstance(item, PolicyRule):
            rules[item] = None
        else:
            assignments[item] = None
    return PolicySet(tuple(rules), tuple(assignments))


def _row_to_item(row: tuple[str, ...]) -> PolicyRule | RoleAssignment:
    kind, fields = (row[0], row[1:]) if row else ("", ())
    if kind == "p" and len(fields) == 6:
        return check_rule(PolicyRule(*fields))
    if kind == "g" and len(fields) == 3:
        return check_assignment(RoleAssignment(*fields))
    if kind == "g2":
        msg = "g2 rows are not accepted: the category hierarchy comes from CATEGORIES"
        raise PolicyError(msg)
    msg = f"expected 'p' with 6 fields or 'g' with 3 fields, got {kind!r} with {len(fields)}"
    raise PolicyError(msg)


def _parse_line(line: str) -> tuple[str, ...] | None:
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return None
    return tuple(field.strip() for field in next(csv.reader([stripped], skipinitialspace=True)))


def render_policy(policy: PolicySet, template: str = "") -> str:
    """Render policy as file text, keeping template's comments and row order where possible.

    Rows of template still in policy keep their place (with the comments around them); rows
    no longer in policy are dropped; new rows are appended at the end. Without a template the
    text starts with a short header.
    """
    wanted: set[PolicyRule | RoleAssignment] = {*policy.rules, *policy.assignments}
    written: set[PolicyRule | RoleAssignment] = set()
    lines: list[str] = [] if template.strip() else _HEADER.splitlines()
    for line in template.splitlines():
        row = _parse_line(line)
        if row is None:
            lines.append(line)
            continue
        item = _row_to_item(row)
        if item in wanted and item not in written:
            lines.append(item.render())
            written.add(item)
    unwritten: list[PolicyRule | RoleAssignment] = [*policy.rules, *policy.assignments]
    lines.extend(item.render() for item in unwritten if item not in written)
    return "\n".join(lines) + "\n"


def write_atomically(path: Path, text: str) -> None:
    """Replace path with text so readers see the old file or the new one, never a mix.

    Writes a temporary file in the same folder, fsyncs it, then renames it over path.
    """
    folder = path.parent
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    temp_path = Path(temp_name)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        if path.exists():
            temp_path.chmod(path.stat().st_mode & 0o777)
        temp_path.replace(path)
    except BaseException:
        temp_path.unlink(missing_ok=True)
        raise
    _fsync_folder(folder)


def _fsync_folder(folder: Path) -> None:
    # The rename is durable only once the folder entry is; not every platform can open a folder.
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
