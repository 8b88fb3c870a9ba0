"""FSDP2 (`fully_shard`) for a Qwen-VL policy, and the full state dict for weight sync and serving.

Units: every text decoder layer and every vision block, then the backbone (`model.model`: embeddings,
norms, the vision tower's patch embedding and merger) and the LM head each on their own, then the
root. The trainer's log-probabilities call the backbone and the head directly (to project only the
loss positions), so those two must be FSDP units themselves: calling them then gathers their
parameters, which a root-only unit would not do.

Mixed precision: the trained parameters are float32 master weights, sharded (with their gradients and
AdamW state); FSDP2 gathers them in the policy's compute dtype (bf16) and reduces gradients in float32.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def shard_policy(model, mesh=None, param_dtype: torch.dtype | None = None):
    """Shard `model` in place across the default process group (or `mesh`). `param_dtype`: the dtype the
    parameters are gathered and computed in (bf16 on GPU); the shards a policy trains stay float32 master
    weights, so gradients (reduced in float32) and AdamW's state are float32 too. `param_dtype_for` gives
    the dtype for a config."""
    trained_low = sorted({str(p.dtype) for p in model.parameters() if p.requires_grad and p.dtype != torch.float32})
    if trained_low:
        # FSDP2 keeps the dtype it is given as the sharded master copy: an lr-1e-6 update would round away
        raise ValueError(f"shard_policy: trained parameters in {', '.join(trained_low)}; open the policy for training "
                         "(open_policy(for_training=True): float32 masters) and pass the compute dtype as param_dtype")
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


def param_dtype_for(policy_dtype: str) -> torch.dtype | None:
    """FSDP2's param_dtype for a PolicyConfig dtype: None (no cast) for float32, else that dtype."""
    return None if policy_dtype == "float32" else getattr(torch, policy_dtype)


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The unsharded weights on CPU, with the plain (unsharded) parameter names. A collective: every
    rank must call it; every rank gets the tensors."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=False))
