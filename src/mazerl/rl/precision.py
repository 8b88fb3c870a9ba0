"""Mixed precision for GRPO: the context its rollouts and updates run in (GRPOConfig.autocast)."""

from __future__ import annotations

import contextlib

import torch


def mixed_precision(autocast: str, device: str) -> contextlib.AbstractContextManager:
    """torch.autocast in `autocast`'s dtype on `device`'s kind ("cpu", "cuda:0" -> "cuda"), or nothing
    for "off". Weights, and so gradients and optimizer state, stay in their own dtype; a backward pass
    follows the dtypes its forward chose, so only the forward needs to run inside."""
    if autocast == "off":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=getattr(torch, autocast))


def cpu_lacks_bf16(cpuinfo: str | None = None) -> bool:
    """True on an x86 Linux CPU whose flags (/proc/cpuinfo) show neither avx512_bf16 nor amx_bf16: torch
    then emulates bf16 products, and autocast can be slower than float32. False where it cannot tell."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    if flags is None or "avx2" not in flags:  # not an x86 flag list (e.g. ARM's "Features"): cannot tell
        return False
    return "avx512_bf16" not in flags and "amx_bf16" not in flags


def warn_if_slow(autocast: str, device: str, log) -> None:
    """Say so when autocast bfloat16 is asked for on a CPU without bf16 instructions (it still runs)."""
    if autocast == "bfloat16" and torch.device(device).type == "cpu" and cpu_lacks_bf16():
        log.warning("autocast bfloat16 on a CPU without bf16 instructions (no avx512_bf16 or amx_bf16 in "
                    "/proc/cpuinfo): torch emulates them, and steps may be slower than in float32; set autocast: off "
                    "if they are")
