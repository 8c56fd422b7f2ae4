"""Exhaustive RFC 9162 checks against a naive, literal transcription of the RFC definitions."""

from __future__ import annotations

import base64
import random
from hashlib import sha256
from typing import Any

import pytest

from audit._codec import b64encode
from audit.errors import VerificationError
from audit.merkle import (
    EMPTY_ROOT,
    Frontier,
    IncreasingInclusions,
    MerkleTree,
    frontier_keys,
    leaf_hash,
    node_hash,
    root_from_inclusion_proof,
    verify_consistency,
    verify_inclusion,
)

MAX_SIZE = 40


# --- Naive reference: RFC 9162 §2.1.1, §2.1.3.1, §2.1.4.1 written out literally ------------


def ref_k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_mth(leaves: list[bytes]) -> bytes:
    n = len(leaves)
    if n == 0:
        return sha256(b"").digest()
    if n == 1:
        return sha256(b"\x00" + leaves[0]).digest()
    k = ref_k(n)
    return sha256(b"\x01" + ref_mth(leaves[:k]) + ref_mth(leaves[k:])).digest()


def ref_path(m: int, leaves: list[bytes]) -> list[bytes]:
    n = len(leaves)
    if n == 1:
        return []
    k = ref_k(n)
    if m < k:
        return [*ref_path(m, leaves[:k]), ref_mth(leaves[k:])]
    return [*ref_path(m - k, leaves[k:]), ref_mth(leaves[:k])]


