"""Subject access and portability export (GDPR Art. 15 and 20): everything held, with evidence.

The export is plain JSON a person can read and another service can import: the
consents, each profile item with the captured events it came from, every captured
interaction, and which apps read which items when. It is produced on request and
never stored by uprof (the caller decides where it goes).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any
from uuid import UUID

from uprof.ports import ViewStore
from uprof.services.profile import ProfileView

EXPORT_FORMAT = "uprof.subject-export/v1"


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def build_subject_export(
    queries: ViewStore, stream_id: UUID, view: ProfileView, *, exported_at: datetime
) -> dict[str, Any]:
    cited = {e for a in view.attributes for e in a.evidence}
    cited |= {e for m in view.memories for e in m.evidence}
    cited |= {e for i in view.intents for e in i.evidence}
    captures = queries.captures(cited)
    all_captures = queries.all_captures(str(stream_id))
    return {
        "format": EXPORT_FORMAT,
        "exported_at": exported_at.isoformat(),
        # The log positions bound a withdrawal's erasure; internal, as session_key below.
        "consents": [
            _plain({k: v for k, v in asdict(c).items() if not k.endswith("_position")})
            for c in view.consents
        ],
        "attributes": [_plain(asdict(a)) for a in view.attributes],
        # session_key is an internal keyed hash, meaningless to the subject.
        "memories": [
            _plain({k: v for k, v in asdict(m).items() if k != "session_key"})
            for m in view.memories
        ],
        "intents": [_plain(asdict(i)) for i in view.intents],
        "captured_events": [
            _plain({k: v for k, v in asdict(c).items() if k != "stream_id"}) for c in all_captures
        ],
        "evidence_index": sorted(e for e in cited if e in captures),
        "reads": [
            {
                "item_id": item,
                "app_id": app,
                "purpose": purpose,
                "reads": n,
                "last_read_at": at.isoformat(),
            }
            for item, app, purpose, n, at in queries.item_reads(str(stream_id))
        ],
    }
