"""RFC 9162 §2.1 Merkle tree hashing, inclusion proofs and consistency proofs.

Hashes (RFC 9162 §2.1.1, identical to RFC 6962):

- empty tree: ``SHA-256("")``
- leaf: ``SHA-256(0x00 || entry_bytes)``
- interior node: ``SHA-256(0x01 || left || right)``

The distinct prefixes stop an interior node from posing as a leaf (second-preimage).

Perfect nodes. A *perfect node* ``(level, index)`` is the hash of the complete subtree of
``2**level`` leaves ``[index * 2**level, (index + 1) * 2**level)``; level 0 is the leaf hash.
In the RFC tree every left child is a perfect node and every right child is either a perfect
node or a subtree ending at the tree size, so any tree hash and any proof can be assembled from
perfect nodes. Perfect nodes never change once their last leaf exists, which is what lets the
database-backed log store them once and answer proofs in O(log² n) lookups without rehashing.

The proof builders below take a ``NodeGetter`` (``(level, index) -> hash``) so the same code
serves the in-memory ``MerkleTree`` and the database-backed log.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Sequence
from hashlib import sha256

from audit._codec import b64decode_strict, b64encode
from audit.errors import VerificationError

HASH_SIZE = 32
#: RFC 9162 §2.1.1: the hash of an empty list is the hash of an empty string.
EMPTY_ROOT = sha256(b"").digest()

_LEAF_PREFIX = b"\x00"
_NODE_PREFIX = b"\x01"

#: Return the hash of perfect node (level, index).
NodeGetter = Callable[[int, int], bytes]


def leaf_hash(entry: bytes) -> bytes:
    """Hash one leaf: ``SHA-256(0x00 || entry)``."""
    return sha256(_LEAF_PREFIX + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """Hash an interior node: ``SHA-256(0x01 || left || right)``."""
    return sha256(_NODE_PREFIX + left + right).digest()


def split_point(size: int) -> int:
    """Return the largest power of two strictly less than ``size`` (``size >= 2``)."""
    # RFC 9162 §2.1.1: split at the largest power of two below n.
    return 1 << ((size - 1).bit_length() - 1)


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def subtree_hash(node: NodeGetter, start: int, size: int) -> bytes:
    """Return MTH of leaves ``[start, start + size)`` of an RFC tree, built from perfect nodes."""
    if size == 0:
        return EMPTY_ROOT
    if _is_power_of_two(size):
        level = size.bit_length() - 1
        # Ranges reached by RFC splits are aligned; an unaligned one is a programming error.
        if start % size:
            raise ValueError(f"range [{start}, {start + size}) is not an aligned perfect subtree")
        return node(level, start >> level)
    k = split_point(size)
    return node_hash(subtree_hash(node, start, k), subtree_hash(node, start + k, size - k))


def frontier_keys(size: int) -> list[tuple[int, int]]:
    """Return the perfect nodes that tile ``[0, size)``, left to right (largest first)."""
    keys = []
    for level in range(size.bit_length() - 1, -1, -1):
        if size >> level & 1:
            keys.append((level, (size >> level) - 1))
    return keys


def root_from_frontier(frontier: Sequence[bytes]) -> bytes:
    """Fold the perfect nodes of ``frontier_keys(size)`` (left to right) into the tree hash."""
    if not frontier:
        return EMPTY_ROOT
    root = frontier[-1]
    for left in reversed(frontier[:-1]):
        root = node_hash(left, root)
    return root


def tree_hash(node: NodeGetter, size: int) -> bytes:
    """Return the root of the first ``size`` leaves."""
    return root_from_frontier([node(level, index) for level, index in frontier_keys(size)])


def inclusion_path(node: NodeGetter, leaf_index: int, tree_size: int) -> list[bytes]:
    """Build the RFC 9162 §2.1.3.1 inclusion proof ``PATH(m, D[n])``, ordered leaf to root."""
    if not 0 <= leaf_index < tree_size:
        raise ValueError(f"leaf_index {leaf_index} is outside a tree of size {tree_size}")
    proof: list[bytes] = []
    start, m, n = 0, leaf_index, tree_size
    while n > 1:
        k = split_point(n)
        if m < k:
            proof.append(subtree_hash(node, start + k, n - k))
            n = k
        else:
            proof.append(subtree_hash(node, start, k))
            start, m, n = start + k, m - k, n - k
    proof.reverse()
    return proof


def consistency_path(node: NodeGetter, old_size: int, new_size: int) -> list[bytes]:
    """Build the RFC 9162 §2.1.4.1 consistency proof ``PROOF(m, D[n])``.

    Empty when ``old_size`` is 0 or equals ``new_size``.
    """
    if not 0 <= old_size <= new_size:
        raise ValueError(f"cannot prove consistency from size {old_size} to size {new_size}")
    if old_size in (0, new_size):
        return []
    proof: list[bytes] = []
    start, m, n, whole = 0, old_size, new_size, True
    # SUBPROOF(m, D[n], b), unrolled: siblings are collected root-first, then reversed.
    while m != n:
        k = split_point(n)
        if m <= k:
            proof.append(subtree_hash(node, start + k, n - k))
            n = k
        else:
            proof.append(subtree_hash(node, start, k))
            start, m, n, whole = start + k, m - k, n - k, False
    if not whole:
        proof.append(subtree_hash(node, start, m))
    proof.reverse()
    return proof


# --- Verification --------------------------------------------------------------------------


def _check_hash(value: bytes, what: str) -> None:
    if not isinstance(value, bytes | bytearray) or len(value) != HASH_SIZE:
        raise VerificationError(f"{what} is not a {HASH_SIZE}-byte hash")


def root_from_inclusion_proof(
    leaf: bytes, leaf_index: int, tree_size: int, proof: Sequence[bytes]
) -> bytes:
    """Recompute the root that ``proof`` leads to (RFC 9162 §2.1.3.2); raise if malformed."""
    if not 0 <= leaf_index < tree_size:
        raise VerificationError(
            f"leaf_index {leaf_index} is outside a tree of size {tree_size}", leaf_index=leaf_index
        )
    _check_hash(leaf, "leaf hash")
    fn, sn, r = leaf_index, tree_size - 1, bytes(leaf)
    for position, p in enumerate(proof):
        if not (isinstance(p, bytes | bytearray) and len(p) == HASH_SIZE):
            _check_hash(p, f"inclusion proof element {position}")  # raises, naming it
        if sn == 0:
            raise VerificationError(
                f"inclusion proof for leaf {leaf_index} in tree of size {tree_size} is too long",
                leaf_index=leaf_index,
            )
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise VerificationError(
            f"inclusion proof for leaf {leaf_index} in tree of size {tree_size} is too short",
            leaf_index=leaf_index,
        )
    return r


def verify_inclusion(
    leaf: bytes, leaf_index: int, tree_size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """Check that ``leaf`` sits at ``leaf_index`` of the tree ``root``; raise VerificationError."""
    _check_hash(root, "root hash")
    computed = root_from_inclusion_proof(leaf, leaf_index, tree_size, proof)
    if not hmac.compare_digest(computed, bytes(root)):
        raise VerificationError(
            f"inclusion proof for leaf {leaf_index} does not lead to the root of the tree of "
            f"size {tree_size}",
            leaf_index=leaf_index,
        )


def verify_consistency(
    old_size: int,
    new_size: int,
    old_root: bytes,
    new_root: bytes,
    proof: Sequence[bytes],
) -> None:
    """Check that tree ``new_root`` extends tree ``old_root`` (RFC 9162 §2.1.4.2); raise if not."""
    _check_hash(old_root, "old root")
    _check_hash(new_root, "new root")
    for position, p in enumerate(proof):
        _check_hash(p, f"consistency proof element {position}")
    if not 0 <= old_size <= new_size:
        raise VerificationError(f"tree size went from {old_size} to {new_size}: a log only grows")
    if old_size == new_size:
        if proof:
            raise VerificationError("consistency proof between equal sizes must be empty")
        if not hmac.compare_digest(bytes(old_root), bytes(new_root)):
            raise VerificationError(f"two different roots for the same tree size {old_size}")
        return
    if old_size == 0:
        if proof:
            raise VerificationError("consistency proof from the empty tree must be empty")
        if not hmac.compare_digest(bytes(old_root), EMPTY_ROOT):
            raise VerificationError("the root of the empty tree is not SHA-256 of nothing")
        return
    if not proof:
        raise VerificationError(f"empty consistency proof from size {old_size} to {new_size}")

    path = list(proof)
    if _is_power_of_two(old_size):
        path.insert(0, bytes(old_root))
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = bytes(path[0])
    for c in path[1:]:
        if sn == 0:
            raise VerificationError(
                f"consistency proof from size {old_size} to {new_size} is too long"
            )
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise VerificationError(
            f"consistency proof from size {old_size} to {new_size} is too short"
        )
    if not hmac.compare_digest(fr, bytes(old_root)):
        raise VerificationError(
            f"consistency proof does not lead to the old root (size {old_size})"
        )
    if not hmac.compare_digest(sr, bytes(new_root)):
        raise VerificationError(
            f"consistency proof does not lead to the new root (size {new_size})"
        )


# --- In-memory tree ------------------------------------------------------------------------


class Frontier:
    """The perfect nodes that tile ``[0, size)``: enough to append leaves and get the root.

    ``append`` returns every perfect node that the new leaf completes (levels >= 1), which is
    what the database-backed log stores; amortised, one new node per leaf.
    """

    def __init__(self, size: int = 0, nodes: Sequence[bytes] = ()) -> None:
        keys = frontier_keys(size)
        if len(keys) != len(nodes):
            raise ValueError(f"a frontier of size {size} has {len(keys)} nodes, got {len(nodes)}")
        self._size = size
        self._stack: list[tuple[int, bytes]] = [
            (level, bytes(h)) for (level, _), h in zip(keys, nodes, strict=True)
        ]

    @property
    def size(self) -> int:
        return self._size

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        """Add one leaf hash; return the completed perfect nodes as ``(level, index, hash)``."""
        index = self._size
        self._size += 1
        level, h = 0, leaf
        completed = []
        while self._stack and self._stack[-1][0] == level:
            _, left = self._stack.pop()
            h = node_hash(left, h)
            level += 1
            index >>= 1
            completed.append((level, index, h))
        self._stack.append((level, h))
        return completed

    def root(self) -> bytes:
        return root_from_frontier([h for _, h in self._stack])

    def hashes(self) -> list[bytes]:
        """The frontier's node hashes, in the order ``frontier_keys(size)`` names them."""
        return [h for _, h in self._stack]


