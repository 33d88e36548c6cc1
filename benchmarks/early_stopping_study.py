"""Does early stopping cost quality? Every stopping rule replayed exactly on one unstopped run.

With ``keep_best`` an item frozen at step s returns its best iterate up to s, i.e. the value of its
best-loss curve at s. So one run without early stopping, logging the best loss at every step
(``log_every=1``), tells exactly what any stopping rule would have returned for every item, and the
study compares rules without rerunning them:

* ``sliding`` (the engine's rule since issue 21): freeze once ``patience`` steps have passed since the
  best loss last improved by more than ``rtol`` relative to the best at that improvement;
* ``window`` (the engine's first rule): at steps patience, 2 patience, ..., freeze if the best loss
  improved by ``rtol`` or less over the window.

For each rule it reports the median final distance against the unstopped run's, the items made
worse by more than 1 %, and the share of item-steps saved. The loss is the paper's normalised
representation distance ||g(x) - g(x_t)|| / ||g(x_t)|| on CIFAR-10 targets from uniform-noise seeds
(x <- clamp(x - eta g/||g||_2, 0, 1), eta 1, as ``bench_inversion.py``); ``tests/test_benchmarks.py``
checks that the replay agrees with the engine's own early stopping step for step.

    python benchmarks/early_stopping_study.py                                  # CPU: small_cnn, 64 items, 2000 steps
    python benchmarks/early_stopping_study.py --arch resnet18 --items 200 --steps 5000 --precision auto   # the paper workload (GPU)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_io import args_config, environment, write_result  # noqa: E402  (this folder is on sys.path when run as a script)

from invert import Engine, InversionLoss, noise_images  # noqa: E402
from invert.params import clamp_stops_gradient_at_bounds  # noqa: E402
from training.data import IMAGE_SIZE, load_dataset  # noqa: E402
from training.models import build_model  # noqa: E402
from training.representation import Representation  # noqa: E402

CIFAR_MINI = REPO.parent / "shared" / "data" / "cifar-10-mini"
RULES = ("sliding", "window")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="small_cnn", help="a CIFAR model of the zoo (small_cnn, resnet18, ...)")
    parser.add_argument("--checkpoint", default=None, help="weights (default: seeded random init)")
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--step-size", type=float, default=1.0)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"])
    parser.add_argument("--patience", type=int, nargs="+", default=[50, 100, 200, 500])
    parser.add_argument("--rtol", type=float, nargs="+", default=[1e-3, 1e-4, 0.0])
    parser.add_argument("--worse-by", type=float, default=0.01, help="an item counts as worse when its distance grew by more than this share")
    parser.add_argument("--data-root", type=Path, default=CIFAR_MINI, help="folder holding cifar-10-batches-py/ (the targets; else random images)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/early_stopping_<device>.json)")
    args = parser.parse_args(argv)
    if args.items < 1 or args.steps < 1 or min(args.patience) < 1:
        parser.error(f"--items, --steps and every --patience must be at least 1, got {args.items}, {args.steps} and {args.patience}")
    return args


def stopping_steps(curve: np.ndarray, patience: int, rtol: float, rule: str = "sliding") -> np.ndarray:
    """The step at which each item would freeze (``steps`` if never), from its best-loss curve.

    ``curve``: (steps + 1, N), row k the best loss after scoring iterate k (``InversionResult.loss_curve`` of
    a run with ``log_every=1``). ``sliding`` and ``window`` as in the module docstring; ``sliding`` is
    ``invert.engine._Runner._check_patience`` step for step.
    """
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; choose one of {RULES}")
    steps, n = curve.shape[0] - 1, curve.shape[1]
    stop = np.full(n, steps)
    reference = curve[0].copy()
    since = np.zeros(n, dtype=np.int64)
    running = np.ones(n, dtype=bool)
    for k in range(1, steps + 1):
        best = curve[k]
        if rule == "sliding":
            significant = running & (reference - best > rtol * np.abs(reference))
            reference = np.where(significant, best, reference)
            since = np.where(significant, k, since)
            stalled = running & (k - since >= patience)
        else:
            if k % patience:
                continue
            stalled = running & (reference - best <= rtol * np.abs(reference))
            reference = best.copy()
        stop = np.where(stalled, k, stop)
        running &= ~stalled
    return stop


def replay(curve: np.ndarray, patience: int, rtol: float, rule: str, worse_by: float) -> dict:
    """What ``rule`` would have returned: distances at the stopping steps against the unstopped run's."""
    stop = stopping_steps(curve, patience, rtol, rule)
    full, stopped = curve[-1], curve[stop, np.arange(curve.shape[1])]
    steps = curve.shape[0] - 1
    return {
        "rule": rule,
        "patience": patience,
        "rtol": rtol,
        "median_distance": float(np.median(stopped)),
        "median_distance_ratio": float(np.median(stopped) / np.median(full)),
        "items_worse": int((stopped > full * (1 + worse_by)).sum()),
        "worst_relative_increase": float((stopped / full - 1).max()),
        "item_steps_saved": float(1 - stop.sum() / (steps * len(stop))),
        "items_stopped_early": int((stop < steps).sum()),
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = build_model(args.arch, "cifar10", checkpoint=args.checkpoint).to(device).eval()
    size = IMAGE_SIZE["cifar10"]
    if (args.data_root / "cifar-10-batches-py").is_dir():
        data = load_dataset("cifar10", "test", root=args.data_root)
        index = torch.randperm(len(data.images), generator=torch.Generator().manual_seed(args.seed))[: args.items]
        targets, source = (data.images[index].float() / 255).to(device), f"CIFAR-10 test subset ({args.data_root.name})"
    else:
        targets = torch.rand(args.items, 3, size, size, generator=torch.Generator().manual_seed(args.seed)).to(device)
        source = "uniform random images"
    seeds = noise_images(args.items, (3, size, size), seed=args.seed, device=device)
    objective = InversionLoss(Representation(model), targets)
    engine = Engine(steps=args.steps, step_size=args.step_size, precision=args.precision,
                    stop_at_bounds=clamp_stops_gradient_at_bounds(), log_every=1, progress=True)
    started = time.perf_counter()
    result = engine.run(objective, seeds)
    seconds = time.perf_counter() - started
    curve = result.loss_curve.float().cpu().numpy()
    print(f"unstopped run: {seconds:.1f} s, median distance {np.median(curve[-1]):.4f}")
    rows = [replay(curve, p, r, rule, args.worse_by) for rule in RULES for p in args.patience for r in args.rtol]
    print(f"{'rule':8s} {'patience':>8s} {'rtol':>7s} {'median':>8s} {'ratio':>6s} {'worse':>6s} {'saved':>6s}")
    for row in rows:
        print(f"{row['rule']:8s} {row['patience']:8d} {row['rtol']:7.0e} {row['median_distance']:8.4f} {row['median_distance_ratio']:6.3f} "
              f"{row['items_worse']:6d} {row['item_steps_saved']:6.1%}")
    checkpoints = [s for s in (100, 250, 500, 1000, 2000, 3000, 5000) if s <= args.steps]
    report = {
        **environment(device),
        "config": {**args_config(args), "targets": source, "image_size": size},
        "unstopped": {"seconds": seconds, "median_distance": float(np.median(curve[-1])),
                      "median_best_distance_at": {str(s): float(np.median(curve[s])) for s in checkpoints}},
        "rules": rows,
    }
    write_result(report, "early_stopping", device, args.out)
    return report


if __name__ == "__main__":
    main()
