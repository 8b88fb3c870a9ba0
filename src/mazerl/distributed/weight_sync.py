"""Weight sync by broadcast: a process group of its own between the trainer's rank 0 and every
rollout actor, NCCL on GPU (GPU to GPU, no host copies through Ray's object store) and gloo on CPU.

The training ranks already have their default process group, so this one is built directly on a
TCPStore (rank 0 of this group hosts it, on the trainer's rank-0 node) and the backend's own
ProcessGroup class, never through `init_process_group`. Tensors go in the sorted order of their
names; the receivers first check that both sides hold the same names, shapes and dtypes (a hash
broadcast before the weights), so a mismatch is an error, never weights loaded into the wrong slots.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

import torch
import torch.distributed as dist


class WeightSyncError(RuntimeError):
    """Sender and receiver disagree on what the weights are."""


def layout_digest(spec: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> torch.Tensor:
    """Names, shapes and dtypes -> 8 int64s (a sha256), broadcast so both sides can compare."""
    text = "\n".join(f"{k}:{tuple(s)}:{d}" for k, (s, d) in sorted(spec.items()))
    raw = hashlib.sha256(text.encode()).digest()
    return torch.tensor([int.from_bytes(raw[i:i + 4], "little") for i in range(0, 32, 4)], dtype=torch.int64)


class WeightBroadcastGroup:
    """Group rank 0 sends (`send`); ranks 1..N receive (`receive`)."""

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

    def _broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([tensor], opts).wait()

    def send(self, weights: dict[str, torch.Tensor]) -> int:
        """Broadcast every tensor (group rank 0); returns the bytes sent."""
        if self.rank != 0:
            raise WeightSyncError("only group rank 0 (the trainer) sends weights")
        spec = {k: (tuple(v.shape), v.dtype) for k, v in weights.items()}
        self._broadcast(layout_digest(spec).to(self.device))
        sent = 0
        for name in sorted(weights):
            tensor = weights[name].detach().to(self.device).contiguous()
            self._broadcast(tensor)
            sent += tensor.numel() * tensor.element_size()
        return sent

    def receive(self, spec: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> dict[str, torch.Tensor]:
        """Receive tensors of the given names, shapes and dtypes (what the receiver's model holds)."""
        mine = layout_digest(spec).to(self.device)
        theirs = torch.zeros_like(mine)
        self._broadcast(theirs)
        if not torch.equal(mine, theirs):
            raise WeightSyncError("the trainer's weights and this engine's model differ in names, shapes or dtypes "
                                  "(another model, or LoRA settings not applied the same way)")
        out = {}
        for name in sorted(spec):
            shape, dtype = spec[name]
            tensor = torch.empty(shape, dtype=dtype, device=self.device)
            self._broadcast(tensor)
            out[name] = tensor
        return out
