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
