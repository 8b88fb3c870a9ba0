"""Canonical layout hashes, invariant to the 8 symmetries of the square (rotations, reflections).

Small mazes collide a lot under symmetry (a 4x4-cell maze has about 100k spanning trees, but only
about an eighth of that up to symmetry), so splits are deduplicated on these hashes.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .layout import Position


def _d4(grid: np.ndarray, points: tuple[Position, ...]):
    """Yield the 8 images of (grid, points) under the dihedral group of the square."""
    h, w = grid.shape
    for flip in (False, True):
        g = grid[:, ::-1] if flip else grid
        pts = [(r, w - 1 - c) if flip else (r, c) for r, c in points]
        gh, gw = h, w
        for _ in range(4):
            yield g, tuple(pts)
            # rot90 (counter-clockwise): (r, c) -> (W-1-c, r)
            g = np.rot90(g)
            pts = [(gw - 1 - c, r) for r, c in pts]
            gh, gw = gw, gh


def _digest(grid: np.ndarray, points: tuple[Position, ...]) -> bytes:
    h, w = grid.shape
    header = np.asarray([h, w, *(v for p in points for v in p)], dtype=np.int32).tobytes()
    return header + np.packbits(np.ascontiguousarray(grid, dtype=np.uint8)).tobytes()


def canonical_hash(grid: np.ndarray, points: tuple[Position, ...] = ()) -> str:
    """Hex digest of the smallest serialisation of (grid, points) over the 8 symmetries.

    `points` (e.g. start, goal) are transformed alongside the grid and kept in order.
    """
    best = min(_digest(g, p) for g, p in _d4(grid, points))
    return hashlib.blake2b(best, digest_size=16).hexdigest()


def layout_hash(grid: np.ndarray, start: Position, goal: Position) -> str:
    """The task's identity: walls, start and goal, up to symmetry."""
    return canonical_hash(grid, (start, goal))


def walls_hash(grid: np.ndarray) -> str:
    """The walls alone, up to symmetry (stricter: the same walls with another start/goal collide)."""
    return canonical_hash(grid, ())
