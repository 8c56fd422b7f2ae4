"""Items erased without their evidence are not born again from the same captures.

An item erased with ``erase_item`` (its evidence kept) destroys no key: its captures
still read, and anything that proposes from them again (the pipeline extracting a
capture again after a restore of data older than its extraction, an operator's
quarantine retry in such a restore, an app proposing the same item citing the same
capture) would have recorded it again under a new random id that no ledger record
names. The erasure ledger's ``items`` record carries a keyed fingerprint of the item
per capture it cited (``ErasureLedger.fingerprint``); every path that runs the update
engine asks this guard for the subject's check, and the engine drops a proposal whose
(kind, identity, capture) an erasure took (``SubjectProfile.apply_proposals``). The
drop is decided inside the save's load-decide-save, so no process, however many run
or die, records the item first. Each drop is audited once its save commits
(``item.rebirth_refused``: the subject's pseudonym, the captures' ids and counts per
kind, never the item). Decision 0097-erased-items-not-reborn.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from uuid import UUID

from domain.profile import ErasedItems
from uprof.ports import AuditTrail

if TYPE_CHECKING:
    from uprof.crypto.ledger import ErasureLedger

_log = logging.getLogger(__name__)

#: The audit action of a proposal dropped because an erasure took its item.
REBIRTH_REFUSED = "item.rebirth_refused"
#: Captures an entry names at most (an audit entry's lists hold 1,000 items; a longer
#: list is refused, after the save that dropped the proposals has committed).
MAX_LISTED = 1000


@dataclass(frozen=True)
class Refused:
    """One proposal the update engine dropped: an erased item would have been reborn."""

    stream_id: UUID
    kind: str
    capture_ids: tuple[str, ...]


class ErasedItemGuard:
    """The erasure ledger's check for the update engine, and the audit of its drops."""

    def __init__(
        self,
        ledger: Callable[[], ErasureLedger | None],
        audit: AuditTrail,
        subjects_of: Callable[[Iterable[str]], dict[str, tuple[str, str]]],
    ) -> None:
        self._ledger = ledger
        self._audit = audit
        #: stream id -> (tenant, pseudonym) of live subjects, whatever their tenant
        #: (``KeyStore.subjects_of_streams``): a worker extracts every tenant's captures.
        self._subjects_of = subjects_of

    def check(self, stream_id: UUID, refused: list[Refused]) -> ErasedItems | None:
        """The check to give ``apply_proposals`` for this subject (None: the ledger names
        no erased item of it with fingerprints); each drop is appended to ``refused``."""
        ledger = self._ledger()
        erased = None if ledger is None else ledger.erased_items(str(stream_id))
        if erased is None:
            return None
        found = erased

        def check(kind: str, identity: str, evidence: tuple[str, ...]) -> bool:
            # The captures the erased item came from, not every capture the proposal
            # cites: a proposer citing many others cannot swell the entry.
            taken = tuple(sorted(c for c in set(evidence) if found(kind, identity, (c,))))
            if not taken:
                return False
            refused.append(Refused(stream_id, kind, taken))
            return True

        return check

    def recorded(self, refused: Sequence[Refused]) -> None:
        """Audit and log the drops of a save that committed (one entry per subject)."""
        by_stream: dict[UUID, list[Refused]] = {}
        for r in refused:
            by_stream.setdefault(r.stream_id, []).append(r)
        entries: list[tuple[str, dict[str, object]]] = []
        subjects = self._subjects_of(str(s) for s in by_stream) if by_stream else {}
        for stream_id, drops in by_stream.items():
            # The subject's own tenant and pseudonym. A subject erased since the save
            # (by any tenant's process) gets no entry: its tenant is no longer known, the
            # worker's would name another tenant's captures, and its erasure's entries
            # are what the log says of its data (as for a late capture.accepted).
            if str(stream_id) not in subjects:
                continue
            tenant, pseudonym = subjects[str(stream_id)]
            captures = sorted({c for d in drops for c in d.capture_ids})
            _log.warning(
                "%d proposals of one subject would have recorded again items that an "
                "erasure took (re-extraction of data older than the erasure?): dropped",
                len(drops),
            )
            entries.append(
                (
                    REBIRTH_REFUSED,
                    {
                        "subject_ref": pseudonym,
                        "tenant": tenant,
                        "event_ids": captures[:MAX_LISTED],
                        "reason_code": "erased-item",
                        "counts": dict(sorted(Counter(d.kind for d in drops).items())),
                    },
                )
            )
        if entries:
            self._audit.record_many(entries)
