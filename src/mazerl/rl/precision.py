"""Mixed precision for GRPO: the context its rollouts and updates run in (GRPOConfig.autocast)."""

from __future__ import annotations

import contextlib
import functools

import torch


def cpu_bf16_support(cpuinfo: str | None = None) -> bool | None:
    """Whether this Linux CPU multiplies in bf16 natively, from /proc/cpuinfo: x86 avx512_bf16 or amx_bf16,
    ARM's bf16 feature. None where it cannot tell (no cpuinfo, an unknown format)."""
    if cpuinfo is None:
        return _this_cpu_bf16_support()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key, flags = key.strip(), value.split()
        if key == "flags":  # x86
            return "avx512_bf16" in flags or "amx_bf16" in flags
        if key == "Features":  # aarch64
            return "bf16" in flags
    return None


@functools.lru_cache(maxsize=1)
def _this_cpu_bf16_support() -> bool | None:
    """This machine's answer, read once (mixed_precision asks on every forward pass)."""
    try:
        with open("/proc/cpuinfo") as f:
            return cpu_bf16_support(f.read())
    except OSError:
        return None


def cpu_lacks_bf16(cpuinfo: str | None = None) -> bool:
    """True only where the CPU is known to lack bf16 instructions: torch then emulates bf16 products, and
    autocast is far slower than float32 (~20-25x for the tiny model's update on an avx2-only EPYC)."""
    return cpu_bf16_support(cpuinfo) is False


def resolve_autocast(autocast: str, device: str, cpuinfo: str | None = None) -> str:
    """"auto" -> "bfloat16" where the device has bf16 arithmetic (a CUDA GPU that supports it, a CPU with
    bf16 instructions), else "off"; "off" and "bfloat16" are returned as they are."""
    if autocast != "auto":
        return autocast
    kind = torch.device(device).type
    if kind == "cuda":
        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "off"
    if kind == "cpu":
        return "bfloat16" if cpu_bf16_support(cpuinfo) is True else "off"
    return "off"


def mixed_precision(autocast: str, device: str) -> contextlib.AbstractContextManager:
    """torch.autocast in `autocast`'s dtype on `device`'s kind ("cpu", "cuda:0" -> "cuda"), or nothing
    for "off" ("auto" is resolved on this process's machine first: see resolve_autocast). Weights, and so
    gradients and optimizer state, stay in their own dtype; a backward pass follows the dtypes its forward
    chose, so only the forward needs to run inside."""
    autocast = resolve_autocast(autocast, device)
    if autocast == "off":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=getattr(torch, autocast))


def report_autocast(autocast: str, device: str, log) -> None:
    """Log what "auto" chose here, and warn when bfloat16 is asked for on a CPU without bf16 instructions
    (it still runs, slowly)."""
    if autocast == "auto":
        log.info("autocast auto on %s: %s", device, resolve_autocast(autocast, device))
    elif autocast == "bfloat16" and torch.device(device).type == "cpu" and cpu_lacks_bf16():
        log.warning("autocast bfloat16 on a CPU without bf16 instructions (no avx512_bf16 or amx_bf16 in "
                    "/proc/cpuinfo): torch emulates them, and steps can be many times slower than in float32; "
                    "set autocast: off or auto")
