"""FSDP2 (`fully_shard`) for a Qwen-VL policy, and the full state dict for weight sync and serving.

Units: every text decoder layer and every vision block, then the backbone (`model.model`: embeddings,
norms, the vision tower's patch embedding and merger) and the LM head each on their own, then the
root. The trainer's log-probabilities call the backbone and the head directly (to project only the
loss positions), so those two must be FSDP units themselves: calling them then gathers their
parameters, which a root-only unit would not do.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def shard_policy(model, mesh=None, param_dtype: torch.dtype | None = None):
    """Shard `model` in place across the default process group (or `mesh`). `param_dtype`: compute
    dtype for the gathered parameters (bf16 on GPU); gradients are reduced in fp32."""
    base = _base(model)
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else MixedPrecisionPolicy()
    kwargs = {"mesh": mesh, "mp_policy": mp}
    backbone = base.model
    for layer in backbone.language_model.layers:
        fully_shard(layer, **kwargs)
    visual = getattr(backbone, "visual", None)
    for block in getattr(visual, "blocks", []) if visual is not None else []:
        fully_shard(block, **kwargs)
    fully_shard(backbone, **kwargs)
    fully_shard(base.lm_head, **kwargs)
    fully_shard(model, **kwargs)
    return model


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The unsharded weights on CPU, with the plain (unsharded) parameter names. A collective: every
    rank must call it; every rank gets the tensors."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=False))