class MerkleTree:
    """An in-memory RFC 9162 tree keeping every perfect node (for exports, tests and tools)."""

    def __init__(self, leaf_hashes: Iterable[bytes] = ()) -> None:
        self._levels: list[list[bytes]] = [[]]
        for leaf in leaf_hashes:
            self.append(leaf)

    @property
    def size(self) -> int:
        return len(self._levels[0])

    def append(self, leaf: bytes) -> int:
        """Add a leaf hash; return its index."""
        index = len(self._levels[0])
        self._levels[0].append(bytes(leaf))
        level, i = 0, index
        while i & 1:
            left, right = self._levels[level][i - 1], self._levels[level][i]
            level += 1
            i >>= 1
            if level == len(self._levels):
                self._levels.append([])
            self._levels[level].append(node_hash(left, right))
        return index

    def node(self, level: int, index: int) -> bytes:
        """Return perfect node ``(level, index)``."""
        return self._levels[level][index]

    def _size_or_current(self, tree_size: int | None) -> int:
        size = self.size if tree_size is None else tree_size
        if not 0 <= size <= self.size:
            raise ValueError(f"tree_size {size} is outside 0..{self.size}")
        return size

    def root(self, tree_size: int | None = None) -> bytes:
        return tree_hash(self.node, self._size_or_current(tree_size))

    def inclusion_proof(self, leaf_index: int, tree_size: int | None = None) -> list[bytes]:
        return inclusion_path(self.node, leaf_index, self._size_or_current(tree_size))

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> list[bytes]:
        return consistency_path(self.node, old_size, self._size_or_current(new_size))


