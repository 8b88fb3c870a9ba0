"""Adapters that let other RL frameworks play mazerl's mazes; each needs its own optional extra."""
