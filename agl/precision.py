"""The floating-point type models run in, chosen from what the hardware does fast (one home for serving and trainers).

bf16 halves memory traffic, but only hardware with native bf16 arithmetic turns that into speed: a CUDA GPU that
supports it, or a CPU with AVX-512-BF16/AMX. Elsewhere torch emulates bf16 (measured on a 2-core AVX2 EPYC: a
1024x1024 matmul at 62 GFLOPS in fp32 and 0.8 GFLOPS in bf16), so the choice is made from a short matmul
micro-benchmark on CPUs, never from a library default. The measurement runs once per process (cached); torch is
imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

DtypeName = Literal["auto", "float32", "bfloat16"]

_MATMUL_SIZE = 256
"""Side of the square matmul the CPU micro-benchmark times: ~34 MFLOP, so even emulated bf16 takes ~50 ms."""


def matmul_gflops(*dtypes: torch.dtype, size: int = _MATMUL_SIZE, seconds: float = 0.1) -> dict[torch.dtype, float]:
    """Measured GFLOPS of ``size``x``size`` CPU matmuls in each of ``dtypes``: the best of repeated runs over about
    ``seconds`` a dtype, the dtypes taking turns, so that other work on the machine slows each of them alike instead
    of whichever happened to be measured while it ran."""
    import torch

    pairs = {d: (torch.randn(size, size).to(d), torch.randn(size, size).to(d)) for d in dtypes}
    for a, b in pairs.values():
        torch.matmul(a, b)  # warm-up: first-call allocation and kernel selection
    best = dict.fromkeys(dtypes, float("inf"))
    deadline = time.perf_counter() + seconds * len(dtypes)
    runs = 0
    while runs < 3 or time.perf_counter() < deadline:
        for d, (a, b) in pairs.items():
            start = time.perf_counter()
            torch.matmul(a, b)
            best[d] = min(best[d], time.perf_counter() - start)
        runs += 1
    return {d: 2 * size**3 / seconds_ / 1e9 for d, seconds_ in best.items()}


@functools.lru_cache(maxsize=1)
def cpu_bf16_is_fast() -> bool:
    """Whether a bf16 matmul on this CPU is at least as fast as an fp32 one (measured once per process, the two
    dtypes in turns: a 2-core AVX-512-BF16 EPYC runs bf16 ×1.8 fp32 with other work beside it, an AVX2 one ×0.01)."""
    import torch

    gflops = matmul_gflops(torch.bfloat16, torch.float32)
    return gflops[torch.bfloat16] >= gflops[torch.float32]


def choose_dtype(device_type: str, *, cuda_bf16: bool, cpu_bf16_fast: bool) -> torch.dtype:
    """bf16 where the hardware runs it natively (``cuda_bf16`` on CUDA, ``cpu_bf16_fast`` on CPU), else fp32."""
    import torch

    if device_type == "cuda":
        return torch.bfloat16 if cuda_bf16 else torch.float32
    if device_type == "cpu":
        return torch.bfloat16 if cpu_bf16_fast else torch.float32
    return torch.float32


def fast_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """The dtype to run a model in on ``device``: bf16 only where it is fast there, else fp32.

    On CUDA that is ``torch.cuda.is_bf16_supported()``; on a CPU, :func:`cpu_bf16_is_fast` (a micro-benchmark of
    about a quarter of a second, the first time). Any other device gets fp32.
    """
    import torch

    device_type = torch.device(device).type
    return choose_dtype(
        device_type,
        cuda_bf16=device_type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        cpu_bf16_fast=device_type == "cpu" and cpu_bf16_is_fast(),
    )


def resolve_dtype(name: DtypeName, device: str | torch.device = "cpu") -> torch.dtype:
    """``"auto"`` -> :func:`fast_dtype` for ``device``; ``"float32"``/``"bfloat16"`` -> that dtype."""
    import torch

    if name == "auto":
        return fast_dtype(device)
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    raise ValueError(f"dtype: expected 'auto', 'float32' or 'bfloat16', got {name!r}")
