"""Bookkeeping of an incremental weight load into an engine (`begin_weight_sync`, `load_weight_bucket`
..., `finish_weight_sync`): every weight of the engine's layout arrives exactly once, in its shape and
dtype, or the sync is an error. Until a sync finishes the engine refuses to generate, so a half-synced
engine is never served silently."""

from __future__ import annotations

import torch

from ..distributed.weight_sync import Bucket, Layout, WeightSyncError, layout_difference


class IncrementalLoad:
    """One engine's view of a sync in progress."""

    def __init__(self, layout: Layout):
        self.layout = layout  # what the engine serves: plain Hugging Face names, shapes, dtypes
        self.loaded: set[str] | None = None  # None: no sync in progress
        self.bytes = 0
        self.buckets = 0
        self.broken: str | None = None  # why the served weights are not whole (a sync that failed midway)

    def begin(self, layout: Layout | None) -> None:
        """Start a sync; `layout` (the sender's) must be the engine's own."""
        if layout is not None and dict(layout) != self.layout:
            raise WeightSyncError("the trainer's weights and this engine's model differ: "
                                  f"{layout_difference(self.layout, dict(layout))}; nothing was loaded")
        self.loaded, self.bytes, self.buckets = set(), 0, 0

    def check(self, bucket: Bucket) -> None:
        """A bucket about to be loaded: known names, each for the first time, in the engine's shapes and dtypes."""
        if self.loaded is None:
            raise WeightSyncError("load_weight_bucket before begin_weight_sync")
        seen = set()
        for name, tensor in bucket:
            if name not in self.layout:
                raise self.fail(f"weight {name!r} is not one this engine serves")
            if name in self.loaded or name in seen:
                raise self.fail(f"weight {name!r} arrived twice in one sync")
            shape, dtype = self.layout[name]
            if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
                raise self.fail(f"weight {name!r} is {tuple(tensor.shape)} {tensor.dtype}; this engine serves "
                                f"{tuple(shape)} {dtype}")
            seen.add(name)

    def loaded_bucket(self, bucket: Bucket) -> int:
        self.loaded.update(n for n, _ in bucket)
        size = sum(t.numel() * t.element_size() for _, t in bucket)
        self.bytes += size
        self.buckets += 1
        return size

    def finish(self) -> None:
        if self.loaded is None:
            raise WeightSyncError("finish_weight_sync before begin_weight_sync")
        missing = sorted(set(self.layout) - self.loaded)
        if missing:
            raise self.fail(f"{len(missing)} weights never arrived ({', '.join(missing[:3])}"
                            f"{' ...' if len(missing) > 3 else ''})")
        self.loaded, self.broken = None, None

    def fail(self, why: str) -> WeightSyncError:
        """The sync stops here: what was loaded stays, so the engine is marked not servable until a whole sync."""
        self.broken = why
        self.loaded = None
        return WeightSyncError(f"weight sync refused: {why}; the engine serves nothing until a complete sync")

    def check_servable(self) -> None:
        if self.broken is not None:
            raise WeightSyncError(f"this engine's weights are incomplete (the last sync failed: {self.broken}); "
                                  "a complete sync must come first")
        if self.loaded is not None:
            raise WeightSyncError("a weight sync is in progress (begin_weight_sync without finish_weight_sync): "
                                  "the engine would serve a mix of old and new weights")


def float_layout(layout: Layout, dtype: torch.dtype) -> Layout:
    """`layout` with its floating-point entries in `dtype` (what an engine serving in `dtype` holds)."""
    return {k: (tuple(s), dtype if d.is_floating_point else d) for k, (s, d) in layout.items()}
