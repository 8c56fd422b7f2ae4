"""Retrieval and packing: the best gated profile items for a query, under a token budget.

Public surface::

    index = MemoryIndex.build(memory_candidates, vectors_or_None, counter)   # once per subject
    packed = build_slice(query=..., attributes=..., intents=..., memory_index=index,
                         budget_tokens=B, counter=counter, query_vector=v_or_None, now=now)
    packed.text, packed.items, packed.n_tokens, packed.left_out
"""

from uprof.retrieval.builder import ProfileLines, build_slice
from uprof.retrieval.candidates import Candidate
from uprof.retrieval.index import MemoryIndex
from uprof.retrieval.slices import LeftOut, LeftOutReason, PackedSlice, SliceOptions

__all__ = [
    "Candidate",
    "LeftOut",
    "LeftOutReason",
    "MemoryIndex",
    "PackedSlice",
    "ProfileLines",
    "SliceOptions",
    "build_slice",
]
