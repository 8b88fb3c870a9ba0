"""Data-parallel training ranks: FSDP2 sharding of a policy and the process group around it."""
