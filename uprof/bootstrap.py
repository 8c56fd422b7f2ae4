"""The one composition root: build engines, keys, models and services from Settings (P5).

Importing this module builds nothing; ``bootstrap(settings)`` does. Tests pass
fakes for the clock, embedder, extractor and audit trail.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from uuid import UUID

from audit.errors import VerificationError
from audit.log import AuditLog, CheckpointAnchor
from domain.errors import UprofError
from domain.values import CapturedInteraction, ProposalBatch
from projections.profile.projector import ProfileProjector, embed_memories
from projections.profile.views import SqlViewStore
from uprof import telemetry
from uprof.adapters.audit_trail import AuditLogTrail
from uprof.adapters.clock import SystemClock
from uprof.backends import StoresInUseError, backend_for
from uprof.crypto.fields import ViewSealer
from uprof.crypto.keydir import (
    AUDIT_KEY_FILE,
    KEK_RING_FILE,
    MASTER_KEY_FILE,
    FileKeyMaterialStore,
    KeyFolderNotFoundError,
    refuse_legacy_key_files,
)
from uprof.crypto.keystore import KekRing, KeyStore, derive_key
from uprof.crypto.ledger import ErasureLedger
from uprof.crypto.plain_rows import tag_legacy_plain_rows
from uprof.eventstore import ProfilesApplication
from uprof.kernel import Uprof
from uprof.partitions import Partitioning
from uprof.ports import AuditTrail, Clock, Embedder, Extractor, KeyMaterialStore, TokenCounter
from uprof.retry import AUDIT_APPEND
from uprof.services.capture import CaptureService
from uprof.services.consent import ConsentService
from uprof.services.erased_items import ErasedItemGuard
from uprof.services.erasure import ErasureService
from uprof.services.extraction import EvidenceChecker, ExtractionWorker
from uprof.services.idempotency import IdempotencyStore
from uprof.services.late_captures import LateCaptures
from uprof.services.maintenance import MaintenanceService
from uprof.services.paging import CursorCodec
from uprof.services.profile import ProfileService
from uprof.services.projection import ProjectionRunner
from uprof.services.proposals import ProposalService
from uprof.services.quarantine import DamagedEvents, QuarantineIndex, QuarantineService
from uprof.services.rate_limits import RateCounters
from uprof.services.reads import ReadRecorder
from uprof.services.sign_outs import SignOuts
from uprof.services.slices import Authorizer, Freshness, SliceService
from uprof.services.subjects import SubjectResolver
from uprof.settings import Settings
from uprof.storage import (
    RESTORE_MARKER,
    START_PURPOSE,
    SchemaTurn,
    StoreEngines,
    audit_log_holds_entries,
    deployment_found,
    deployment_place,
    layout_for,
    log_holds_events,
    migrate,
    open_engines,
    refuse_without_deployment,
    refuse_wrong_stores,
    start_engine,
)
from uprof.vector_model import RecordedModelEmbedder

if TYPE_CHECKING:
    import sqlalchemy as sa

    from uprof.ports import AuditStore, EventStore, SubjectKeyStore, ViewStore
    from uprof.services.policy import PolicyService

    def _adapters_satisfy_their_ports(
        app: ProfilesApplication, keys: KeyStore, log: AuditLog, views: SqlViewStore
    ) -> tuple[EventStore, SubjectKeyStore, AuditStore, ViewStore]:
        """Never called: mypy checks here that each SQL adapter satisfies its Protocol."""
        return app, keys, log, views


# The deployment checks the CLI asks before it opens one (0237-the-wrong-folder): through
# the composition root, as surfaces reach everything below the facade.
__all__ = [
    "AUDIT_KEY_FILE",
    "KEK_RING_FILE",
    "MASTER_KEY_FILE",
    "bootstrap",
    "deployment_found",
    "deployment_place",
    "refuse_without_deployment",
]
_log = logging.getLogger(__name__)


#: The derivation label of the web session signing key (a new label signs everyone out).
WEB_SESSION_KEY_LABEL = "uprof/web-session/1"


def build_key_material(settings: Settings) -> KeyMaterialStore:
    """The key store of a deployment: the key folder, never inside the data folder."""
    override = None
    if settings.master_secret is not None:
        override = settings.master_secret.get_secret_value().encode()
        if len(override) < 32:
            raise ValueError("UPROF_MASTER_SECRET must be at least 32 characters")
    refuse_legacy_key_files(settings.data_dir, settings.key_path)
    return FileKeyMaterialStore(settings.key_path, master_secret=override)


def master_secret(settings: Settings) -> bytes:
    return build_key_material(settings).master_secret()


class RestoreInterruptedError(UprofError):
    hint = "finish the restore first; until then nothing is served from a half-restored store"


def refuse_interrupted_restore(settings: Settings) -> None:
    marker = settings.data_dir / RESTORE_MARKER
    if marker.exists():
        raise RestoreInterruptedError(
            f"a restore into {settings.data_dir} was interrupted ({marker.name} is present); "
            "run `uprof restore --from <the same backup>` again before starting uprof"
        )


class AuditLogBehindError(UprofError):
    hint = (
        "put the newer views store back, or `uprof restore` a backup into an empty data "
        "folder; to accept the loss for good, delete audit-checkpoint.note from the key "
        "folder (docs/operations.md)"
    )


def _refuse_audit_log_behind(audit_log: AuditLog) -> None:
    """Refuse to start on a views store whose audit log does not extend the checkpoint
    the key folder keeps (bug HT): an older copy put back, which also lost the sign-outs,
    idempotency answers and rate-limit slots written since (a signed-out web session
    would open again). ``uprof restore`` starts without this check (it chooses logs)."""
    try:
        audit_log.check_extends_anchor()
    except VerificationError as error:
        raise AuditLogBehindError(
            f"the views store's audit log does not extend the checkpoint kept in the key "
            f"folder (audit-checkpoint.note): {error}. Its sign-outs, idempotency answers and "
            "rate-limit slots may have gone back with it: nothing is served. Put the newer "
            "views store back, or `uprof restore` a backup into an empty data folder; to "
            "accept the loss for good, delete audit-checkpoint.note from the key folder"
        ) from None


def _hold_stores_open(
    settings: Settings, stores: StoreEngines, *, restoring: bool
) -> Callable[[], None]:
    """Hold the stores open for this process's life (a shared lock ``uprof restore``
    waits for no one on: it refuses while any process holds it), then look for an
    interrupted restore's marker, which the lock makes race-free: a restore writes it
    and removes it while holding the stores alone. Returns the release (idempotent)."""
    if restoring:
        return lambda: None  # the restore holds the stores alone itself
    try:
        release = backend_for(stores.views).hold_open(stores.views)
    except StoresInUseError as error:
        stores.dispose()
        raise RestoreInterruptedError(str(error)) from None
    released = threading.Event()

    def release_once() -> None:
        if not released.is_set():
            released.set()
            release()

    try:
        refuse_interrupted_restore(settings)
    except BaseException:
        release_once()
        stores.dispose()
        raise
    return release_once


def build_embedder(settings: Settings) -> Embedder:
    if settings.embedder == "hashing":
        from uprof.adapters.embeddings import HashingEmbedder

        return HashingEmbedder()
    from uprof.adapters.embeddings import SentenceEmbedder

    embedder = SentenceEmbedder.for_model(
        settings.embedder,
        models_dir=settings.models_dir,
        torch_threads=settings.torch_threads or None,
    )
    if settings.background_workers:
        embedder.load()  # a server loads it before its first request, not during it
    return embedder


def build_extractor(settings: Settings) -> Extractor:
    from uprof.adapters.extraction import OpenAICompatibleExtractor, RuleBasedExtractor

    rules = RuleBasedExtractor()
    if settings.extractor == "rules":
        return rules
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    return OpenAICompatibleExtractor(
        base_url=settings.llm_base_url,
        model=settings.llm_model,
        api_key=key,
        timeout_s=settings.llm_timeout_s,
        # Without a fallback a failing endpoint fails the batch: captures wait, none lost.
        fallback=rules if settings.llm_fallback == "rules" else None,
    )


class DeferredExtractor:
    """The configured extractor, built on its first use.

    Its rule tables and HTTP client are ~0.2-0.3 s of imports, which a command that
    extracts nothing (a CLI capture, a consent grant) would otherwise pay at start.
    Servers build theirs at start, so a misconfigured extractor fails before any request.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._built: Extractor | None = None
        self._lock = threading.Lock()
        # The name the built extractor will have (rules.py, llm.py), without building it.
        self.name = "rules" if settings.extractor == "rules" else f"llm:{settings.llm_model}"

    def extract(self, capture: CapturedInteraction) -> ProposalBatch:
        return self._extractor().extract(capture)

    def _extractor(self) -> Extractor:
        if self._built is None:
            with self._lock:
                if self._built is None:
                    self._built = build_extractor(self._settings)
        return self._built


