"""Reading a file taken whole, within a bound: one reader for every such file uprof is
handed (the CLI's receipts, proofs, keys, checkpoints and key histories; a backup's
manifest), so none of them is read without end when it is not what it should be."""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: The most uprof reads of a file it takes whole: a receipt, a proof document, a key
#: history, a checkpoint note, a public key, a rotation proof, a backup's manifest. Each
#: is kilobytes (a note with 100 signature lines is about 40 KB, a proof of any tree a few
#: KB, a manifest a few hundred bytes per store file); an audit export, which can be any
#: length, is read a line at a time by the verifier, not through here. A wrong file (a
#: 2 GB trail, ``/dev/zero``, a FIFO that never ends, a sparse manifest of terabytes) was
#: read whole: hours or all the memory (bugs NG, OG). 16 MiB also holds the first two
#: lines of any export (each at most the format's 4 MiB), all ``rotation-proof`` reads of
#: one.
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024

#: ``read(n)`` allocates n bytes before it reads: a key of a few hundred bytes read as
#: ``read(16 MiB + 1)`` cost 16 MiB (seen in tests/audit/test_line_cap.py).
_READ_PIECE = 1 << 16


def read_at_most(path: Path, *, head: bool = False) -> bytes | None:
    """The bytes of ``path``, or None when it holds more than ``MAX_DOCUMENT_BYTES``: a
    regular file known by its size before a byte is read, anything else (a device, a
    FIFO) once one byte past the limit has arrived. With ``head``, a longer file is not
    refused: its first ``MAX_DOCUMENT_BYTES`` are returned (an export, whose first lines
    are read). ``OSError`` as ``open`` raises it."""
    wanted = MAX_DOCUMENT_BYTES + (0 if head else 1)
    with path.open("rb") as handle:
        info = os.fstat(handle.fileno())
        if not head and stat.S_ISREG(info.st_mode) and info.st_size > MAX_DOCUMENT_BYTES:
            return None
        pieces: list[bytes] = []
        size = 0
        while size < wanted and (piece := handle.read(min(_READ_PIECE, wanted - size))):
            pieces.append(piece)
            size += len(piece)
    return None if size > MAX_DOCUMENT_BYTES else b"".join(pieces)
