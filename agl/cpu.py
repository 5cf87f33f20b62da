"""CPU cores and torch's intra-op threads: one home for how many threads this process's torch work uses, and for
handing the memory a training phase freed back to the OS.

torch's intra-op thread count set from the main thread is the process's default (threads started later inherit it).
A local policy server sets it to half the usable cores (``agl.serving``): while it decodes, the runners, the gateway
and the store need the rest. Training phases that run while nothing else of the run computes (an RL update between
rounds, a warm start) take every core for their duration with ``all_cores``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def cpu_description() -> str:
    """The CPU in words, for every speed or greedy-accuracy figure (both differ between CPUs): its model name from
    ``/proc/cpuinfo`` (the platform's processor string elsewhere), the usable cores, and the vector extensions torch
    dispatches to (``torch.backends.cpu.get_cpu_capability()``: e.g. AVX2 or AVX512) plus whether the CPU has native
    bf16 (``avx512_bf16`` / ``amx_bf16`` flags)."""
    import platform

    import torch

    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    bf16 = "native bf16" if flags & {"avx512_bf16", "amx_bf16"} else "no native bf16"
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{model}, {usable_cores()} usable cores, torch kernels {capability}, {bf16}"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


@contextmanager
def all_cores(threads: int | None = None) -> Iterator[None]:
    """Run the block's torch work with one intra-op thread per usable core (or ``threads``), then restore the previous
    count and return the memory the block freed to the OS (``release_free_memory``): a training phase's activations
    are many tensors of a few MB, which glibc keeps in its heap once freed (6 GB of heap stayed resident after one LoRA
    update of Qwen2.5-Coder-0.5B), where the rollouts that follow need it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads or usable_cores())
    try:
        yield
    finally:
        torch.set_num_threads(before)
        release_free_memory()


def release_free_memory() -> None:
    """Collect garbage, then ask glibc to give its free heap pages back to the OS (``malloc_trim``); a no-op where
    the C library has no ``malloc_trim``."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    name = ctypes.util.find_library("c")
    if name is None:
        return
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim(0)
