"""Bound the C allocator's arenas in long-running processes (servers, workers).

glibc's malloc gives threads their own arenas, up to 8 per core, and memory freed in one
arena is not reused by another. A server whose request threads take turns with many
subjects' views, keys and SQLite pages keeps growing its RSS that way even when every
cache of its own is bounded (decision 0014); with two arenas it levels off (measured in
docs/performance.md, "Memory"). ``MALLOC_ARENA_MAX`` does the same from the environment,
but only if set before the process starts; ``mallopt`` sets it from inside, which works
as long as it runs before the process starts its threads.

Nothing happens on a C library without ``mallopt`` (musl, macOS): the setting is a glibc
tuning, not a correctness matter.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

_log = logging.getLogger(__name__)

#: glibc's malloc.h: ``#define M_ARENA_MAX -8``.
M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas at ``arenas``; 0 leaves the C library's default.

    Returns whether the cap was set. Call it before the process starts threads: an
    arena a thread already holds is kept.
    """
    if arenas <= 0:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt answers 1 on success and 0 when it refuses the value.
    applied: bool = int(mallopt(M_ARENA_MAX, arenas)) == 1
    _log.debug("malloc arenas capped at %d: %s", arenas, applied)
    return applied