def ref_subproof(m: int, leaves: list[bytes], b: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if b else [ref_mth(leaves)]
    k = ref_k(n)
    if m <= k:
        return [*ref_subproof(m, leaves[:k], b), ref_mth(leaves[k:])]
    return [*ref_subproof(m - k, leaves[k:], False), ref_mth(leaves[:k])]


def ref_proof(m: int, leaves: list[bytes]) -> list[bytes]:
    return ref_subproof(m, leaves, True)


LEAVES = [f"entry-{i}".encode() for i in range(MAX_SIZE)]
TREE = MerkleTree(leaf_hash(d) for d in LEAVES)
REF_ROOTS = {n: ref_mth(LEAVES[:n]) for n in range(MAX_SIZE + 1)}


def rejected(verify: object, *args: object) -> bool:
    """True when the verifier raises VerificationError (cheaper than pytest.raises in loops)."""
    try:
        verify(*args)  # type: ignore[operator]
    except VerificationError:
        return True
    return False


#: One bit in every byte of a 32-byte hash, at a different place in each byte: a verifier
#: that compared only a prefix, or skipped a byte, accepts one of these flips. (Every one of
#: the 256 bits took 8x as long and tested SHA-256's avalanche, not the verifier.)
FLIP_BITS = tuple(byte * 8 + byte % 8 for byte in range(32))


def flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


# --- Hashing ---------------------------------------------------------------------------------


def test_leaf_and_node_hashes_use_distinct_prefixes() -> None:
    assert leaf_hash(b"x") == sha256(b"\x00x").digest()
    assert node_hash(b"a" * 32, b"b" * 32) == sha256(b"\x01" + b"a" * 32 + b"b" * 32).digest()
    assert EMPTY_ROOT == sha256(b"").digest()


def test_empty_tree_root_is_hash_of_nothing() -> None:
    assert MerkleTree().root() == EMPTY_ROOT
    assert Frontier().root() == EMPTY_ROOT


def test_known_answer_from_rfc6962_test_vectors() -> None:
    # The 8-leaf tree of the Certificate Transparency reference tests (RFC 6962 test vectors).
    data = [
        b"",
        b"\x00",
        b"\x10",
        b"\x20\x21",
        b"\x30\x31",
        b"\x40\x41\x42\x43",
        b"\x50\x51\x52\x53\x54\x55\x56\x57",
        b"\x60\x61\x62\x63\x64\x65\x66\x67\x68\x69\x6a\x6b\x6c\x6d\x6e\x6f",
    ]
    tree = MerkleTree(leaf_hash(d) for d in data)
    assert tree.root().hex() == "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"
    assert tree.root(1).hex() == "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
    assert tree.root(3).hex() == "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77"


@pytest.mark.parametrize("size", range(MAX_SIZE + 1))
def test_root_matches_reference_for_every_size(size: int) -> None:
    assert TREE.root(size) == REF_ROOTS[size]
    assert MerkleTree(leaf_hash(d) for d in LEAVES[:size]).root() == REF_ROOTS[size]


def test_frontier_appends_match_the_full_tree_and_emit_every_perfect_node() -> None:
    frontier = Frontier()
    for i, data in enumerate(LEAVES):
        for level, index, h in frontier.append(leaf_hash(data)):
            assert TREE.node(level, index) == h
        assert frontier.root() == REF_ROOTS[i + 1]
        size = i + 1
        resumed = Frontier(size, [TREE.node(lv, ix) for lv, ix in frontier_keys(size)])
        assert resumed.root() == REF_ROOTS[size]


# --- Inclusion -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", range(1, MAX_SIZE + 1))
def test_inclusion_proofs_match_reference_and_verify_for_every_index(size: int) -> None:
    root = REF_ROOTS[size]
    for index in range(size):
        proof = TREE.inclusion_proof(index, size)
        assert proof == ref_path(index, LEAVES[:size])
        verify_inclusion(leaf_hash(LEAVES[index]), index, size, proof, root)


@pytest.mark.parametrize("size", range(1, MAX_SIZE + 1))
def test_inclusion_proof_rejects_any_single_bit_flip(size: int) -> None:
    root = REF_ROOTS[size]
    for index in range(size):
        leaf = leaf_hash(LEAVES[index])
        proof = TREE.inclusion_proof(index, size)
        for bit in FLIP_BITS:
            assert rejected(verify_inclusion, leaf, index, size, proof, flip(root, bit))
            assert rejected(verify_inclusion, flip(leaf, bit), index, size, proof, root)
            for position in range(len(proof)):
                bad = list(proof)
                bad[position] = flip(bad[position], bit)
                assert rejected(verify_inclusion, leaf, index, size, bad, root), (position, bit)


@pytest.mark.parametrize("size", range(1, MAX_SIZE + 1))
def test_inclusion_proof_rejects_wrong_index_size_or_length(size: int) -> None:
    root = REF_ROOTS[size]
    for index in range(size):
        leaf = leaf_hash(LEAVES[index])
        proof = TREE.inclusion_proof(index, size)
        for other in range(size + 2):
            if other != index:
                with pytest.raises(VerificationError):
                    verify_inclusion(leaf, other, size, proof, root)
        # The size is bound to the root by the signed checkpoint, not by the path; a claimed
        # size is caught here whenever it implies a path of another shape.
        for other_size in range(index + 1, MAX_SIZE + 1):
            if len(ref_path(index, LEAVES[:other_size])) != len(proof):
                with pytest.raises(VerificationError):
                    verify_inclusion(leaf, index, other_size, proof, root)
        with pytest.raises(VerificationError):
            verify_inclusion(leaf, index, size, [*proof, b"\x00" * 32], root)
        if proof:
            with pytest.raises(VerificationError):
                verify_inclusion(leaf, index, size, proof[:-1], root)
            with pytest.raises(VerificationError):
                verify_inclusion(leaf, index, size, [proof[0][:31], *proof[1:]], root)
        if len(set(proof)) > 1:
            with pytest.raises(VerificationError):
                verify_inclusion(leaf, index, size, proof[::-1], root)


def test_inclusion_rejects_negative_and_out_of_range_indices() -> None:
    with pytest.raises(VerificationError, match="leaf_index -1"):
        root_from_inclusion_proof(leaf_hash(b"x"), -1, 4, [])
    with pytest.raises(VerificationError, match="outside a tree of size 0"):
        root_from_inclusion_proof(leaf_hash(b"x"), 0, 0, [])


# --- Consistency -----------------------------------------------------------------------------


def all_size_pairs() -> list[tuple[int, int]]:
    return [(m, n) for n in range(1, MAX_SIZE + 1) for m in range(n + 1)]


@pytest.mark.parametrize("new_size", range(1, MAX_SIZE + 1))
def test_consistency_proofs_match_reference_and_verify_for_every_pair(new_size: int) -> None:
    for old_size in range(new_size + 1):
        proof = TREE.consistency_proof(old_size, new_size)
        expected = [] if old_size in (0, new_size) else ref_proof(old_size, LEAVES[:new_size])
        assert proof == expected
        verify_consistency(old_size, new_size, REF_ROOTS[old_size], REF_ROOTS[new_size], proof)


@pytest.mark.parametrize("new_size", range(1, MAX_SIZE + 1))
def test_consistency_proof_rejects_any_single_bit_flip(new_size: int) -> None:
    new_root = REF_ROOTS[new_size]
    for old_size in range(1, new_size + 1):
        old_root = REF_ROOTS[old_size]
        proof = TREE.consistency_proof(old_size, new_size)
        for bit in FLIP_BITS:
            assert rejected(
                verify_consistency, old_size, new_size, flip(old_root, bit), new_root, proof
            )
            assert rejected(
                verify_consistency, old_size, new_size, old_root, flip(new_root, bit), proof
            )
            for position in range(len(proof)):
                bad = list(proof)
                bad[position] = flip(bad[position], bit)
                assert rejected(verify_consistency, old_size, new_size, old_root, new_root, bad)


@pytest.mark.parametrize("new_size", range(1, MAX_SIZE + 1))
def test_consistency_proof_rejects_wrong_sizes_and_lengths(new_size: int) -> None:
    for old_size in range(1, new_size):
        old_root, new_root = REF_ROOTS[old_size], REF_ROOTS[new_size]
        proof = TREE.consistency_proof(old_size, new_size)
        # Sizes are bound to roots by signed checkpoints; here a wrong size must be caught
        # whenever it implies a proof of another shape.
        for other_old in range(1, new_size):
            if len(ref_proof(other_old, LEAVES[:new_size])) != len(proof):
                with pytest.raises(VerificationError):
                    verify_consistency(other_old, new_size, old_root, new_root, proof)
        for other_new in range(old_size + 1, MAX_SIZE + 1):
            if len(ref_proof(old_size, LEAVES[:other_new])) != len(proof):
                with pytest.raises(VerificationError):
                    verify_consistency(old_size, other_new, old_root, new_root, proof)
        with pytest.raises(VerificationError):
            verify_consistency(old_size, new_size, old_root, new_root, [*proof, proof[-1]])
        with pytest.raises(VerificationError):
            verify_consistency(old_size, new_size, old_root, new_root, proof[:-1])
        with pytest.raises(VerificationError):
            verify_consistency(new_size, old_size, new_root, old_root, proof)


def test_consistency_edge_cases() -> None:
    verify_consistency(0, 5, EMPTY_ROOT, REF_ROOTS[5], [])
    with pytest.raises(VerificationError):
        verify_consistency(0, 5, REF_ROOTS[1], REF_ROOTS[5], [])
    with pytest.raises(VerificationError):
        verify_consistency(0, 5, EMPTY_ROOT, REF_ROOTS[5], [REF_ROOTS[5]])
    with pytest.raises(VerificationError):
        verify_consistency(5, 5, REF_ROOTS[5], REF_ROOTS[5], [REF_ROOTS[5]])
    with pytest.raises(VerificationError):
        verify_consistency(5, 5, REF_ROOTS[5], REF_ROOTS[4], [])


def test_random_large_trees_agree_with_reference() -> None:
    rng = random.Random(9162)
    for _ in range(5):
        size = rng.randrange(41, 300)
        leaves = [rng.randbytes(rng.randrange(0, 20)) for _ in range(size)]
        tree = MerkleTree(leaf_hash(d) for d in leaves)
        assert tree.root() == ref_mth(leaves)
        for _ in range(10):
            index = rng.randrange(size)
            assert tree.inclusion_proof(index) == ref_path(index, leaves)
            old = rng.randrange(1, size)
            assert tree.consistency_proof(old) == ref_proof(old, leaves)


# --- Proofs of one tree read in leaf order (decision 0254-audit-verifier-cost) ---------------


def texts(proof: list[bytes]) -> list[str]:
    return [b64encode(h) for h in proof]


def full_check_accepts(leaf: bytes, index: int, size: int, proof: list[str], root: bytes) -> bool:
    try:
        hashes = [base64.b64decode(t, validate=True) for t in proof]
    except ValueError:
        return False
    return not rejected(verify_inclusion, leaf, index, size, hashes, root)


@pytest.mark.parametrize("size", range(1, MAX_SIZE + 1))
def test_every_leaf_in_order_is_accepted_and_every_changed_proof_refused(size: int) -> None:
    # An unfiltered trail: every leaf, in order. Before each genuine proof, each one-bit
    # flip of the leaf and of every hash of its proof, the proof a hash longer or shorter,
    # reversed, and the proof of the leaf before or after it: all refused, each leaving the
    # run as it was (the genuine proof is accepted after them).
    root = REF_ROOTS[size]
    run = IncreasingInclusions(size, root)
    for index in range(size):
        leaf = leaf_hash(LEAVES[index])
        raw = ref_path(index, LEAVES[:size])
        proof = texts(raw)
        for bit in FLIP_BITS:
            assert not run.check(flip(leaf, bit), index, proof)
            for position in range(len(raw)):
                bad = list(raw)
                bad[position] = flip(bad[position], bit)
                assert not run.check(leaf, index, texts(bad)), (index, position, bit)
        assert not run.check(leaf, index, [*proof, b64encode(leaf)])
        if proof:
            assert not run.check(leaf, index, proof[:-1])
            assert not run.check(leaf, index, proof[1:])
        if len(set(proof)) > 1:
            assert not run.check(leaf, index, proof[::-1])
        for other in (index - 1, index + 1):
            if 0 <= other < size and ref_path(other, LEAVES[:size]) != raw:
                assert not run.check(leaf, index, texts(ref_path(other, LEAVES[:size])))
        assert not run.check(leaf, size, proof)
        assert run.check(leaf, index, proof), index
        # Once accepted, a leaf is behind the run: the same or an earlier one is refused.
        assert not run.check(leaf, index, proof)


def test_a_hash_in_another_spelling_is_refused() -> None:
    # Base64 with its padding bits set spells the same 32 bytes: only the canonical text
    # is the one the full check reads (and a text equal to the last proof's is canonical).
    size = 13
    run = IncreasingInclusions(size, REF_ROOTS[size])
    for index in range(3):
        assert run.check(leaf_hash(LEAVES[index]), index, texts(TREE.inclusion_proof(index, size)))
    proof = texts(TREE.inclusion_proof(3, size))
    for position, text in enumerate(proof):
        other = text[:42] + chr(ord(text[42]) + 1) + "="  # the same bytes, padding bits set
        assert base64.b64decode(other) == base64.b64decode(text)
        bad = [*proof[:position], other, *proof[position + 1 :]]
        assert not run.check(leaf_hash(LEAVES[3]), 3, bad)
        not_text: list[Any] = [*proof[:position], 7, *proof[position + 1 :]]
        assert not run.check(leaf_hash(LEAVES[3]), 3, not_text)
    assert run.check(leaf_hash(LEAVES[3]), 3, proof)


def test_sparse_leaves_agree_with_the_full_check_on_any_change() -> None:
    # A filtered trail: some leaves, in order, of trees up to 300. Each proof, genuine or
    # changed (a hash replaced by another of the tree, dropped, added; another leaf), is
    # accepted exactly when the full check accepts it.
    rng = random.Random(20261207)
    for _ in range(40):
        size = rng.randrange(1, 300)
        leaves = [rng.randbytes(rng.randrange(0, 20)) for _ in range(size)]
        tree = MerkleTree(leaf_hash(d) for d in leaves)
        root = tree.root()
        run = IncreasingInclusions(size, root)
        chosen = sorted(rng.sample(range(size), rng.randint(1, size)))
        for index in chosen:
            leaf = leaf_hash(leaves[index])
            proof = texts(tree.inclusion_proof(index))
            for _ in range(3):
                bad, bad_leaf = list(proof), leaf
                kind = rng.randrange(4)
                if kind == 0 and bad:
                    bad[rng.randrange(len(bad))] = b64encode(tree.node(0, rng.randrange(size)))
                elif kind == 1 and bad:
                    bad.pop(rng.randrange(len(bad)))
                elif kind == 2:
                    bad.insert(rng.randrange(len(bad) + 1), proof[0] if proof else "")
                else:
                    bad_leaf = leaf_hash(leaves[rng.randrange(size)])
                expected = full_check_accepts(bad_leaf, index, size, bad, root)
                assert run.check(bad_leaf, index, bad) is expected
                if expected:
                    break
            else:
                assert run.check(leaf, index, proof)
