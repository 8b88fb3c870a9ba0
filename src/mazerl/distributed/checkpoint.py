"""Sharded checkpoints with torch.distributed.checkpoint (DCP), complete or invisible.

Layout of `ROOT/step-00000010/`:
  dcp/             model and optimizer state, each rank writing its own shards (DCP's format)
  rank-00000.pt    per rank: LR scheduler state and torch RNG (weights_only loadable)
  state.json       step, world size, and the driver's state (data sampler, seeds)
  manifest.json    sha256 of every file above, written last (rl/checkpoint.verify reads it)
Every rank writes into a temporary sibling; after a barrier rank 0 writes state.json and the
manifest and renames the directory into place. DCP reshards on load, so a checkpoint written by N
ranks resumes on M ranks (1 <-> 2 tested); with the same number of ranks the resume is bit-identical.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ..atomic import write_json
from ..integrity import manifest_of
from ..rl.checkpoint import MANIFEST, CheckpointMismatchError, verify

STATE = "state.json"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def save_sharded(target: str | Path, model, optimizer, scheduler, state: dict, rank: int = 0, world_size: int = 1) -> Path:
    """Collective: every rank calls it with the same `target`. Returns the final directory."""
    target = Path(target)
    tmp = target.parent / f".{target.name}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    try:
        sharded = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
        dcp.save(sharded, checkpoint_id=str(tmp / "dcp"), no_dist=not _distributed())
        torch.save({"scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state()}, tmp / _rank_file(rank))
        _barrier()  # every shard is on disk before the manifest says the checkpoint exists
        if rank == 0:
            write_json(tmp / STATE, {**state, "world_size": world_size})
            write_json(tmp / MANIFEST, {"step": state.get("step"), "files": manifest_of(tmp, MANIFEST)})
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
    except BaseException:  # a failed write or an interrupt (Ctrl-C, SIGTERM) leaves no half-written folder
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    _barrier()
    return target


def load_sharded(path: str | Path, model, optimizer, scheduler, rank: int = 0, world_size: int = 1) -> dict:
    """Collective: load a (verified) sharded checkpoint into this rank's model, optimizer and
    scheduler; the RNG state is restored when the number of ranks is unchanged. Returns state.json."""
    path = Path(path)
    problem = verify(path)
    if problem is not None:
        raise CheckpointMismatchError(f"checkpoint {path} cannot be trusted: {problem}")
    state = json.loads((path / STATE).read_text())
    model_state = {"model": get_model_state_dict(model)}
    optim_state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    try:
        # every weight must be in the checkpoint; optimizer state need not be: AdamW keeps none for a
        # parameter that never had a gradient (e.g. deepstack mergers past a shallow decoder's depth),
        # so such a parameter keeps what this optimizer holds for it (none, or zeros it never uses)
        dcp.load(model_state, checkpoint_id=str(path / "dcp"), no_dist=not _distributed())
        dcp.load(optim_state, checkpoint_id=str(path / "dcp"), no_dist=not _distributed(),
                 planner=DefaultLoadPlanner(allow_partial_load=True))
    except (RuntimeError, KeyError, ValueError) as err:
        raise CheckpointMismatchError(f"checkpoint {path} does not fit this model: {str(err).splitlines()[0]}") from None
    set_model_state_dict(model, model_state["model"])
    set_optimizer_state_dict(model, optimizer, optim_state["optimizer"], options=StateDictOptions(strict=False))
    same_world = state["world_size"] == world_size
    local = torch.load(path / _rank_file(rank if same_world else 0), weights_only=True)
    scheduler.load_state_dict(local["scheduler"])
    if same_world:
        torch.set_rng_state(local["torch_rng"])
    return state
