"""The real clock."""

from __future__ import annotations

from datetime import UTC, datetime


class SystemClock:
    """Timezone-aware UTC time from the operating system."""

    def now(self) -> datetime:
        return datetime.now(tz=UTC)
