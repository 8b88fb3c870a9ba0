"""Giving back what a training rank's allocators cache between the phases of a step, and a per-actor log of
those phases, so that a colocated engine waking next finds the memory its share counts on (cluster/plan.py
derives that share from what the rank holds beside it, not from what its allocator keeps)."""

from __future__ import annotations

import gc
import time
from collections import deque

import torch


def release_cached_memory(optimizer=None) -> dict:
    """Drop `optimizer`'s gradients (set to None: the next update starts with zero_grad anyway), collect
    reference cycles (they keep tensors alive), then hand the CUDA caching allocator's free blocks back to the
    driver. Returns how many gradients were dropped, and CUDA's reserved bytes before and after and the bytes
    still allocated (None without CUDA)."""
    dropped = 0
    if optimizer is not None:
        dropped = sum(p.grad is not None for group in optimizer.param_groups for p in group["params"])
        optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {"gradients_dropped": dropped, "reserved_before": None, "reserved_after": None, "allocated": None}
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    return {"gradients_dropped": dropped, "reserved_before": before, "reserved_after": torch.cuda.memory_reserved(),
            "allocated": torch.cuda.memory_allocated()}


class PhaseLog:
    """What an actor did, in order, with CLOCK_MONOTONIC times (one clock for every process of a node, so the
    logs of a node's actors merge into one timeline). Bounded: the latest `limit` events."""

    def __init__(self, actor: str, limit: int = 4096):
        self.actor = actor
        self._events: deque[dict] = deque(maxlen=limit)

    def record(self, event: str, **details) -> None:
        self._events.append({"t_ns": time.monotonic_ns(), "actor": self.actor, "event": event, **details})

    def events(self) -> list[dict]:
        return list(self._events)
