"""Cost of ``invert.deterministic`` on CUDA: the engine on a CIFAR ResNet18 (random weights), ``--items`` x ``--steps``
L2 steps, bf16 and channels-last, one micro-batch, with deterministic cuDNN kernels off and on, alternating.

    python benchmarks/gpu_deterministic_cost.py                     # benchmarks/results/deterministic_cost_<gpu>.json
    python benchmarks/gpu_deterministic_cost.py --out $OUT/deterministic_cost.json

Needs a CUDA device (the setting changes nothing on a CPU). Result on one H100: benchmarks/results/deterministic_cost_h100.json
(written by an earlier version of this script, before it recorded its ``config`` and ``ratios``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from results_io import args_config, environment, write_result  # noqa: E402  (this folder is on sys.path when run as a script)

from invert import Engine, InversionLoss, noise_images  # noqa: E402
from training import Representation, build_model  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=200, help="images inverted in one batch")
    parser.add_argument("--steps", type=int, default=300, help="L2 steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each setting, alternating")
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (default: benchmarks/results/deterministic_cost_<gpu>.json)")
    args = parser.parse_args(argv)
    if min(args.items, args.steps, args.repeats) < 1:
        parser.error("--items, --steps and --repeats must be at least 1")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("gpu_deterministic_cost needs a CUDA device: deterministic cuDNN kernels change nothing on a CPU")
    device = torch.device("cuda")
    torch.manual_seed(0)
    rep = Representation(build_model("resnet18", "cifar10")).to(device)
    targets = torch.rand(args.items, 3, 32, 32, device=device)
    seeds = noise_images(args.items, (3, 32, 32), seed=1, device=device)
    report = {**environment(device), "config": args_config(args), "results": {}}
    for deterministic in (False, True) * args.repeats:
        engine = Engine(steps=args.steps, precision="bf16", channels_last=True, deterministic=deterministic, progress=False, log_every=50,
                        micro_batch=args.items)
        engine.run(InversionLoss(rep, targets[:8]), seeds[:8])  # warm-up
        objective = InversionLoss(rep, targets)
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = engine.run(objective, seeds)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        report["results"].setdefault(f"deterministic={deterministic}", []).append({
            "seconds": round(seconds, 3), "item_steps_per_s": round(args.items * args.steps / seconds),
            "median_distance": round(result.best_loss.median().item(), 4),
        })
    fastest = {name: min(run["seconds"] for run in runs) for name, runs in report["results"].items()}
    report["ratios"] = {"deterministic / not (time)": fastest["deterministic=True"] / fastest["deterministic=False"]}
    for name, runs in report["results"].items():
        print(f"{name:>20}: " + ", ".join(f"{run['seconds']:.2f} s" for run in runs))
    print(f"deterministic costs {report['ratios']['deterministic / not (time)']:.2f}x the time")
    write_result(report, "deterministic_cost", device, args.out)
    return report


if __name__ == "__main__":
    main()
