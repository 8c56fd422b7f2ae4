"""Every in-process cache has a bound, evicts correctly and is emptied by erasure (issue 14).

For each cache: fill it beyond its bound, check its size stays within the bound, check
that an evicted entry is reloaded with the right value, and that erasing a subject
leaves none of its entries in any cache. Bounds are made small here (module constants
are read when a cache is built); the inventory is in docs/decisions/0014.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

import uprof.apikeys.store as keys_module
import uprof.crypto.keystore as keystore_module
import uprof.services.reads as reads_module
import uprof.services.slices as slices_module
from tests.conftest import Backend
from tests.fakes.ports import FakeClock
from tests.kernel.conftest import APP, build_kernel, consent, say, settings_for
from uprof.api.metrics import Metrics
from uprof.apikeys.store import ApiKeyStore
from uprof.caching import BoundedCache
from uprof.kernel import Uprof
from uprof.retrieval.text import stem, term_set
from uprof.storage import create_engine, migrate
from uprof.web.state import LinkStore, Session, SessionStore

# ------------------------------------------------------------------ the helper


def test_the_least_recently_used_entry_goes_first_and_the_size_stays_bounded() -> None:
    cache: BoundedCache[int, str] = BoundedCache(3)
    for i in range(3):
        cache.put(i, str(i))
    assert cache.get(0) == "0"  # 0 is now the most recently used: 1 goes next
    for i in range(3, 10):
        cache.put(i, str(i))
        assert len(cache) <= 3
    assert [k for k, _ in cache.items()] == [7, 8, 9]
    cache.put(4, "4")
    cache.get(8)
    cache.put(10, "10")
    assert [k for k, _ in cache.items()] == [4, 8, 10]


def test_a_weighed_cache_bounds_weight_and_entries_and_refuses_an_oversized_value() -> None:
    cache: BoundedCache[str, list[int]] = BoundedCache(10, weigh=len, max_entries=3)
    cache.put("a", [1] * 4)
    cache.put("b", [1] * 4)
    cache.put("c", [1] * 4)  # 12 > 10: "a" goes
    assert [k for k, _ in cache.items()] == ["b", "c"] and cache.size == 8
    for key in "defg":
        cache.put(key, [1])
    assert len(cache) == 3 and cache.size <= 10
    assert not cache.put("huge", [1] * 11)
    assert "huge" not in cache and len(cache) == 3  # nothing else was pushed out for it


def test_a_fill_that_read_before_an_invalidation_is_not_cached() -> None:
    cache: BoundedCache[str, str] = BoundedCache(10)
    ticket = cache.ticket()  # a reader starts loading "k"...
    cache.pop("k")  # ...an erasure invalidates it meanwhile...
    assert not cache.put("k", "read before the erasure", ticket=ticket)
    assert cache.get("k") is None
    for invalidate in (cache.clear, lambda: cache.pop_where(lambda k, v: False)):
        ticket = cache.ticket()
        invalidate()
        assert not cache.put("k", "stale", ticket=ticket)
    ticket = cache.ticket()
    cache.take("other")  # the owner taking its own entry out is no invalidation
    assert cache.put("k", "fresh", ticket=ticket) and cache.get("k") == "fresh"


def test_threads_filling_reading_and_invalidating_never_break_the_bound() -> None:
    cache: BoundedCache[int, int] = BoundedCache(50)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def worker(seed: int) -> None:
        try:
            start.wait()
            for i in range(3_000):
                key = (i * 7 + seed) % 400
                ticket = cache.ticket()
                value = cache.get(key)
                assert value is None or value == key * 2
                cache.put(key, key * 2, ticket=ticket)
                if i % 97 == seed:
                    cache.pop_where(lambda k, v: k % 5 == seed)
                assert len(cache) <= 50
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(cache) <= 50 and cache.size == len(cache)
    assert all(v == k * 2 for k, v in cache.items())


# ---------------------------------------------------------------- web, metrics


def test_sign_in_links_are_bounded_single_use_and_evicted_ones_are_void() -> None:
    links = LinkStore(max_links=5)
    issued = [links.issue(f"subject-{i}")[0] for i in range(12)]
    assert len(links) <= 5
    assert links.redeem(issued[0]) is None  # pushed out: void, like an unknown link
    # (subject, its incarnation tag, the key that issued it)
    assert (links.redeem(issued[-1]) or ())[:3] == ("subject-11", "", "")
    links.spend(issued[-1])  # its sign-in decided: until then it is held (bug NW)
    assert links.redeem(issued[-1]) is None  # single use
    assert len(links) <= 4


def test_session_memory_is_bounded_and_sessions_are_signed_cookies() -> None:
    sessions = SessionStore(b"k" * 32, max_sessions=4)
    cookies = [sessions.create(Session(kind="user", subject=f"s{i}")) for i in range(7)]
    for cookie in cookies:  # each loads: its receipts list is kept, at most 4 of them
        assert sessions.get(cookie, "user") is not None
    assert len(sessions) == 4
    assert sessions.get(cookies[-1], "user").subject == "s6"  # type: ignore[union-attr]
    # Another deployment's key, or no signature at all: no session.
    assert SessionStore(b"o" * 32).get(cookies[0], "user") is None
    assert sessions.get(cookies[0].rsplit(".", 1)[0], "user") is None
    expired = SessionStore(b"k" * 32, ttl=timedelta(seconds=-1))
    assert expired.get(cookies[0], "user") is None
    with pytest.raises(ValueError):
        SessionStore(b"short")


def test_metric_series_stay_bounded_whatever_methods_callers_send() -> None:
    metrics = Metrics()
    for i in range(200):
        metrics.observe(f"M{i}", "<unmatched>", 405, 0.001)
    metrics.observe("GET", "/v1/slices", 200, 0.001)
    text = metrics.render().decode()
    assert 'method="OTHER"' in text and "M17" not in text
    assert text.count("uprof_http_requests_total{") == 2


# --------------------------------------------------------------- API key cache


def test_api_key_cache_is_bounded_and_evicted_keys_authenticate_again(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keys_module, "MAX_CACHED_KEYS", 3)
    engine = create_engine(backend.url)
    try:
        migrate(engine, "keys")
        store = ApiKeyStore(engine)
        issued = [store.create(f"app:a{i}") for i in range(7)]
        for key in issued:
            principal = store.authenticate(key.token)
            assert principal is not None and principal.app_id == key.info.app_id
            assert len(store._rows) <= 3
        assert store._rows.get(issued[0].info.key_id) is None  # evicted
        again = store.authenticate(issued[0].token)  # reloaded from the table
        assert again is not None and again.app_id == "app:a0"
        assert store.revoke(issued[0].info.key_id)
        assert store._rows.get(issued[0].info.key_id) is None
        assert store.authenticate(issued[0].token) is None
    finally:
        engine.dispose()


# ------------------------------------------------------- kernel caches (keys, views)


@pytest.fixture
def small_kernel(
    backend: Backend, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Uprof]:
    """A kernel whose every subject cache holds only a few entries."""
    for name, bound in (
        ("MAX_CACHED_HANDLES", 3),
        ("MAX_CACHED_DEKS", 3),
        ("MAX_CACHED_VIEW_KEYS", 3),
        ("MAX_CACHED_CAPTURE_KEYS", 8),
    ):
        monkeypatch.setattr(keystore_module, name, bound)
    monkeypatch.setattr(slices_module, "MAX_CACHED_SUBJECTS", 3)
    monkeypatch.setattr(slices_module, "MAX_CACHED_VIEW_ITEMS", 40)
    monkeypatch.setattr(slices_module, "MAX_CACHED_TEXTS", 5)
    monkeypatch.setattr(reads_module, "MAX_SAVED_SUBJECTS", 2)
    k = build_kernel(settings_for(backend), clock)
    try:
        yield k
    finally:
        k.close()


SUBJECTS = [f"person-{i}" for i in range(6)]


def _fill(kernel: Uprof) -> dict[str, list[str]]:
    """Six subjects with three captures each; returns their capture ids."""
    captured = {}
    for i, subject in enumerate(SUBJECTS):
        consent(kernel, subject=subject)
        acks = kernel.capture_many(
            subject,
            [
                say(f"I want to visit Town{i} and I like sport{i}{j}", ref=f"r{i}-{j}")
                for j in range(3)
            ],
        )
        captured[subject] = [ack.capture_id for ack in acks]
    kernel.process()
    return captured


def _slice(kernel: Uprof, subject: str) -> tuple[str, ...]:
    result = kernel.slice(
        subject,
        "where do I live and what do I like?",
        budget_tokens=512,
        purpose="personalization",
        app_id=APP,
        agent_id="agent:one",
    )
    return tuple(item.text for item in result.items)


def _caches(kernel: Uprof) -> dict[str, BoundedCache]:  # type: ignore[type-arg]
    ks = kernel.keystore
    return {
        "deks": ks._deks,
        "view_keys": ks._view_keys,
        "capture_keys": ks._capture_keys,
        "handles": ks._handles,
        "views": kernel.slice_service._cache,
        "texts": kernel.slice_service._text_vectors,
        "saved": kernel.reads._saved,
    }


def _assert_within_bounds(kernel: Uprof) -> None:
    for name, cache in _caches(kernel).items():
        assert len(cache) <= cache.max_entries, name
        assert cache.size <= cache.maxsize, name


def test_key_caches_stay_bounded_and_evicted_keys_reload_the_same(small_kernel: Uprof) -> None:
    captured = _fill(small_kernel)
    ks = small_kernel.keystore
    first = str(small_kernel.stream_of(SUBJECTS[0]))
    version, dek = ks.current_key(first)
    view_key = ks.view_key(first)
    capture_keys = {cid: ks.capture_key(first, cid) for cid in captured[SUBJECTS[0]]}
    assert all(capture_keys.values())
    for subject in SUBJECTS[1:]:
        stream = str(small_kernel.stream_of(subject))
        ks.current_key(stream)
        ks.view_key(stream)
        for cid in captured[subject]:
            ks.capture_key(stream, cid)
        _assert_within_bounds(small_kernel)
    assert ks._deks.get(first) is None and ks._view_keys.get(first) is None  # evicted
    assert not [k for k, _ in ks._capture_keys.items() if k[0] == first]
    # Reloaded from the key store, unwrapped to the same bytes.
    assert ks.current_key(first) == (version, dek)
    assert ks.view_key(first) == view_key
    assert {cid: ks.capture_key(first, cid) for cid in capture_keys} == capture_keys
    profile = small_kernel.export_subject(SUBJECTS[0])  # decrypts every event again
    assert "Town0" in str(profile)
    _assert_within_bounds(small_kernel)


def test_slice_caches_stay_bounded_and_an_evicted_view_serves_the_same_slice(
    small_kernel: Uprof,
) -> None:
    _fill(small_kernel)
    first = _slice(small_kernel, SUBJECTS[0])
    assert any("Town0" in text for text in first)
    for subject in SUBJECTS[1:]:
        _slice(small_kernel, subject)
        _assert_within_bounds(small_kernel)
    small_kernel.reads.drain()
    _assert_within_bounds(small_kernel)
    views = small_kernel.slice_service._cache
    stream = str(small_kernel.stream_of(SUBJECTS[0]))
    assert views.get(stream) is None  # evicted by the subject bound
    assert _slice(small_kernel, SUBJECTS[0]) == first  # loaded again, same answer
    assert views.get(stream) is not None


def test_the_view_item_bound_keeps_a_large_subject_out_rather_than_evicting_all(
    small_kernel: Uprof,
) -> None:
    _fill(small_kernel)
    consent(small_kernel, subject="big")
    small_kernel.capture_many("big", [say(f"I met friend{j} at the park") for j in range(45)])
    small_kernel.process()
    for subject in SUBJECTS[:2]:
        _slice(small_kernel, subject)
    before = [k for k, _ in small_kernel.slice_service._cache.items()]
    served = _slice(small_kernel, "big")
    assert served  # served from a fresh load, just not cached
    views = small_kernel.slice_service._cache
    assert views.get(str(small_kernel.stream_of("big"))) is None
    assert [k for k, _ in views.items()] == before
    _assert_within_bounds(small_kernel)


def test_erasure_evicts_the_subject_from_every_cache(small_kernel: Uprof) -> None:
    _fill(small_kernel)
    subject = SUBJECTS[-1]
    stream = small_kernel.stream_of(subject)
    _slice(small_kernel, subject)
    small_kernel.reads.drain()
    small_kernel.keystore.resolve(small_kernel.subjects.tenant, subject, max_age_s=60)
    caches = _caches(small_kernel)
    assert caches["views"].get(str(stream)) is not None
    assert caches["saved"].get(stream) is not None
    assert caches["deks"].get(str(stream)) is not None
    assert stem.cache_info().currsize > 0
    assert term_set.cache_info().currsize > 0
    small_kernel.erase_subject(subject)
    assert caches["deks"].get(str(stream)) is None
    assert caches["view_keys"].get(str(stream)) is None
    assert not [k for k, _ in caches["capture_keys"].items() if k[0] == str(stream)]
    assert not [v for _, v in caches["handles"].items() if v[1].stream_id == stream]
    assert caches["views"].get(str(stream)) is None
    assert caches["saved"].get(stream) is None
    assert len(caches["texts"]) == 0  # keyed by content: all of it goes
    assert stem.cache_info().currsize == 0
    assert term_set.cache_info().currsize == 0
    # The other subjects are still served (their entries reload as needed).
    assert any("Town0" in text for text in _slice(small_kernel, SUBJECTS[0]))
