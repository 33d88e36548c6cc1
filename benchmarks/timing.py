"""Timing for the benchmarks that race small contenders: interleaved repeats, medians, the GPU synchronised."""
from __future__ import annotations

import statistics
import time
from typing import Callable, Mapping

import torch


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued kernels (CUDA launches return before the work is done)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(fn: Callable[[], object], iterations: int, device: torch.device) -> float:
    """Mean seconds per call of ``fn`` over ``iterations`` calls."""
    sync(device)
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    sync(device)
    return (time.perf_counter() - start) / iterations


def interleaved_timings(contenders: Mapping[str, Callable[[], object]], iterations: int, repeats: int, device: torch.device,
                        warmup: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Seconds per call of each contender: ``warmup`` untimed calls each, then ``repeats`` rounds that time every contender
    in turn (so a slow spell on a shared host hits all of them). Returns the medians and every round's value."""
    for fn in contenders.values():
        if warmup > 0:  # 0: the caller warmed them up (or computed their results) already
            seconds_per_call(fn, warmup, device)
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            seconds[name].append(seconds_per_call(fn, iterations, device))
    return {name: statistics.median(s) for name, s in seconds.items()}, seconds


def require_agreement(differences: Mapping[str, float], limit: float) -> None:
    """Stop the benchmark, before anything is timed, where two contenders' results differ by more than ``limit``: a speed
    ratio between implementations that compute different things means nothing."""
    wrong = {name: value for name, value in differences.items() if not value <= limit}
    if wrong:
        raise SystemExit(f"the contenders disagree ({wrong}, limit {limit:g}): the speed comparison would be void")