def build_authorizer(settings: Settings) -> Authorizer:
    from policies import CasbinAuthorizer

    # The packaged seed is read-only; policy edits go to a copy named by the setting.
    return CasbinAuthorizer.from_files(
        settings.policy_model_path, settings.policy_path, save_changes=False
    )


def capture_permits(
    authorizer_for: Callable[[str], Authorizer],
) -> Callable[[str, str, str], frozenset[str]]:
    """The categories an app's captures may yield for a purpose (policy action ``capture``),
    decided by the policy of the subject's tenant: ``permitted(tenant, app_id, purpose)``.

    Extraction keeps only what the capturing app may write: otherwise app X's
    captures could change what app Y is served in categories X may not touch. A worker
    extracts every tenant's captures on the stores, so the tenant is the capture's, and
    ``authorizer_for(tenant)`` the authorizer holding that tenant's policy.
    """
    from domain.values import CATEGORIES
    from uprof.services.policy import PolicyStoreError

    def permitted(tenant: str, app_id: str, purpose: str) -> frozenset[str]:
        authorizer = authorizer_for(tenant)
        health = getattr(authorizer, "health", None)
        # An unreadable policy denies everything; extraction must then wait and retry,
        # not commit the capture's results with every item dropped.
        problem = health() if health is not None else ""
        if problem:
            raise PolicyStoreError(problem)
        decisions = authorizer.decisions_for(
            app_id=app_id,
            tenant=tenant,
            action="capture",
            purpose=purpose,
            categories=list(CATEGORIES),
        )
        return frozenset(c for c, d in decisions.items() if d.allowed)

    return permitted


