"""Sharded checkpoints with torch.distributed.checkpoint (DCP), complete or invisible.

Layout of `ROOT/step-00000010/`:
  dcp/             model and optimizer state, each rank writing its own shards (DCP's format)
  rank-00000.pt    per rank: LR scheduler state and torch RNG (weights_only loadable)
  state.json       step, world size, and the driver's state (data sampler, seeds)
  manifest.json    sha256 of every file above, written last (integrity.verify reads it)
Every rank writes into a temporary sibling and hashes the files it wrote (its DCP shard, its
rank-R.pt), all ranks at once; rank 0 gathers the hashes, adds state.json's and DCP's metadata's,
writes the manifest and renames the directory into place. No rank reads another's shard: at 8B the
checkpoint is 50-100 GB, and one rank hashing it all kept the others waiting in a collective (the
NCCL watchdog's 10 minutes). On load the checkpoint is verified once, by one process: the Ray driver
does it when it picks the checkpoint (rl.trainer.start_point), and the ranks then load with
`verified=True`. DCP reshards on load, so a checkpoint written by N ranks resumes on M ranks
(1 <-> 2 tested); with the same number of ranks the resume is bit-identical.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ..atomic import write_json
from ..integrity import MANIFEST, folder_files, hash_files, verify
from ..rl.checkpoint import CheckpointMismatchError

STATE = "state.json"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


class _RecordingWriter(FileSystemWriter):
    """DCP's own file writer, noting which files this rank wrote: exactly the ones this rank hashes."""

    _written = None

    def write_data(self, plan, planner):
        self._written = super().write_data(plan, planner)
        return self._written

    def files(self) -> list[str]:
        if self._written is None:
            return []
        self._written.wait()
        return sorted({result.storage_data.relative_path for result in self._written.value()})


def _gather_on_rank0(obj):
    """Every rank's `obj` on rank 0 (a list in rank order), None elsewhere: a collective."""
    if not _distributed():
        return [obj]
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


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
        writer = _RecordingWriter(str(tmp / "dcp"))
        dcp.save(sharded, checkpoint_id=str(tmp / "dcp"), storage_writer=writer, no_dist=not _distributed())
        torch.save({"scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state()}, tmp / _rank_file(rank))
        # this rank hashes what it wrote while the others hash theirs; the gather on rank 0 also waits
        # until every rank's files are on disk, before the manifest says the checkpoint exists
        own = hash_files(tmp, [f"dcp/{name}" for name in writer.files()] + [_rank_file(rank)])
        gathered = _gather_on_rank0(own)
        if rank == 0:
            write_json(tmp / STATE, {**state, "world_size": world_size})
            files = {rel: digest for hashes in gathered for rel, digest in hashes.items()}
            # what no rank claimed: state.json and DCP's metadata, small files rank 0 wrote itself
            files.update(hash_files(tmp, sorted(set(folder_files(tmp, MANIFEST)) - set(files))))
            write_json(tmp / MANIFEST, {"step": state.get("step"), "files": dict(sorted(files.items()))})
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
    except BaseException:  # a failed write or an interrupt (Ctrl-C, SIGTERM) leaves no half-written folder
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    _barrier()
    return target


def load_sharded(path: str | Path, model, optimizer, scheduler, rank: int = 0, world_size: int = 1,
                 verified: bool = False) -> dict:
    """Collective: load a (verified) sharded checkpoint into this rank's model, optimizer and
    scheduler; the RNG state is restored when the number of ranks is unchanged. Returns state.json.
    `verified`: one process has just checked every file against the manifest (the Ray driver, before
    any rank loads), so this rank only checks that the folder holds the listed files: N ranks each
    re-hashing the whole checkpoint would read it N more times."""
    path = Path(path)
    problem = verify(path, hashes_checked=verified)
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
