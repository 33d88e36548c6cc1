"""MART's loss: ``training.losses.mart_loss`` against the MART authors' PyTorch (YisenWang/MART, ``mart_loss``).

Both compute ``mean_i [BCE(x_adv_i, y_i) + beta * KL(p(x_i) || p(x_adv_i)) * (1 - p_y(x_i))]`` from the same logits;
they differ in how the boosted cross-entropy finds the most likely wrong class:

1. ``ours``: the label's probability scattered to -inf, then a max over the classes (no sort, no host sync on any
   device; it replaced a mask by ``F.one_hot``, which reads the labels' range on the host off CUDA).
2. ``reference``: the authors' ``argsort`` of the probabilities, the top two classes, and a ``where``.

Times the loss forward and backward (what a training step pays per batch), checks that the two agree, prints the
ratio and writes ``benchmarks/results/mart_loss_<device>.json``.

    python benchmarks/bench_mart_loss.py                     # CPU: batch 128, 10 classes
    python benchmarks/bench_mart_loss.py --batch 512 --classes 100 --device cuda
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

from training.config import resolve_device  # noqa: E402
from training.losses import mart_loss  # noqa: E402


def reference_mart_loss(logits_natural: torch.Tensor, logits_adversarial: torch.Tensor, labels: torch.Tensor, beta: float) -> torch.Tensor:
    """The loss of YisenWang/MART ``mart_loss`` (train_cifar10.py), from the logits, as the authors wrote it."""
    kl = torch.nn.KLDivLoss(reduction="none")
    batch_size = len(labels)
    adv_probs = F.softmax(logits_adversarial, dim=1)
    tmp1 = torch.argsort(adv_probs, dim=1)[:, -2:]
    new_y = torch.where(tmp1[:, -1] == labels, tmp1[:, -2], tmp1[:, -1])
    loss_adv = F.cross_entropy(logits_adversarial, labels) + F.nll_loss(torch.log(1.0001 - adv_probs + 1e-12), new_y)
    nat_probs = F.softmax(logits_natural, dim=1)
    true_probs = torch.gather(nat_probs, 1, labels.unsqueeze(1).long()).squeeze()
    loss_robust = (1.0 / batch_size) * torch.sum(torch.sum(kl(torch.log(adv_probs + 1e-12), nat_probs), dim=1) * (1.0000001 - true_probs))
    return loss_adv + float(beta) * loss_robust


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--beta", type=float, default=6.0, help="MART's beta (the authors' CIFAR-10 value)")
    parser.add_argument("--iterations", type=int, default=2000, help="timed forward + backward passes per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats; medians are reported")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.batch < 1 or args.classes < 2 or args.iterations < 1 or args.repeats < 1:
        parser.error("--batch, --iterations and --repeats must be at least 1 and --classes at least 2")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    generator = torch.Generator().manual_seed(0)
    logits_natural = (3 * torch.randn(args.batch, args.classes, generator=generator)).to(device).requires_grad_(True)
    logits_adversarial = (3 * torch.randn(args.batch, args.classes, generator=generator)).to(device).requires_grad_(True)
    labels = torch.randint(0, args.classes, (args.batch,), generator=generator).to(device)
    contenders = {
        "ours": lambda nat, adv: mart_loss(nat, adv, labels, args.beta)[0],
        "reference": lambda nat, adv: reference_mart_loss(nat, adv, labels, args.beta),
    }
    values = {name: float(fn(logits_natural, logits_adversarial)) for name, fn in contenders.items()}
    require_agreement({"abs_difference": abs(values["ours"] - values["reference"])}, 1e-5)
    # What a training step pays per batch: the loss's forward and backward (gradients with respect to both logits).
    passes = {name: (lambda fn=fn: fn(logits_natural, logits_adversarial).backward()) for name, fn in contenders.items()}
    median, seconds = interleaved_timings(passes, args.iterations, args.repeats, device, warmup=min(args.iterations, 50))
    report = comparison_report(
        device, args, median,
        {name: {"microseconds_per_pass": 1e6 * median[name], "all_repeats_us": [1e6 * s for s in seconds[name]], "loss": values[name]}
         for name in contenders},
        {"abs_difference": abs(values["ours"] - values["reference"])},
        reference="reference",
    )
    for name in contenders:
        print(f"{name:>9}: {1e6 * median[name]:8.1f} us per forward + backward (loss {values[name]:.6f})")
    print(f"ours is {report['ratios']['ours / reference (speed)']:.2f}x the reference's speed; "
          f"losses differ by {report['agreement']['abs_difference']:.2e}")
    write_result(report, "mart_loss", device, args.out)
    return report


if __name__ == "__main__":
    main()