# --- Many proofs of one tree, read in leaf order ---------------------------------------------


def _decoded(text: str) -> bytes | None:
    """The 32 bytes ``text`` is the canonical base64 of, else None."""
    try:
        return b64decode_strict(text, "hash", size=HASH_SIZE)
    except VerificationError:
        return None


class IncreasingInclusions:
    """Inclusion proofs (canonical base64 texts) of strictly increasing leaves of one tree,
    checked hashing each node of the tree about once over the whole run, not once per proof.

    ``check(leaf, leaf_index, proof)`` is True only when ``verify_inclusion(leaf,
    leaf_index, tree_size, <proof decoded>, root)`` holds, and decides it without running
    it. It keeps the path of the last leaf it accepted: its ancestors' hashes from the root
    down and their siblings' hashes, each node of which is the hash of its two children,
    up to the root, and the texts of that leaf's proof. A later leaf shares that path down
    to the two leaves' lowest common ancestor: there the proof's elements must be the same
    texts as the last proof's; one level down, the later leaf sits in the right child (the
    last path's sibling there, a hash known), and the proof's element there must be the
    last path's own node (the left child); below, the proof is new and is hashed from the
    leaf up to that right child's known hash. Those are the hashes the full check computes,
    in the same order, up to that child; above it the full check would recompute the
    known path, which leads to the root: a proof this accepts, the full check accepts.
    An unfiltered trail costs about one node hash per leaf instead of log2(n); a sparse
    filtered one up to the whole path, as before. Holds O(log n) hashes.

    False says only "not shown here" (a leaf out of order, a proof of the wrong length, a
    hash that is not canonical base64 of 32 bytes or differs from the known path's): the
    caller then runs ``verify_inclusion``, which says what is wrong. A proof that it
    accepts where this refused would need two different hashes at one node that both lead
    to the root: a SHA-256 collision; the caller refuses it too (fail closed).
    """

    def __init__(self, tree_size: int, root: bytes) -> None:
        self._size = tree_size
        self._last = -1
        # The last accepted leaf's path by depth from the root (depth 0 is the root): each
        # node's first leaf, size and hash, and its sibling's hash (none for the root).
        self._starts: list[int] = [0]
        self._sizes: list[int] = [tree_size]
        self._hashes: list[bytes] = [bytes(root)]
        self._siblings: list[bytes] = [b""]
        #: The last accepted proof's texts, leaf to root: element ``-d`` is the sibling at
        #: depth d, the canonical base64 of ``_siblings[d]``.
        self._texts: list[str] = []

    def check(self, leaf: bytes, leaf_index: int, proof: Sequence[str]) -> bool:
        """Whether ``proof`` (base64 texts, leaf to root) leads ``leaf`` at ``leaf_index`` to
        the root; False when it does not, or when that is not shown here."""
        j = leaf_index
        if not self._last < j < self._size or len(leaf) != HASH_SIZE:
            return False
        starts, sizes, hashes, siblings = self._starts, self._sizes, self._hashes, self._siblings
        if self._last < 0:
            # The first proof: the whole path is new, hashed up to the root.
            base, start, size, known, sibling = 0, 0, self._size, hashes[0], b""
        else:
            # The deepest node of the last path that holds j too (the root holds it).
            top = len(starts) - 1
            while starts[top] + sizes[top] <= j:
                top -= 1
            base = top + 1
            if len(proof) < base or (top and proof[-top:] != self._texts[-top:]):
                return False
            # j is in that node's right child, the last path's sibling at depth ``base``;
            # the proof's element there is the last path's node at that depth.
            sibling = hashes[base]
            if proof[len(proof) - base] != b64encode(sibling):
                return False
            split = split_point(sizes[top])
            start, size, known = starts[top] + split, sizes[top] - split, siblings[base]
        # From that node, whose hash is known, down to the leaf.
        new_starts, new_sizes, lefts = [start], [size], []
        while size > 1:
            k = split_point(size)
            if j - start < k:
                size = k
                lefts.append(True)
            else:
                start, size = start + k, size - k
                lefts.append(False)
            new_starts.append(start)
            new_sizes.append(size)
        if len(lefts) != len(proof) - base:
            return False
        new_siblings: list[bytes] = []
        for text in proof[: len(lefts)]:  # leaf first
            decoded = _decoded(text)
            if decoded is None:
                return False
            new_siblings.append(decoded)
        node = bytes(leaf)
        new_hashes = [node]
        for is_left, other in zip(reversed(lefts), new_siblings, strict=True):
            node = node_hash(node, other) if is_left else node_hash(other, node)
            new_hashes.append(node)
        if node != known:
            return False
        # Accepted: below the common ancestor, the path is now j's.
        del starts[base:], sizes[base:], hashes[base:], siblings[base:]
        starts.extend(new_starts)
        sizes.extend(new_sizes)
        hashes.extend(reversed(new_hashes))
        siblings.append(sibling)
        siblings.extend(reversed(new_siblings))
        self._texts = list(proof)
        self._last = j
        return True
