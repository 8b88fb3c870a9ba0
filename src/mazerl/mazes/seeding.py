"""Per-maze seeds derived from names, so a maze depends only on what it is, not on who made it."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any printable parts, e.g. (base_seed, split, size, algorithm, index).

    Stable across processes, platforms and Python versions (unlike `hash`), so results do not
    depend on the number of workers or the order they run in.
    """
    text = "\x1f".join(str(p) for p in parts).encode("utf-8")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1
