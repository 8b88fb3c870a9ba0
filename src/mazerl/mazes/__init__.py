"""Mazes: layouts, generators, solver, canonical hashes, renderer, dataset splits and their parquet I/O."""

from .layout import MOVES, SIZE_PRESETS, Maze, MazeError, parse_size
from .sampling import sample_maze

__all__ = ["MOVES", "SIZE_PRESETS", "Maze", "MazeError", "parse_size", "sample_maze"]
