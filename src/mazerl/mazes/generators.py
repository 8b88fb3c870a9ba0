"""Maze generators on a grid of cells. All return the carved passages as a wall/floor grid.

Perfect mazes (one route between any two cells): Wilson (uniform spanning tree, VisGym's default),
randomized depth-first search (long corridors, few forks), Kruskal and Prim (many short dead ends).
`braided` starts from a Wilson maze and knocks out walls at dead ends, which creates loops.
Each uses only the `random.Random` it is given: same seed, same maze.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import lru_cache

import numpy as np

from .layout import MazeError

Edge = tuple[int, int]  # two flat cell ids, r * cols + c


@lru_cache(maxsize=64)
def _neighbours(rows: int, cols: int) -> tuple[tuple[int, ...], ...]:
    out = []
    for r in range(rows):
        for c in range(cols):
            nb = []
            if r > 0:
                nb.append((r - 1) * cols + c)
            if r < rows - 1:
                nb.append((r + 1) * cols + c)
            if c > 0:
                nb.append(r * cols + c - 1)
            if c < cols - 1:
                nb.append(r * cols + c + 1)
            out.append(tuple(nb))
    return tuple(out)


@lru_cache(maxsize=64)
def _all_edges(rows: int, cols: int) -> tuple[Edge, ...]:
    edges = []
    for r in range(rows):
        for c in range(cols):
            a = r * cols + c
            if c < cols - 1:
                edges.append((a, a + 1))
            if r < rows - 1:
                edges.append((a, a + cols))
    return tuple(edges)


def edges_to_grid(rows: int, cols: int, edges: list[Edge]) -> np.ndarray:
    """Grid of (2*rows+1, 2*cols+1): all walls, then every cell and every carved passage opened."""
    grid = np.ones((2 * rows + 1, 2 * cols + 1), dtype=np.uint8)
    grid[1::2, 1::2] = 0
    if edges:
        e = np.asarray(edges, dtype=np.int64)
        ra, ca = np.divmod(e[:, 0], cols)
        rb, cb = np.divmod(e[:, 1], cols)
        grid[ra + rb + 1, ca + cb + 1] = 0  # the square between cell a and cell b
    return grid


def wilson(rows: int, cols: int, rng: random.Random) -> list[Edge]:
    """Uniform spanning tree by loop-erased random walks (Wilson, 1996)."""
    nbrs = _neighbours(rows, cols)
    n = rows * cols
    in_tree = [False] * n
    in_tree[rng.randrange(n)] = True
    nxt = [-1] * n
    edges: list[Edge] = []
    order = list(range(n))
    rng.shuffle(order)
    choice = rng.choice
    for start in order:
        if in_tree[start]:
            continue
        u = start
        while not in_tree[u]:  # walk; overwriting nxt[u] erases loops
            v = choice(nbrs[u])
            nxt[u] = v
            u = v
        u = start
        while not in_tree[u]:
            in_tree[u] = True
            edges.append((u, nxt[u]))
            u = nxt[u]
    return edges


def dfs(rows: int, cols: int, rng: random.Random) -> list[Edge]:
    """Randomized depth-first search (recursive backtracker), iterative."""
    nbrs = _neighbours(rows, cols)
    n = rows * cols
    seen = [False] * n
    start = rng.randrange(n)
    seen[start] = True
    stack = [start]
    edges: list[Edge] = []
    while stack:
        u = stack[-1]
        options = [v for v in nbrs[u] if not seen[v]]
        if not options:
            stack.pop()
            continue
        v = rng.choice(options)
        seen[v] = True
        edges.append((u, v))
        stack.append(v)
    return edges


def kruskal(rows: int, cols: int, rng: random.Random) -> list[Edge]:
    """Randomized Kruskal: shuffle every wall, open it when it joins two separate regions."""
    parent = list(range(rows * cols))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    candidates = list(_all_edges(rows, cols))
    rng.shuffle(candidates)
    edges: list[Edge] = []
    target = rows * cols - 1
    for a, b in candidates:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb
            edges.append((a, b))
            if len(edges) == target:
                break
    return edges


def prim(rows: int, cols: int, rng: random.Random) -> list[Edge]:
    """Randomized Prim: grow one region, opening a random wall on its frontier each step."""
    nbrs = _neighbours(rows, cols)
    n = rows * cols
    in_tree = [False] * n
    start = rng.randrange(n)
    in_tree[start] = True
    frontier = [(start, v) for v in nbrs[start]]
    edges: list[Edge] = []
    while frontier:
        i = rng.randrange(len(frontier))
        frontier[i], frontier[-1] = frontier[-1], frontier[i]
        a, b = frontier.pop()
        if in_tree[b]:
            continue
        in_tree[b] = True
        edges.append((a, b))
        frontier.extend((b, v) for v in nbrs[b] if not in_tree[v])
    return edges


def braided(rows: int, cols: int, rng: random.Random, braid: float = 0.5) -> list[Edge]:
    """A Wilson maze with a fraction `braid` of its dead ends opened into a neighbour (loops)."""
    if not 0.0 <= braid <= 1.0:
        raise MazeError(f"braid fraction {braid} must be in [0, 1]")
    edges = wilson(rows, cols, rng)
    nbrs = _neighbours(rows, cols)
    linked = [set() for _ in range(rows * cols)]
    for a, b in edges:
        linked[a].add(b)
        linked[b].add(a)
    dead_ends = [u for u in range(rows * cols) if len(linked[u]) == 1]
    rng.shuffle(dead_ends)
    for u in dead_ends:
        if len(linked[u]) != 1 or rng.random() >= braid:
            continue  # an earlier opening already fixed this one, or we keep it
        closed = [v for v in nbrs[u] if v not in linked[u]]
        if not closed:
            continue
        # Prefer joining two dead ends: removes two at once, as braiding usually does.
        preferred = [v for v in closed if len(linked[v]) == 1]
        v = rng.choice(preferred or closed)
        linked[u].add(v)
        linked[v].add(u)
        edges.append((u, v))
    return edges


GENERATORS: dict[str, Callable[[int, int, random.Random], list[Edge]]] = {
    "wilson": wilson,
    "dfs": dfs,
    "kruskal": kruskal,
    "prim": prim,
    "braided": braided,
}
PERFECT_ALGORITHMS = frozenset({"wilson", "dfs", "kruskal", "prim"})


def generate_grid(algorithm: str, rows: int, cols: int, rng: random.Random) -> np.ndarray:
    try:
        gen = GENERATORS[algorithm]
    except KeyError:
        raise MazeError(
            f"unknown maze algorithm {algorithm!r}: allowed {', '.join(sorted(GENERATORS))}"
        ) from None
    return edges_to_grid(rows, cols, gen(rows, cols, rng))