def tenant_authorizers(
    own: Authorizer, policy: PolicyService, settings: Settings, audit: AuditTrail
) -> Callable[[str], Authorizer]:
    """``own`` for this deployment's tenant; for another tenant on the same stores, an
    authorizer over that tenant's policy stream in the shared policy store (built when
    first met, read-only: it never seeds, and a tenant without a policy stream denies
    everything)."""
    from uprof.services.policy import PolicyService as Service

    model_text = Path(settings.policy_model_path).read_text(encoding="utf-8")
    others: dict[str, Authorizer] = {}
    lock = threading.Lock()

    def authorizer_for(tenant: str) -> Authorizer:
        if tenant == settings.tenant:
            return own
        with lock:
            found = others.get(tenant)
            if found is None:
                found = others[tenant] = Service(
                    policy.app,
                    tenant=tenant,
                    model_text=model_text,
                    seed_text="",
                    seed_source="",
                    audit=audit,
                    refresh_s=settings.policy_refresh_s,
                ).authorizer
            return found

    return authorizer_for


@contextlib.contextmanager
def policy_store_engine(events: sa.Engine, env: Mapping[str, str]) -> Iterator[sa.Engine]:
    """A SQLAlchemy engine on the policy store (``env``: ``policy_store_env``'s): its own
    file on SQLite, the event log's database (``events``) on PostgreSQL."""
    backend = backend_for(events)
    if backend.name != "sqlite":
        yield events
        return
    engine = backend.create_engine(f"sqlite:///{env['SQLITE_DBNAME']}", fsync_each_commit=True)
    try:
        yield engine
    finally:
        engine.dispose()


