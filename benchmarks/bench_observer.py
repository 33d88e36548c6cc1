"""Observer distances: the batched Gram-product LPIPS matrix against the `lpips` package's own forward.

All N(N-1)/2 LPIPS distances between N images (what clustering and 2AFC scoring need), several ways,
with the same network (the `lpips` package's AlexNet and linear heads; the offline random-backbone
variant unless ``--pretrained``, which speed does not depend on):

1. ``ours``: ``perceptual.observers.LPIPSObserver.matrix``: each image through the backbone once,
   then one Gram product per layer (``||a - b||^2 = a.a + b.b - 2 a.b``, in float64).
   ``ours-pairwise``: ``LPIPSObserver.pairwise`` on the same pairs, the path trial scoring takes: each image
   through the backbone once, then the pairs ``batch_size`` (256) at a time; ``ours-pairwise-one-slice``: the
   same with every pair in one slice (how it ran before the slicing, which bounds its memory).
2. ``lpips-batched``: ``lpips.LPIPS.forward(x0, x1)`` over every pair, ``--pair-batch`` pairs per
   call: how the package is used for many pairs.
3. ``lpips-loop``: the same forward one pair at a time, on the first ``--loop-images`` images only
   (it is slow), timed per pair.

Each contender's result is computed once and compared first (the differences must be float-rounding small), then
the contenders take turns ``--repeats`` times (``timing.interleaved_timings``: a slow spell of a shared machine hits
all) and the median is reported. Prints pairs/s and ratios; writes ``benchmarks/results/observer_<device>.json``.

    python benchmarks/bench_observer.py                      # CPU: 256 CIFAR images (32,640 pairs)
    python benchmarks/bench_observer.py --images 1000 --device cuda
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_io import environment, write_result  # noqa: E402  (this folder is on sys.path when run as a script)
from timing import interleaved_timings  # noqa: E402  (this folder)

from perceptual.observers import LPIPSObserver  # noqa: E402
from training.config import resolve_device  # noqa: E402

CIFAR_MINI = REPO.parent / "shared" / "data" / "cifar-10-mini"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--pair-batch", type=int, default=256, help="pairs per lpips.LPIPS.forward call in run 2")
    parser.add_argument("--loop-images", type=int, default=24, help="images whose pairs run 3 times one by one")
    parser.add_argument("--net", default="alex", choices=["alex", "vgg", "squeeze"])
    parser.add_argument("--pretrained", action="store_true", help="the real ImageNet backbone (weights must be cached)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the contenders taking turns; the median is reported")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.images < 2 or args.loop_images < 2:
        parser.error(f"--images and --loop-images need at least 2 images for one pair, got {args.images} and {args.loop_images}")
    if args.pair_batch < 1:
        parser.error(f"--pair-batch must be at least 1, got {args.pair_batch}")
    return args


def load_images(n: int) -> tuple[torch.Tensor, str]:
    """The first ``n`` CIFAR-10-mini test images in [0, 1], or seeded random images without ../shared."""
    if (CIFAR_MINI / "cifar-10-batches-py").is_dir():
        from training.data import load_dataset

        data = load_dataset("cifar10", "test", root=CIFAR_MINI)
        if len(data) >= n:
            return data.images[:n].float() / 255, f"cifar-10-mini test images (first {n})"
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(0)), "random 32x32 images"


def lpips_pairs(observer: LPIPSObserver, images: torch.Tensor, i: torch.Tensor, j: torch.Tensor, batch: int) -> torch.Tensor:
    """``lpips.LPIPS.forward`` on the pairs (i, j), ``batch`` pairs per call."""
    out = []
    with torch.no_grad():
        for s in range(0, len(i), batch):
            a, b = images[i[s:s + batch]], images[j[s:s + batch]]
            out.append(observer.lpips(a, b, normalize=True).flatten())
    return torch.cat(out)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    images, data_note = load_images(args.images)
    images = images.to(device)
    observer = LPIPSObserver(args.net, backbone="pretrained" if args.pretrained else "random", device=device)
    n = len(images)
    i, j = torch.triu_indices(n, n, offset=1, device=device)
    print(f"data: {data_note}; observer: {observer.name}; {len(i)} pairs; device: {device}")

    observer.matrix(images[:8])  # warm-up: allocator, kernel selection
    lpips_pairs(observer, images[:8], i[:4] % 8, j[:4] % 8, args.pair_batch)

    sliced_batch = observer.batch_size
    m = min(args.loop_images, n)
    li, lj = torch.triu_indices(m, m, offset=1, device=device)

    def one_slice_pairwise():
        observer.batch_size = len(i)
        try:
            return observer.pairwise(images, i, j)
        finally:
            observer.batch_size = sliced_batch

    contenders = {"ours": lambda: observer.matrix(images), "ours-pairwise": lambda: observer.pairwise(images, i, j),
                  "ours-pairwise-one-slice": one_slice_pairwise, "lpips-batched": lambda: lpips_pairs(observer, images, i, j, args.pair_batch),
                  "lpips-loop": lambda: lpips_pairs(observer, images, li, lj, 1)}
    outputs = {name: fn() for name, fn in contenders.items()}  # compared below before any ratio is reported
    ours_matrix, ours_pairwise, one_slice, batched, looped = (outputs[k] for k in contenders)
    medians, rounds = interleaved_timings(contenders, iterations=1, repeats=args.repeats, device=device, warmup=0)
    ours_seconds, pairwise_seconds, one_slice_seconds, batched_seconds, loop_seconds = (medians[k] for k in contenders)

    ours_pairs = ours_matrix.to(device)[i, j]
    results = {
        "ours": {"pairs": len(i), "seconds": ours_seconds, "pairs_per_second": len(i) / ours_seconds},
        "ours-pairwise": {"pairs": len(i), "seconds": pairwise_seconds, "pairs_per_second": len(i) / pairwise_seconds,
                          "pairs_per_slice": sliced_batch},
        "ours-pairwise-one-slice": {"pairs": len(i), "seconds": one_slice_seconds, "pairs_per_second": len(i) / one_slice_seconds},
        "lpips-batched": {"pairs": len(i), "seconds": batched_seconds, "pairs_per_second": len(i) / batched_seconds},
        "lpips-loop": {"pairs": len(li), "seconds": loop_seconds, "pairs_per_second": len(li) / loop_seconds},
    }
    ratios = {
        "ours / lpips-batched": results["ours"]["pairs_per_second"] / results["lpips-batched"]["pairs_per_second"],
        "ours / lpips-loop": results["ours"]["pairs_per_second"] / results["lpips-loop"]["pairs_per_second"],
        "ours-pairwise / lpips-batched": results["ours-pairwise"]["pairs_per_second"] / results["lpips-batched"]["pairs_per_second"],
        "ours-pairwise / ours-pairwise-one-slice": one_slice_seconds / pairwise_seconds,  # speed ratio
    }
    agreement = {
        "max_abs_difference_vs_batched": float((ours_pairs.float() - batched.float()).abs().max()),
        "max_abs_difference_vs_loop": float((ours_matrix.to(device)[li, lj].float() - looped.float()).abs().max()),
        "max_abs_difference_pairwise_vs_batched": float((ours_pairwise.to(device).float() - batched.float()).abs().max()),
        "pairwise_sliced_equals_one_slice": bool(torch.equal(ours_pairwise, one_slice)),
        "median_distance": float(batched.median()),
    }
    for name, r in results.items():
        print(f"{name:14s} {r['pairs_per_second']:12.1f} pairs/s ({r['pairs']} pairs in {r['seconds']:.2f} s)")
    for name, ratio in ratios.items():
        print(f"{name:24s} {ratio:8.1f}x")
    print(f"largest difference: {agreement['max_abs_difference_vs_batched']:.2e} (median distance {agreement['median_distance']:.3f})")
    if not (agreement["max_abs_difference_vs_batched"] < 1e-4 and agreement["max_abs_difference_pairwise_vs_batched"] < 1e-4):
        raise SystemExit("the two implementations disagree: the speed comparison is void")
    report = {
        "benchmark": "all-pairs LPIPS distances (pairs/s)",
        **environment(device),
        "load_average": os.getloadavg(),
        "data": data_note,
        "config": {"images": n, "observer": observer.name, "pair_batch": args.pair_batch, "loop_images": m, "repeats": args.repeats},
        "seconds_per_round": rounds,
        "results": results,
        "ratios": ratios,
        "agreement": agreement,
    }
    write_result(report, "observer", device, args.out)
    return report


if __name__ == "__main__":
    main()
