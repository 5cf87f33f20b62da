"""CPU cores and torch's intra-op threads: one home for how many threads this process's torch work uses, for the C
heap's handling of torch's tensors (``pin_mmap_threshold``, ``release_free_memory``), and for measuring what a block
of work holds at its peak.

torch's intra-op thread count set from the main thread is the process's default (threads started later inherit it).
A local policy server sets it to half the usable cores (``agl.serving``): while it decodes, the runners, the gateway
and the store need the rest. Training phases that run while nothing else of the run computes (an RL update between
rounds, a warm start) take every core for their duration with ``all_cores``.
"""

from __future__ import annotations

import functools
import os
import re
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

#: ``mallopt``'s option for glibc's mmap threshold (``M_MMAP_THRESHOLD`` in ``malloc.h``).
_M_MMAP_THRESHOLD = -3
#: Where ``pin_mmap_threshold`` holds it: glibc's own starting value. An allocation at least this large (a tensor of
#: 32k floats) gets pages of its own, which go back to the OS when it is freed.
MMAP_THRESHOLD = 128 * 1024


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
    count and return the memory the block freed to the OS (``release_free_memory``). The block's tensors get pages of
    their own (``pin_mmap_threshold``)."""
    import torch

    pin_mmap_threshold()
    before = torch.get_num_threads()
    torch.set_num_threads(threads or usable_cores())
    try:
        yield
    finally:
        torch.set_num_threads(before)
        release_free_memory()


@functools.cache
def pin_mmap_threshold() -> bool:
    """Hold glibc's mmap threshold at ``MMAP_THRESHOLD`` for the rest of the process (once; later calls return the
    first answer); False where the C library has no ``mallopt`` (macOS) or refuses.

    glibc raises the threshold each time a block above it is freed, up to 32 MiB, so after the first few tensors of a
    forward pass are freed, the ones of a few MB that follow come from its heap, where freed blocks stay resident and
    fragment it; torch's CPU tensors come from ``malloc``. Measured on one checkpointed LoRA update step of
    Qwen2.5-Coder-0.5B (two 1,000-token calls, 2-core AMD EPYC): the process peaked at 5.97-6.91 GiB with the rising
    threshold and at 2.9 GiB held at 128 KiB, of which 2.5 GiB are the weights. Process-wide, so agl's torch phases
    (a policy server, an update, a fine-tuning) call it when they start."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_free_memory() -> None:
    """Collect garbage, then ask glibc to give its free heap pages back to the OS (``malloc_trim``); a no-op where
    the C library has no ``malloc_trim``."""
    import gc

    gc.collect()
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)


@functools.cache
def _libc() -> Any | None:
    """The C library through ctypes, or None where it cannot be found."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name is not None else None


class ResidentPeak:
    """The largest resident set of this process while a ``with`` block runs (``peak``), and how far it rose above
    the block's start (``growth``), both in bytes. On entry the memory earlier work freed goes back to the OS
    (``release_free_memory``) and Linux's high-water mark is reset (``/proc/self/clear_refs``), so the peak is exact
    and the block's own; where that reset is not available the peak is the process's since it started
    (``ru_maxrss``), an upper bound. Every thread of the process counts (a policy server in it included)."""

    def __init__(self) -> None:
        self.start = self.peak = 0
        self.exact = False

    @property
    def growth(self) -> int:
        return max(0, self.peak - self.start)

    def __enter__(self) -> ResidentPeak:
        release_free_memory()
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
                handle.write("5")  # resets VmHWM to the current resident set
            self.exact = True
        except OSError:
            self.exact = False
        self.start = _status_kib("VmRSS") * 1024 if self.exact else 0
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.exact:
            self.peak = _status_kib("VmHWM") * 1024
        else:  # KiB on Linux, bytes on macOS
            scale = 1 if os.uname().sysname == "Darwin" else 1024
            self.peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _status_kib(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (e.g. ``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status", encoding="ascii") as handle:
        found = re.search(rf"^{field}:\s+(\d+) kB", handle.read(), re.MULTILINE)
    if found is None:
        raise OSError(f"/proc/self/status has no {field}")
    return int(found.group(1))