def build_policy_service(
    settings: Settings,
    audit: AuditTrail,
    keys: Any,
    keystore: KeyStore,
    material: KeyMaterialStore,
    events: Any,
    *,
    restoring: bool = False,
) -> PolicyService:
    """Open the policy store, seal its rows of before the seal once (decision
    0140-sealed-policy-store; at each restore again), and seed it from
    ``settings.policy_path`` on first start. Call under the event log's schema lock."""
    from policies import packaged_seed_policy_text
    from uprof.services.policy import PolicyApplication, PolicyService
    from uprof.services.policy_seal import seal_legacy_policy_rows
    from uprof.storage import policy_store_env

    def known_app(app_id: str) -> bool:
        # Lazy: only the policy store's app check needs the key table.
        from uprof.apikeys.store import ApiKeyStore

        return any(not k.is_revoked for k in ApiKeyStore(keys, tenant=settings.tenant).list(app_id))

    seed_path = Path(settings.policy_path)
    seed_text = seed_path.read_text(encoding="utf-8")
    packaged = seed_text == packaged_seed_policy_text()
    env = policy_store_env(settings)
    if not restoring:
        # Made by ``open_tables`` below, which refuses to make a table found missing on a
        # deployment that had one (bug PX); a restore puts the backup's stores in place.
        env = {**env, "CREATE_TABLE": "n"}
    app = PolicyApplication(env=env, keystore=keystore)
    try:
        with policy_store_engine(events, env) as engine:
            if not restoring:
                app.open_tables(engine)
            seal_legacy_policy_rows(app, engine, material, again=restoring)
    except BaseException:
        app.close()
        raise
    service = PolicyService(
        app,
        tenant=settings.tenant,
        model_text=Path(settings.policy_model_path).read_text(encoding="utf-8"),
        seed_text=seed_text,
        seed_source=f"packaged:{seed_path.name}" if packaged else f"file:{seed_path.name}",
        audit=audit,
        known_app=known_app,
        refresh_s=settings.policy_refresh_s,
    )
    service.ensure_seeded()
    return service


def build_counter(settings: Settings) -> TokenCounter:
    from uprof.adapters.tokens import TiktokenCounter

    counter = TiktokenCounter()
    if settings.background_workers:
        counter.load()  # a server loads the table before its first slice, not during it
    return counter


