"""The TV prior's step: ``invert.objectives.TotalVariation`` against the plain replicate-pad formulation.

Both compute ``mean((dx^2 + dy^2) ** (beta / 2))`` with the image's edge replicated (Mahendran & Vedaldi 2015, TV^beta),
forward and backward, as the engine does at every step with ``tv_weight > 0``:

1. ``ours``: the neighbour differences padded with zeros (the replicated edge's difference is 0), whose backward is a
   slice: deterministic on CUDA.
2. ``replicate-pad``: ``F.pad(x, mode="replicate")`` and the differences to the padded image, the formulation before;
   its CUDA backward adds atomically, in no fixed order.

Times ``--items`` CIFAR-sized images, checks that values and gradients agree, prints the ratio and writes
``benchmarks/results/tv_prior_<device>.json``.

    python benchmarks/bench_tv_prior.py                        # CPU: 200 images of 32 x 32
    python benchmarks/bench_tv_prior.py --items 800 --device cuda
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_io import comparison_report, write_result  # noqa: E402  (this folder is on sys.path when run as a script)
from timing import interleaved_timings, require_agreement  # noqa: E402

from invert.objectives import TotalVariation  # noqa: E402
from training.config import resolve_device  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=200, help="images per call (the paper's inversion batch)")
    parser.add_argument("--size", type=int, default=32, help="image height and width")
    parser.add_argument("--beta", type=float, default=2.0)
    parser.add_argument("--iterations", type=int, default=50, help="timed calls per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats; medians are reported")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.items < 1 or args.iterations < 1 or args.repeats < 1 or args.size < 2:
        parser.error("--items, --iterations and --repeats must be at least 1 and --size at least 2")
    return args


def replicate_pad_tv(x: torch.Tensor, beta: float) -> torch.Tensor:
    """The formulation before: differences to the replicate-padded image."""
    edged = F.pad(x, (0, 1, 0, 1), mode="replicate")
    squared = (edged[..., :-1, 1:] - x) ** 2 + (edged[..., 1:, :-1] - x) ** 2
    if beta != 2.0:
        squared = (squared + 1e-8) ** (beta / 2)
    return squared.mean(dim=(1, 2, 3))


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    x = torch.rand(args.items, 3, args.size, args.size, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_()
    prior = TotalVariation(1.0, beta=args.beta)

    def step(loss_fn):
        return lambda: torch.autograd.grad(loss_fn(x).sum(), x)[0]

    contenders = {"ours": step(prior), "replicate-pad": step(lambda images: replicate_pad_tv(images, args.beta))}
    grads = {name: fn() for name, fn in contenders.items()}
    with torch.no_grad():
        value_difference = float((prior(x) - replicate_pad_tv(x, args.beta)).abs().max())
    agreement = {"max_abs_value_difference": value_difference, "max_abs_gradient_difference": float((grads["ours"] - grads["replicate-pad"]).abs().max())}
    require_agreement(agreement, 1e-5)
    median, seconds = interleaved_timings(contenders, args.iterations, args.repeats, device, warmup=min(args.iterations, 3))
    report = comparison_report(
        device, args, median,
        {name: {"items_per_second": args.items / median[name], "all_repeats_ms": [1e3 * s for s in seconds[name]]} for name in contenders},
        agreement,
        reference="replicate-pad",
    )
    for name in contenders:
        print(f"{name:>13}: {report['results'][name]['items_per_second']:12.0f} items/s (forward and backward)")
    print(f"ours is {report['ratios']['ours / replicate-pad (speed)']:.2f}x the replicate pad's speed; values differ by at most "
          f"{value_difference:.1e}, gradients by {report['agreement']['max_abs_gradient_difference']:.1e}")
    write_result(report, "tv_prior", device, args.out)
    return report


if __name__ == "__main__":
    main()
