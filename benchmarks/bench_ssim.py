"""Single-scale SSIM: ``perceptual.observers.SSIMObserver`` against ``kornia.metrics.ssim``.

Both compute the SSIM map of Wang et al. (2004) with an 11 x 11 Gaussian window (sigma 1.5, reflected borders) and
average it per image pair; they differ in how the five local means are taken:

1. ``ours``: the observer's terms: the images, their squares and their product stacked along the channels and blurred
   in one call (one kernel, one convolution); unlike kornia, it honours the observer's ``sigma``.
2. ``kornia``: ``kornia.metrics.ssim``, whose sigma is fixed at 1.5: five filter calls.

Times ``--pairs`` pairs of CIFAR-sized images, checks that the two agree, prints the ratio and writes
``benchmarks/results/ssim_<device>.json``.

    python benchmarks/bench_ssim.py                          # CPU: 256 pairs of 32 x 32 images
    python benchmarks/bench_ssim.py --pairs 4096 --device cuda
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import kornia
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_io import comparison_report, write_result  # noqa: E402  (this folder is on sys.path when run as a script)
from timing import interleaved_timings, require_agreement  # noqa: E402

from perceptual.observers import SSIMObserver  # noqa: E402
from training.config import resolve_device  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=256)
    parser.add_argument("--size", type=int, default=32, help="image height and width")
    parser.add_argument("--iterations", type=int, default=20, help="timed calls per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats; medians are reported")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.iterations < 1 or args.repeats < 1 or args.size < 11:
        parser.error("--pairs, --iterations and --repeats must be at least 1 and --size at least the 11-pixel window")
    return args


@torch.no_grad()
def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(args.pairs, 3, args.size, args.size, generator=generator).to(device)
    b = (a + 0.1 * torch.randn(a.shape, generator=generator).to(device)).clamp(0, 1)
    observer = SSIMObserver().to(device)
    contenders = {
        "ours": lambda: observer.pairwise_images(a, b),
        "kornia": lambda: 1 - kornia.metrics.ssim(a, b, observer.window_size).flatten(1).mean(1),
    }
    values = {name: fn() for name, fn in contenders.items()}
    agreement = {"max_abs_difference": float((values["ours"] - values["kornia"]).abs().max())}
    require_agreement(agreement, 1e-4)
    median, seconds = interleaved_timings(contenders, args.iterations, args.repeats, device, warmup=min(args.iterations, 3))
    report = comparison_report(
        device, args, median,
        {name: {"pairs_per_second": args.pairs / median[name], "all_repeats_ms": [1e3 * s for s in seconds[name]]} for name in contenders},
        agreement,
        reference="kornia",
    )
    for name in contenders:
        print(f"{name:>7}: {report['results'][name]['pairs_per_second']:10.0f} pairs/s")
    print(f"ours is {report['ratios']['ours / kornia (speed)']:.2f}x kornia's speed; "
          f"distances differ by at most {report['agreement']['max_abs_difference']:.1e}")
    write_result(report, "ssim", device, args.out)
    return report


if __name__ == "__main__":
    main()
