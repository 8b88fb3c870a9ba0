"""Weight sync from the training ranks to the rollout engines, in buckets, with neither the driver nor a
disk in the data path.

Two transports, both fed by `TrainRank.sync_weights` one bucket at a time (the ranks gather each
bucket of parameters with a collective, so no process ever holds the whole state dict at once beyond
what the engine itself holds):

- direct (colocated placement): every rank has the full bucket after the gather, so rank k hands it to
  its own rollout actor k as a Ray call argument. On CPU the bytes go through the node's shared-memory
  object store, rank to actor; the driver only sees the byte counts. (On GPU the same host copy is used
  today; passing CUDA IPC handles of the gathered bucket instead would let the actor load straight from
  the rank's GPU memory: not implemented, see `TrainRank.sync_weights`.)
- broadcast (split placement): `WeightBroadcastGroup`, a process group of its own between the trainer's
  rank 0 and every rollout actor, NCCL on GPU (GPU to GPU) and gloo on CPU. The training ranks already
  have their default process group, so this one is built directly on a TCPStore (rank 0 of this group
  hosts it, on the trainer's rank-0 node) and the backend's own ProcessGroup class, never through
  `init_process_group`.

Both sides agree on the layout first: names, shapes and dtypes of every weight the engine serves
(plain Hugging Face keys, LoRA merged). The broadcast sends its digest and every member votes, so a
mismatch stops sender and receivers alike before a single weight is loaded into the wrong slot.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import UserError

Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]
Bucket = list[tuple[str, torch.Tensor]]

_ALIGN = 16  # each tensor starts at a multiple of this in a packed bucket, so any dtype can view it


class WeightSyncError(UserError):
    """Sender and receiver disagree on what the weights are, or a sync did not deliver every weight once."""


def layout_of(weights: dict[str, torch.Tensor] | Bucket) -> Layout:
    items = weights.items() if isinstance(weights, dict) else weights
    return {k: (tuple(v.shape), v.dtype) for k, v in items}


def layout_digest(spec: Layout) -> torch.Tensor:
    """Names, shapes and dtypes -> 8 int64s (a sha256), broadcast so both sides can compare."""
    text = "\n".join(f"{k}:{tuple(s)}:{d}" for k, (s, d) in sorted(spec.items()))
    raw = hashlib.sha256(text.encode()).digest()
    return torch.tensor([int.from_bytes(raw[i:i + 4], "little") for i in range(0, 32, 4)], dtype=torch.int64)


def layout_difference(expected: Layout, got: Layout, limit: int = 3) -> str:
    """What differs between two layouts, in words (the first few names of each kind)."""
    missing = sorted(set(expected) - set(got))
    unknown = sorted(set(got) - set(expected))
    changed = sorted(k for k in set(expected) & set(got) if tuple(expected[k][0]) != tuple(got[k][0]) or expected[k][1] != got[k][1])
    parts = []
    for what, names in (("missing", missing), ("unknown", unknown), ("other shape or dtype", changed)):
        if names:
            shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
            parts.append(f"{len(names)} {what} ({shown})")
    return "; ".join(parts) or "none"


def weights_digest(items: Iterable[tuple[str, torch.Tensor]]) -> str:
    """A sha256 of names, shapes, dtypes and bytes, in name order: equal digests, bit-identical weights."""
    h = hashlib.sha256()
    for name, t in sorted(items, key=lambda kv: kv[0]):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def bucket_bytes(bucket: Bucket) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)


def module_groups(names: Iterable[str]) -> list[list[str]]:
    """State-dict names grouped by the module they belong to, in first-seen order. A LoRA layer's
    `base_layer.*`, `lora_A.*` and `lora_B.*` are one group, so a bucket never splits what
    `serving_weights` merges into one weight."""
    groups: dict[str, list[str]] = {}
    for name in names:
        module = name.rpartition(".")[0]
        for marker in (".base_layer.", ".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B."):
            if marker in name:
                module = name.split(marker)[0]
                break
        groups.setdefault(module, []).append(name)
    return list(groups.values())


def plan_buckets(sizes: dict[str, int], limit_bytes: int) -> list[list[str]]:
    """Names (state-dict order, module groups kept whole) packed into buckets of at most `limit_bytes`;
    a group larger than that goes alone."""
    buckets: list[list[str]] = []
    current: list[str] = []
    used = 0
    for group in module_groups(sizes):
        size = sum(sizes[n] for n in group)
        if current and used + size > limit_bytes:
            buckets.append(current)
            current, used = [], 0
        current += group
        used += size
    if current:
        buckets.append(current)
    return buckets


def _offsets(layout: Layout, names: list[str]) -> tuple[list[int], int]:
    offsets, at = [], 0
    for n in names:
        shape, dtype = layout[n]
        offsets.append(at)
        numel = 1
        for s in shape:
            numel *= s
        at += -(-numel * torch.empty((), dtype=dtype).element_size() // _ALIGN) * _ALIGN
    return offsets, at


class WeightBroadcastGroup:
    """Group rank 0 sends (`send_begin`, `send_bucket`..., `send_end`); ranks 1..N receive
    (`receive_begin`, then `receive_buckets` yields each bucket as it arrives)."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, backend: str = "gloo", timeout_s: float = 600.0):
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"unknown weight-sync backend {backend!r}: allowed gloo, nccl")
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        store = dist.TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timedelta(seconds=timeout_s))
        prefixed = dist.PrefixStore("mazerl-weights", store)
        if backend == "nccl":
            self.group = dist.ProcessGroupNCCL(prefixed, rank, world_size)
        else:
            self.group = dist.ProcessGroupGloo(prefixed, rank, world_size, timedelta(seconds=timeout_s))
        self._layout: Layout | None = None
        self._names: list[str] = []

    def _broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([tensor], opts).wait()

    def _agree(self, layout: Layout) -> None:
        """Rank 0's layout digest to all, then every member's vote (a MIN all-reduce): all go on, or all stop."""
        mine = layout_digest(layout).to(self.device)
        theirs = mine.clone() if self.rank == 0 else torch.zeros_like(mine)
        self._broadcast(theirs)
        vote = torch.tensor([int(torch.equal(mine, theirs))], dtype=torch.int64, device=self.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        self.group.allreduce([vote], opts).wait()
        if int(vote.item()) != 1:
            raise WeightSyncError("the trainer's weights and a rollout engine's model differ in names, shapes or dtypes "
                                  "(another model, or LoRA settings not applied the same way): nothing was loaded")
        self._layout, self._names = layout, sorted(layout)

    # ---- the sender (group rank 0) -----------------------------------------------------------------
    def send_begin(self, layout: Layout) -> None:
        if self.rank != 0:
            raise WeightSyncError("only group rank 0 (the trainer) sends weights")
        self._agree(layout)
        self._index = {n: i for i, n in enumerate(self._names)}

    def send_bucket(self, bucket: Bucket) -> int:
        """One bucket as one packed buffer (after a header: its size and which names it holds); returns bytes sent."""
        assert self._layout is not None, "send_begin first"
        names = [n for n, _ in bucket]
        offsets, total = _offsets(self._layout, names)
        buffer = torch.empty(total, dtype=torch.uint8, device=self.device)
        for (name, t), at in zip(bucket, offsets):
            if (tuple(t.shape), t.dtype) != tuple(self._layout[name]):
                raise WeightSyncError(f"weight {name}: {tuple(t.shape)} {t.dtype}, the agreed layout says "
                                      f"{self._layout[name][0]} {self._layout[name][1]}")
            flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
            buffer[at:at + flat.numel()].copy_(flat)
        self._broadcast(torch.tensor([len(names), total], dtype=torch.int64, device=self.device))
        self._broadcast(torch.tensor([self._index[n] for n in names], dtype=torch.int64, device=self.device))
        self._broadcast(buffer)
        return total

    def send_end(self) -> None:
        self._broadcast(torch.zeros(2, dtype=torch.int64, device=self.device))
        self._layout = None

    def send(self, weights: dict[str, torch.Tensor]) -> int:
        """All of `weights` as one bucket; returns the bytes sent."""
        self.send_begin(layout_of(weights))
        sent = self.send_bucket(list(weights.items()))
        self.send_end()
        return sent

    # ---- the receivers (group ranks 1..N) ----------------------------------------------------------
    def receive_begin(self, layout: Layout) -> None:
        """Agree on `layout` (what the receiver's engine serves) with the sender; a mismatch raises on all members."""
        if self.rank == 0:
            raise WeightSyncError("group rank 0 sends; ranks 1..N receive")
        self._agree(layout)

    def receive_buckets(self) -> Iterator[Bucket]:
        """Each bucket as it arrives: (name, tensor) views into its buffer, on this group's device."""
        assert self._layout is not None, "receive_begin first"
        while True:
            header = torch.zeros(2, dtype=torch.int64, device=self.device)
            self._broadcast(header)
            count, total = (int(x) for x in header.tolist())
            if count == 0:
                self._layout = None
                return
            index = torch.zeros(count, dtype=torch.int64, device=self.device)
            self._broadcast(index)
            names = [self._names[i] for i in index.tolist()]
            offsets, expected = _offsets(self._layout, names)
            if expected != total:
                raise WeightSyncError(f"a bucket of {total} bytes where its names need {expected}")
            buffer = torch.empty(total, dtype=torch.uint8, device=self.device)
            self._broadcast(buffer)
            bucket = []
            for name, at in zip(names, offsets):
                shape, dtype = self._layout[name]
                nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
                bucket.append((name, buffer[at:at + nbytes].view(dtype).view(shape)))
            yield bucket

    def receive(self, spec: Layout) -> dict[str, torch.Tensor]:
        """Everything the sender sends, as one dict (shaped like `spec`)."""
        self.receive_begin(spec)
        return {name: t for bucket in self.receive_buckets() for name, t in bucket}
