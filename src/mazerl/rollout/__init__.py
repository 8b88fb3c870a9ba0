"""Inference engines and the batched multi-turn rollout loop."""
