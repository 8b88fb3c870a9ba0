"""mazerl's training metrics in Prometheus format, through Ray's own metrics export.

The Ray driver sets one `ray.util.metrics.Gauge` per headline metric after every step; Ray's metrics
agent serves them beside Ray's own metrics on each node's `metrics-export-port` (the RayJob sets
it; env/monitoring holds the scrape config and a Grafana dashboard). Names are `mazerl_<metric>`
(Ray prefixes `ray_`), tagged with the run.
"""

from __future__ import annotations

import math
import re

# metric key in a step record -> what it measures
EXPORTED = {
    "reward_mean": "mean episode reward of the step's rollouts",
    "success_rate": "share of the step's episodes that reached the goal",
    "episode_turns": "mean turns per episode",
    "parse_failure_rate": "share of replies that were not a valid move",
    "loop_rate": "share of episodes that revisited a state in a loop",
    "entropy": "mean token entropy of the update",
    "kl": "mean KL to the reference policy",
    "rollout_tokens_per_s": "rollout context tokens per second",
    "train_tokens_per_s": "tokens trained on per second",
    "time/rollout": "seconds of the step spent in rollouts",
    "time/update": "seconds of the step spent in the update",
    "time/weight_sync": "seconds of the step spent syncing weights to the engines",
    "weights_lag": "updates between the weights that sampled and the weights trained",
    "step": "GRPO steps done",
}
_PER_RANK = re.compile(r"^gpu_memory_gb/rank(\d+)$")


def metric_name(key: str) -> str:
    return "mazerl_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


class TrainingGauges:
    """Gauges for one run; `update(record)` after each step."""

    def __init__(self, run: str):
        from ray.util.metrics import Gauge

        self.tags = {"run": run}
        self.gauges = {key: Gauge(metric_name(key), description=desc, tag_keys=("run",)) for key, desc in EXPORTED.items()}
        self.gpu_memory = Gauge("mazerl_gpu_memory_gb", description="peak GPU memory of a training rank (GiB)",
                                tag_keys=("run", "rank"))

    def update(self, record: dict) -> None:
        for key, gauge in self.gauges.items():
            value = record.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                gauge.set(float(value), tags=self.tags)
        for key, value in record.items():
            m = _PER_RANK.match(key)
            if m and isinstance(value, (int, float)) and math.isfinite(value):
                self.gpu_memory.set(float(value), tags={**self.tags, "rank": m.group(1)})
