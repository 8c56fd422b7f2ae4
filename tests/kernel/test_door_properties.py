"""Property: random apps, agents, policies, consents and sharing never leak (I2, I3, I4).

Each example invents three apps with random read/capture rights (fresh app ids, so
examples do not share policy), random consents, and random captures by random agents,
each carrying a unique canary. Then every (app, agent) reads a slice through the
facade. A canary may appear in a slice only if

- its writer's capture was allowed (policy ``capture`` for the purpose) and consented,
- the reader's policy allows ``read`` of every category the sentence reveals, and the
  reader holds consent for them,
- the item is shared, or the reader is the very agent of the very app that wrote it.

Runs on both backends.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.errors import PermissionDeniedError, SubjectNotFoundError
from domain.principal import Principal, PrincipalKind
from policies import CasbinAuthorizer
from policies.rules import PolicyRule
from tests.conftest import Backend
from tests.fakes.ports import FakeClock, FakeExtractor
from tests.kernel.conftest import say, settings_for
from uprof.adapters.embeddings import HashingEmbedder
from uprof.bootstrap import bootstrap
from uprof.facade import Facade
from uprof.kernel import Uprof

PURPOSE = "personalization"
#: Sentence templates: what each reveals (the FakeExtractor's patterns).
TEMPLATES = {
    "location": "I live in {canary}",
    "goal": "I want to visit {canary}",
    "conversation": "Remember the word {canary}",
}
READABLE = ("location", "goal", "conversation")
_counter = itertools.count()


@pytest.fixture
def kernel(backend: Backend) -> Iterator[Uprof]:
    """A deployment whose policy lives in memory, so each example can add its own rules."""
    k = bootstrap(
        settings_for(backend),
        clock=FakeClock(),
        embedder=HashingEmbedder(),
        extractor=FakeExtractor(),
        authorizer=CasbinAuthorizer.seeded(),
    )
    try:
        yield k
    finally:
        k.close()


@dataclass(frozen=True)
class Write:
    app: int
    agent: int
    kind: str
    shared: bool


apps_st = st.lists(
    st.tuples(
        st.frozensets(st.sampled_from(READABLE)),  # may read
        # Mostly yes, so most examples write and read something.
        st.sampled_from([True, True, True, False]),  # may capture (and what it reveals)
        st.sampled_from([True, True, True, False]),  # holds the subject's consent
    ),
    min_size=3,
    max_size=3,
)
writes_st = st.lists(
    st.builds(
        Write,
        st.integers(0, 2),
        st.integers(0, 1),
        st.sampled_from(sorted(TEMPLATES)),
        st.booleans(),
    ),
    min_size=2,
    max_size=6,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(apps=apps_st, writes=writes_st)
def test_no_slice_serves_what_policy_consent_or_visibility_denies(
    kernel: Uprof, apps: list[tuple[frozenset[str], bool, bool]], writes: list[Write]
) -> None:
    run = next(_counter)
    names = [f"app:p{run}x{i}" for i in range(3)]
    rules = []
    for name, (reads, captures, _) in zip(names, apps, strict=True):
        rules += [PolicyRule(name, "default", "read", c, PURPOSE, "allow") for c in reads]
        if captures:
            rules += [PolicyRule(name, "default", "capture", c, PURPOSE, "allow") for c in READABLE]
    authorizer = kernel.authorizer
    before = authorizer.rules()
    for rule in rules:
        authorizer.add_rule(rule)
    try:
        _check_example(kernel, run, names, apps, writes)
    finally:
        # The example's rules go: the next example's apps are new names anyway, and each
        # check scans the whole policy (with every example's rules kept, the 25th example
        # decided against ~300 rules and the test spent most of its time in Casbin).
        for rule in rules:
            authorizer.remove_rule(rule)
    assert authorizer.rules() == before


def _check_example(
    kernel: Uprof,
    run: int,
    names: list[str],
    apps: list[tuple[frozenset[str], bool, bool]],
    writes: list[Write],
) -> None:
    subject = f"subject-{run}"
    # Consent recorded by the kernel (the door's consent rules have their own tests).
    kernel.grant_consent(subject, app_id="app:nobody", categories=["*"], purposes=[PURPOSE])
    for name, (_, _, consented) in zip(names, apps, strict=True):
        if consented:
            kernel.grant_consent(subject, app_id=name, categories=["*"], purposes=[PURPOSE])

    canaries: dict[str, Write] = {}
    for write in writes:
        canary = f"Zq{run}w{len(canaries)}"
        door = Facade(kernel, Principal("default", names[write.app], "k", PrincipalKind.APP))
        text = TEMPLATES[write.kind].format(canary=canary)
        try:
            door.capture(
                subject,
                say(
                    text,
                    agent=f"agent:{write.agent}",
                    sharing="shared" if write.shared else "private",
                ),
            )
        except Exception as refused:  # policy (403) or consent (403): then nothing written
            assert isinstance(refused, PermissionDeniedError) or "consent" in str(refused)
        canaries[canary] = write
    kernel.process()

    for reader, agent in itertools.product(range(3), range(2)):
        reads, _, reader_consented = apps[reader]
        door = Facade(kernel, Principal("default", names[reader], "k", PrincipalKind.APP))
        try:
            text = door.slice(
                subject,
                "where do I live, what do I want, what to remember",
                budget_tokens=2000,
                purpose=PURPOSE,
                agent_id=f"agent:{agent}",
            ).text
        except SubjectNotFoundError:
            # No consent of the subject: answered as for an unknown subject.
            assert not reader_consented, f"{names[reader]} holds a consent and was refused"
            continue
        assert reader_consented, f"{names[reader]} was served a slice without any consent"
        for canary, write in canaries.items():
            if canary not in text:
                continue
            _, writer_captures, writer_consented = apps[write.app]
            assert writer_captures and writer_consented, f"{canary}: its capture was refused"
            assert reader_consented, f"{canary} served to {names[reader]} without consent"
            assert write.kind in reads, f"{canary} ({write.kind}) served against policy"
            owner = (write.app, write.agent)
            assert write.shared or owner == (reader, agent), f"private {canary} leaked"
