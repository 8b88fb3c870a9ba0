"""A process group of N ranks on this machine (gloo on CPU, NCCL on GPU), started with torch's own
multiprocessing: what tests and a single-node run use; Ray actors set the same environment."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, backend: str, fn: Callable, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_group(world_size: int, fn: Callable, *args, backend: str | None = None) -> None:
    """Run `fn(rank, world_size, *args)` in `world_size` fresh processes joined in one process group;
    raises if any rank fails. `fn` must be importable (a module-level function)."""
    if world_size < 1:
        raise ValueError(f"world size {world_size}: must be >= 1")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    mp.spawn(_rank_main, args=(world_size, free_port(), backend, fn, args), nprocs=world_size, join=True)