def _folders_missing(path: Path) -> list[Path]:
    """The folders of ``path`` (itself included) that do not exist yet, deepest first."""
    missing: list[Path] = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _take_away_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) while each is empty: the key folder a refused
    start made before it looked. It said "nothing was made in the folder named" and
    left the folder, and its parents, at a typo'd ``--key-dir`` (bug XL). A folder that
    holds anything (another start's key, written since) is left, and those above it."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def bootstrap(
    settings: Settings,
    *,
    clock: Clock | None = None,
    embedder: Embedder | None = None,
    extractor: Extractor | None = None,
    audit: AuditTrail | None = None,
    authorizer: Authorizer | None = None,
    counter: TokenCounter | None = None,
    key_material: KeyMaterialStore | None = None,
    restoring: bool = False,
    partitions: Sequence[int] | None = None,
    deployment: Literal["required", "may_make"] | None = None,
) -> Uprof:
    """Build a ready deployment: migrate stores, open the log, wire the services.

    Before anything is served the erasure ledger is re-applied, so that a copied or
    restored data folder (or key database) never brings an erased subject back.
    ``restoring``: only ``uprof restore`` itself starts beside its own marker (and
    re-applies the ledger itself, after the data is in place).
    ``partitions``: the pipeline partitions this process runs (default: all of
    ``settings.worker_partitions``); ``uprof worker --partition K`` passes ``[K]``.
    ``deployment``: first, ``"required"`` refuses a place holding no deployment
    (``refuse_without_deployment``, bug WM) and ``"may_make"`` only a database the
    server does not have (``deployment_found``, bug XC), as a CLI command's start
    asks (``uprof.cli.context.kernel``); None asks neither (servers, workers, restore).
    """
    clock = clock or SystemClock()
    # PostgreSQL: one engine for the checks and then the stores (0249-cli-start-cost).
    engine = start_engine(settings)
    try:
        if deployment == "required":
            refuse_without_deployment(settings, engine)
        elif deployment == "may_make":
            deployment_found(settings, engine)
        telemetry.configure(settings)
        # A backup's folder (XK), stores or a key folder that cannot be written (XQ, XY),
        # another program's store file (XU): refused before anything is opened or made.
        refuse_wrong_stores(settings, engine)
        if not restoring:
            refuse_interrupted_restore(settings)
        unmade = _folders_missing(settings.key_path)  # taken away again if refused (XL)
        material = key_material or build_key_material(settings)
        layout = layout_for(settings)
        stores = open_engines(layout, made=engine)
    except BaseException:
        if engine is not None:
            engine.dispose()
        raise
    views, keys, events = stores.views, stores.keys, stores.events
    release_stores = _hold_stores_open(settings, stores, restoring=restoring)
    if (
        not material.has_master_secret()
        and (log_holds_events(events) or audit_log_holds_entries(views))
        # Asked again after the data: a first start beside this one may have made the key
        # and written its first entries between the two looks (then all is well).
        and not material.has_master_secret()
    ):
        release_stores()
        stores.dispose()
        _take_away_empty(unmade)
        # A new root secret beside an old log would make every subject unreadable (and
        # look erased), while new captures went on under keys that open nothing old. A
        # log without events is no proof of a new deployment: the audit log's entries
        # (an API key issued, a policy changed) were written under this deployment's keys
        # too (bug XD: the policy store then read as altered, or a traceback).
        raise KeyFolderNotFoundError(
            f"the key folder {material.location} holds no master key, but "
            f"{deployment_place(settings)} already holds a deployment's data (captured "
            "events or audit log entries): UPROF_KEY_DIR (or --key-dir) points to the "
            "wrong folder, or the keys were not restored with the data; refusing to "
            "create new keys"
        )
    # One turn at the schema locks for the whole start (0256-start-lock-turns): the views'
    # (the views and keys' upgrade; a rebuild's lock), then the event log's (its tables,
    # the policy store's), held until the erasure ledger has caught the views up and read
    # them (``reapply_ledger``). It took four turns, and beside a process rebuilding in a
    # loop waited out a rebuild round at each. Every release below lets go of it first.
    turn = SchemaTurn((views, events), wait_s=settings.schema_lock_wait_s, purpose=START_PURPOSE)
    try:
        turn.take()
        migrate(views, "views")
        migrate(keys, "keys")
    except BaseException:
        # A wait given up (``SchemaLockWaitError``) or a failed upgrade: this process
        # lets go of the stores (an embedded caller may try again, or restore).
        turn.release()
        release_stores()
        stores.dispose()
        raise

    root = material.master_secret()
    master = root
    keystore = KeyStore(
        keys,
        master_secret=root,
        kek_ring=KekRing(material),
        ledger=ErasureLedger(material, root),
    )
    try:
        # The library creates its tables on first open (under the turn's lock).
        app = ProfilesApplication(
            env=layout.eventsourcing_env, keystore=keystore, events_engine=events
        )
        # Plaintext rows of before 2026-12-05 get their tags, once per deployment and
        # at each restore (decision 0136-authenticated-plaintext-rows); under the
        # lock: one process at a time.
        try:
            tag_legacy_plain_rows(app, keystore, material, again=restoring)
        except BaseException:
            app.close()
            raise
    except BaseException:
        turn.release()
        release_stores()
        stores.dispose()
        raise
    partitioning = Partitioning(settings.worker_partitions)
    try:
        app.claim_partitioning(partitioning.count)
    except BaseException:
        turn.release()
        app.close()
        release_stores()
        stores.dispose()
        raise
    subjects = SubjectResolver(keystore, settings.tenant, stream_written=app.exists)
    sealer = ViewSealer(keystore)
    audit_keys = material.audit_keys()
    audit_log = AuditLog(
        views,
        audit_keys,
        settings.audit_origin,
        backend=backend_for(views),
        retry=AUDIT_APPEND.call,
        clock=clock.now,
        # The key folder keeps the newest checkpoint signed: an older copy of the log put
        # back is refused a checkpoint that would fork it (bug HE).
        anchor=audit_keys if isinstance(audit_keys, CheckpointAnchor) else None,
    )
    if not restoring:
        try:
            _refuse_audit_log_behind(audit_log)
        except BaseException:
            turn.release()
            app.close()
            release_stores()
            stores.dispose()
            raise
    # Until the ledger has read the views (``reapply_ledger`` lets go of the turn),
    # anything raised lets go of it first, and of everything this start opened.
    opened_policy: PolicyService | None = None
    try:
        if audit is None:
            audit = AuditLogTrail(audit_log, settings.tenant)
        # Every vector this process makes goes through the check that the store's vectors
        # are this model's (uprof.vector_model): a projection or a slice with another model's
        # vectors is refused, not ranked by noise.
        embedder = vector_model = RecordedModelEmbedder(
            embedder or build_embedder(settings), app.claim_embedder, app.recorded_embedder
        )
        # The runner below writes through this store and is its one writer: a projector holds
        # per-batch state, and the runner applies one batch at a time. Each batch that writes
        # vectors checks the record again under its position lock (another process's rebuild
        # may have recorded another model since).
        queries = SqlViewStore(
            views,
            sealer,
            ProfileProjector(embedder, sealer, check_vectors=vector_model.check_current),
        )
        if extractor is None:
            extractor = (
                build_extractor(settings)
                if settings.background_workers
                else DeferredExtractor(settings)
            )
        evidence = EvidenceChecker(queries)

        policy = opened_policy = build_policy_service(  # its tables made under the turn's lock
            settings, audit, keys, keystore, material, events, restoring=restoring
        )
        # The policy store decides, unless the caller brought its own authorizer (tests, benches).
        deciding: Authorizer = authorizer or policy.authorizer

        def close() -> None:
            app.close()
            policy.close()
            release_stores()  # after the last use of the stores, before their pools go
            stores.dispose()

        kernel_ref: list[Uprof] = []

        def ensure_subject_fresh(
            stream_id: UUID, timeout_s: float, known_head: int | None
        ) -> Freshness:
            return kernel_ref[0].ensure_subject_fresh(stream_id, timeout_s, known_head=known_head)

        reads = ReadRecorder(app, audit, mode=settings.read_recording)
        slice_service = SliceService(
            app,
            subjects,
            queries,
            deciding,
            embedder,
            counter or build_counter(settings),
            clock,
            reads,
            ensure_fresh=ensure_subject_fresh,
            default_wait_s=settings.read_wait_timeout_s,
        )

        def source_ref_token(app_id: str, ref: str) -> str | None:
            """The import's keyed token of (app, source_ref): what the stream keeps of an
            erased capture's ref (bug IC); None without idempotency keys."""
            kernel = kernel_ref[0]
            if kernel.idempotency is None:
                return None
            return kernel.request_token(app_id, ref, namespace="source_ref")

        erasure_service = ErasureService(
            app,
            keystore,
            subjects,
            queries,
            views,
            engines=stores.distinct(),
            clock=clock,
            audit=audit,
            log=audit_log,
            catch_up=lambda nid, timeout: kernel_ref[0].catch_up(nid, timeout),
            flush_caches=lambda stream: kernel_ref[0].flush_caches(stream),
            tenant=settings.tenant,
            ref_token=source_ref_token,
        )
        # The erasure ledger's check for the update engine: items erased without their
        # evidence are not recorded again from the same captures (extraction, quarantine
        # retries, proposals).
        erased_items = ErasedItemGuard(lambda: keystore.ledger, audit, keystore.subjects_of_streams)
        extraction = ExtractionWorker(
            app,
            extractor,
            evidence,
            clock,
            batch_size=settings.projection_batch_size,
            may_capture=capture_permits(
                (lambda _tenant: deciding)
                if authorizer is not None  # the caller's own authorizer decides every tenant
                else tenant_authorizers(deciding, policy, settings, audit)
            ),
            tenant=settings.tenant,
            tenants_of=keystore.subjects_of_streams,
            partitioning=partitioning,
            partitions=partitions,
            erased_items=erased_items,
            # Requests a crash kept off the audit log, recorded late (decision
            # 0101-capture-accepted-reconciled).
            late_captures=LateCaptures(
                app,
                audit_log,
                audit,
                keystore.subjects_of_streams,
                grace_s=settings.late_capture_check_s,
            ),
        )
        quarantined = QuarantineIndex(
            app, lambda: keystore.ledger.state() if keystore.ledger else None
        )
        quarantine = QuarantineService(
            app,
            audit,
            quarantined,
            keystore.subjects_of_streams,
            extraction.extract_again,
            tenant_pseudonym_of=partial(keystore.pseudonym_of_stream, tenant=settings.tenant),
        )
        extraction.on_quarantined = quarantine.recorded
        extraction.damaged_count = quarantined.damaged_count
        extraction.already_set_aside = quarantined.set_aside_among
        kernel = Uprof(
            settings=settings,
            app=app,
            keystore=keystore,
            subjects=subjects,
            queries=queries,
            clock=clock,
            audit=audit,
            capture_service=CaptureService(
                app, subjects, keystore, clock, audit, ref_token=source_ref_token
            ),
            consent_service=ConsentService(app, subjects, clock, audit),
            proposal_service=ProposalService(
                app, subjects, evidence, clock, audit, erased_items=erased_items
            ),
            profile_service=ProfileService(app, queries, sealer),
            extraction=extraction,
            quarantine=quarantine,
            projections=ProjectionRunner(
                app,
                queries,
                partial(embed_memories, embedder),
                batch_size=settings.projection_batch_size,
                partitioning=partitioning,
                partitions=partitions,
                # Damaged events the extraction worker set aside are passed over, not
                # projected (decision 0124-damaged-events-quarantined).
                set_aside=quarantined.set_aside_among,
                on_damaged=DamagedEvents(
                    app, quarantined, clock.now, quarantine.recorded
                ).set_aside,
            ),
            maintenance=MaintenanceService(app, subjects, queries),
            slice_service=slice_service,
            reads=reads,
            erasure_service=erasure_service,
            authorizer=deciding,
            audit_log=audit_log,
            views_engine=views,
            keys_engine=keys,
            closers=(close,),
            web_session_key=derive_key(root, WEB_SESSION_KEY_LABEL),
            web_sign_outs=SignOuts(views),
            rate_counters=RateCounters(views),
            idempotency=IdempotencyStore(
                views,
                derive_key(master, "uprof/idempotency/1"),
                tenant=settings.tenant,
                retention_s=settings.idempotency_retention_s,
                clock_ms=lambda: int(clock.now().timestamp() * 1000),
                turn=lambda name, previous, wait_s: backend_for(views).named_lock(
                    views, name, wait_s=wait_s, previous_release_shared=previous
                ),
                in_progress_wait_s=settings.request_in_progress_wait_s,
            ),
            policy_service=policy,
            cursors=CursorCodec(derive_key(master, "uprof/cursor/1")),
            vector_model=vector_model,
        )
    except BaseException:
        # The wiring (an embedder or an extractor that cannot be built), the policy store,
        # the kernel: everything this start opened is let go of, as at every other
        # failure of a start. Around the policy store's build only, it was: the wiring
        # left the stores' open hold, the event log's and the policy store's pools open
        # for as long as anything kept the exception (bug YH).
        turn.release()
        if opened_policy is not None:
            opened_policy.close()
        app.close()
        release_stores()
        stores.dispose()
        raise
    kernel_ref.append(kernel)
    if not restoring:
        from uprof.services.recovery import (
            reapply_ledger,
            rebuild_views_ahead_of_log,
            settle_subjects_without_keys,
        )

        try:
            # Its views' read is the turn's last use: it lets go of the turn there.
            reapply_ledger(kernel, turn=turn)
            turn.release()
            rebuild_views_ahead_of_log(kernel)
            settle_subjects_without_keys(kernel, accept=settings.accept_lost_keys)
            # An audit key rotation killed after its key switch, before its entry: the
            # entry, recorded late (nothing read without a rotation in the history).
            kernel.record_audit_key_rotations()
            # An erasure killed between its erasure.requested entry and its ledger
            # record: its outcome, abandoned (bug GY).
            kernel.erasure_service.settle_abandoned()
        except BaseException:
            turn.release()
            kernel.close()
            raise
    turn.release()  # restoring: ``uprof restore`` re-applies the ledger itself, later
    return kernel
