"""The one composition root: build engines, keys, models and services from Settings (P5).

Importing this module builds nothing; ``bootstrap(settings)`` does. Tests pass
fakes for the clock, embedder, extractor and audit trail.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from uuid import UUID

from audit.keys import load_or_create_signing_key
from audit.log import AuditLog
from projections.profile.projector import ProfileProjector
from projections.profile.queries import ProfileQueries
from uprof.adapters.audit_trail import AuditLogTrail
from uprof.adapters.clock import SystemClock
from uprof.crypto.fields import ViewSealer
from uprof.crypto.keystore import KekRing, KeyStore
from uprof.eventstore import ProfilesApplication
from uprof.kernel import Uprof
from uprof.partitions import Partitioning
from uprof.ports import AuditTrail, Clock, Embedder, Extractor, TokenCounter
from uprof.services.capture import CaptureService
from uprof.services.consent import ConsentService
from uprof.services.erasure import ErasureService
from uprof.services.extraction import EvidenceChecker, ExtractionWorker
from uprof.services.maintenance import MaintenanceService
from uprof.services.profile import ProfileService
from uprof.services.projection import ProjectionRunner
from uprof.services.proposals import ProposalService
from uprof.services.reads import ReadRecorder
from uprof.services.slices import Authorizer, Freshness, SliceService
from uprof.services.subjects import SubjectResolver
from uprof.settings import Settings
from uprof.storage import create_engine, layout_for, migrate

MASTER_KEY_FILE = "master.key"
KEK_RING_FILE = "keks.json"
AUDIT_KEY_FILE = "audit-signing.pem"


def _secret_file(path: Path, size: int = 32) -> bytes:
    """Read a secret file, creating it (mode 0600) on first start."""
    if path.exists():
        data = path.read_bytes()
        if len(data) < size:
            raise ValueError(f"{path.name} is shorter than {size} bytes; refusing to start")
        return data
    path.parent.mkdir(parents=True, exist_ok=True)
    data = secrets.token_bytes(size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return data


def master_secret(settings: Settings) -> bytes:
    if settings.master_secret is not None:
        raw = settings.master_secret.get_secret_value().encode()
        if len(raw) < 32:
            raise ValueError("UPROF_MASTER_SECRET must be at least 32 characters")
        return raw
    return _secret_file(settings.data_dir / MASTER_KEY_FILE)


def build_embedder(settings: Settings) -> Embedder:
    if settings.embedder == "hashing":
        from uprof.adapters.embeddings import HashingEmbedder

        return HashingEmbedder()
    from uprof.adapters.embeddings import MiniLMEmbedder

    return MiniLMEmbedder(torch_threads=settings.torch_threads or None)


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
        fallback=rules,
    )


def build_authorizer(settings: Settings) -> Authorizer:
    from policies import CasbinAuthorizer

    # The packaged seed is read-only; policy edits go to a copy named by the setting.
    return CasbinAuthorizer.from_files(
        settings.policy_model_path, settings.policy_path, save_changes=False
    )


def build_counter() -> TokenCounter:
    from uprof.adapters.tokens import TiktokenCounter

    return TiktokenCounter()


def bootstrap(
    settings: Settings,
    *,
    clock: Clock | None = None,
    embedder: Embedder | None = None,
    extractor: Extractor | None = None,
    audit: AuditTrail | None = None,
    authorizer: Authorizer | None = None,
    counter: TokenCounter | None = None,
    partitions: Sequence[int] | None = None,
) -> Uprof:
    """Build a ready deployment: migrate stores, open the log, wire the services.

    ``partitions``: the pipeline partitions this process runs (default: all of
    ``settings.worker_partitions``); ``uprof worker --partition K`` passes ``[K]``.
    """
    clock = clock or SystemClock()
    layout = layout_for(settings)
    views = create_engine(layout.views_url)
    keys = views if layout.keys_url == layout.views_url else create_engine(layout.keys_url)
    migrate(views, "views")
    migrate(keys, "keys")

    keystore = KeyStore(
        keys,
        master_secret=master_secret(settings),
        kek_ring=KekRing(settings.data_dir / KEK_RING_FILE),
    )
    events = views if layout.events_url == layout.views_url else create_engine(layout.events_url)
    app = ProfilesApplication(env=layout.eventsourcing_env, keystore=keystore, events_engine=events)
    partitioning = Partitioning(settings.worker_partitions)
    try:
        app.claim_partitioning(partitioning.count)
    except BaseException:
        app.close()
        for engine in {id(e): e for e in (views, keys, events)}.values():
            engine.dispose()
        raise
    subjects = SubjectResolver(keystore, settings.tenant)
    sealer = ViewSealer(keystore)
    queries = ProfileQueries(views, sealer)
    signing_key = load_or_create_signing_key(settings.data_dir / AUDIT_KEY_FILE)
    audit_log = AuditLog(views, signing_key, settings.audit_origin, clock=clock.now)
    if audit is None:
        audit = AuditLogTrail(audit_log, settings.tenant)
    embedder = embedder or build_embedder(settings)
    extractor = extractor or build_extractor(settings)
    evidence = EvidenceChecker(queries)

    def close() -> None:
        app.close()
        for engine in {id(e): e for e in (views, keys, events)}.values():
            engine.dispose()

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
        authorizer or build_authorizer(settings),
        embedder,
        counter or build_counter(),
        clock,
        reads,
        ensure_fresh=ensure_subject_fresh,
        default_wait_s=settings.read_wait_timeout_s,
    )
    erasure_service = ErasureService(
        app,
        keystore,
        subjects,
        queries,
        views,
        engines=list({id(e): e for e in (views, keys, events)}.values()),
        clock=clock,
        audit=audit,
        log=audit_log,
        catch_up=lambda nid, timeout: kernel_ref[0].catch_up(nid, timeout),
        flush_caches=lambda stream: kernel_ref[0].flush_caches(stream),
        tenant=settings.tenant,
    )
    kernel = Uprof(
        settings=settings,
        app=app,
        keystore=keystore,
        subjects=subjects,
        queries=queries,
        clock=clock,
        audit=audit,
        capture_service=CaptureService(app, subjects, keystore, clock, audit),
        consent_service=ConsentService(app, subjects, clock, audit),
        proposal_service=ProposalService(app, subjects, evidence, clock, audit),
        profile_service=ProfileService(app, queries, sealer),
        extraction=ExtractionWorker(
            app,
            extractor,
            evidence,
            clock,
            batch_size=settings.projection_batch_size,
            partitioning=partitioning,
            partitions=partitions,
        ),
        projections=ProjectionRunner(
            app,
            views,
            ProfileProjector(embedder, sealer),
            batch_size=settings.projection_batch_size,
            partitioning=partitioning,
            partitions=partitions,
        ),
        maintenance=MaintenanceService(app, subjects, queries),
        slice_service=slice_service,
        reads=reads,
        erasure_service=erasure_service,
        audit_log=audit_log,
        views_engine=views,
        keys_engine=keys,
        closers=(close,),
    )
    kernel_ref.append(kernel)
    return kernel
