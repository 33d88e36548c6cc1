"""Representation inversion: our engine against the `robustness` library, same run, same everything.

Three runs invert the same targets from the same seeds with the same model weights, step rule
(x <- clamp(x - eta g/||g||_2, 0, 1)), step size and step count, keeping each sample's best iterate:

1. anchor: ``robustness.attacker.AttackerModel`` (1.2.1.post2, patched for torch 2.x/CPU by
   ``benchmarks/robustness_compat.py``) with a custom loss = the normalised representation distance,
   the L2 constraint with a huge eps, ``targeted=True``, ``use_best=True``, in batches of
   ``--batch`` (32, as Nanda et al. ran it). Its model is ``robustness.cifar_models.resnet18`` (or
   ``imagenet_models.resnet50``) holding our network's state dict; its representation is
   ``with_latent=True, fake_relu=True``; the target features are computed once (in the loss they
   would be recomputed every step).
2. engine: ``invert.Engine`` with the same batch size (``micro_batch=--batch``), fp32.
3. engine-best: one batch of all items, bf16 + channels-last on CUDA (``precision=auto``), the step
   replayed as a CUDA graph (``--cuda-graph``, default ``auto``), ``torch.compile`` when ``--compile``.
4. engine-best-stop: engine-best with per-sample early stopping (``--patience``/``--rtol``); its
   median distance and the items it made worse (by more than 1 %) are reported against engine-best,
   beside the share of item-steps it saved.

Quality is the median final normalised distance ||g(x) - g(x_t)|| / ||g(x_t)||, recomputed for all
runs with the same fp32 representation. Speed: items/s, item-steps/s (items x steps / s, the nominal
workload), achieved TFLOP/s (the FLOPs of one forward and backward per item-step, counted by
``torch.utils.flop_counter``, times the steps the items actually took) and its share of the GPU's
dense bf16 peak (``benchmarks/throughput.py``; "n.a." on a CPU). Writes JSON (device, versions,
config, results) to ``benchmarks/results/inversion_<device>.json``. ``--skip anchor`` also allows
zoo models without a ``robustness`` twin (``--arch small_cnn``).

    python benchmarks/bench_inversion.py                          # CPU defaults: 32 items, 100 steps
    python benchmarks/bench_inversion.py --items 200 --steps 5000             # the GPU target (CUDA graph: auto)
    python benchmarks/bench_inversion.py --arch resnet50 --dataset imagenet   # torchvision ResNet50, 224 px
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_io import args_config, environment, write_result  # noqa: E402  (this folder is on sys.path when run as a script)
from robustness_compat import import_robustness  # noqa: E402  (this folder)
from throughput import bf16_peak_tflops, flops_per_item_step, throughput  # noqa: E402  (this folder)

from invert import Engine, InversionLoss, noise_images  # noqa: E402
from training.data import DATASET_STATS, IMAGE_SIZE, load_dataset  # noqa: E402
from training.models import build_model  # noqa: E402
from training.representation import Representation  # noqa: E402

CIFAR_MINI = REPO.parent / "shared" / "data" / "cifar-10-mini"
RUNS = ("anchor", "engine", "engine-best", "engine-best-stop")
# Early stopping of engine-best-stop: the shortest patience that cost no quality in benchmarks/early_stopping_study.py
# (CIFAR ResNet18, random weights, 2000 steps: patience 50, 200 and 500 made the median distance x1.57, x1.16, x1.03).
PATIENCE, RTOL = 1000, 1e-3
WORSE_BY = 0.01  # an item counts as made worse by early stopping when its distance grew by more than 1 %


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="resnet18", help="resnet18 (CIFAR) or resnet50 (with --dataset imagenet)")
    parser.add_argument("--dataset", default="cifar10", choices=["cifar10", "imagenet"])
    parser.add_argument("--checkpoint", default=None, help="weights for the model (default: seeded random init; speed does not depend on them)")
    parser.add_argument("--items", type=int, default=32, help="targets to invert (one noise seed each)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-size", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=32, help="the anchor's batch size, and run 2's micro-batch")
    parser.add_argument("--patience", type=int, default=PATIENCE, help="early stopping patience of engine-best-stop (steps)")
    parser.add_argument("--rtol", type=float, default=RTOL, help="early stopping tolerance of engine-best-stop (relative)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the objective in engine-best(-stop)")
    parser.add_argument("--cuda-graph", default="auto", choices=["auto", "true", "false"], help="engine-best(-stop): replay the step as a CUDA graph")
    parser.add_argument("--repeats", type=int, default=1, help="time each run this many times (round-robin), keep the fastest")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on CPU (default: all cores)")
    parser.add_argument("--seed", type=int, default=0, help="weights, target choice and noise seeds")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--skip", nargs="*", default=[], choices=list(RUNS))
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/inversion_<device>.json)")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- setup


def load_targets(args, device) -> tuple[torch.Tensor, str]:
    size = IMAGE_SIZE[args.dataset]
    if args.dataset == "cifar10" and (CIFAR_MINI / "cifar-10-batches-py").is_dir():
        data = load_dataset("cifar10", "test", root=CIFAR_MINI)
        index = torch.randperm(len(data.images), generator=torch.Generator().manual_seed(args.seed))[: args.items]
        return (data.images[index].float() / 255).to(device), f"CIFAR-10 test subset ({CIFAR_MINI.name})"
    generator = torch.Generator().manual_seed(args.seed)
    return torch.rand(args.items, 3, size, size, generator=generator).to(device), "uniform random images"


def build_models(args, device, with_anchor: bool = True):
    """Our classifier and the robustness library's network holding the same weights (None without the anchor)."""
    torch.manual_seed(args.seed)
    ours = build_model(args.arch, args.dataset, checkpoint=args.checkpoint).to(device).eval()
    if not with_anchor:
        return ours, None
    robustness = import_robustness()
    zoo = robustness.imagenet_models if args.dataset == "imagenet" else robustness.cifar_models
    if not hasattr(zoo, args.arch):
        raise SystemExit(f"the robustness library has no {args.arch}: run it with --skip anchor")
    theirs = getattr(zoo, args.arch)(num_classes=ours.num_classes)
    theirs.load_state_dict(ours.net.state_dict())
    mean, std = DATASET_STATS[args.dataset]
    attacker = robustness.attacker.AttackerModel(theirs, SimpleNamespace(mean=torch.tensor(mean), std=torch.tensor(std)))
    return ours, attacker.to(device).eval()


def anchor_features(attacker, images: torch.Tensor) -> torch.Tensor:
    _, features = attacker.model(attacker.normalizer(images), with_latent=True, fake_relu=True)
    return features


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- the three runs


def run_anchor(args, attacker, targets, seeds):
    with torch.no_grad():
        target_features = torch.cat([anchor_features(attacker, chunk) for chunk in targets.split(args.batch)])

    def normalised_distance(model, inp, target):  # robustness calls custom_loss(model, normalised input, target)
        _, features = model(inp, with_latent=True, fake_relu=True)
        return torch.linalg.vector_norm(features - target, dim=1) / torch.linalg.vector_norm(target, dim=1), None

    results = []
    for start in range(0, len(seeds), args.batch):
        # AttackerModel(x, make_adv=True) is this call plus a forward pass of the result we do not need.
        images = attacker.attacker(
            seeds[start : start + args.batch], target_features[start : start + args.batch],
            constraint="2", eps=1e6, step_size=args.step_size, iterations=args.steps, targeted=True,
            use_best=True, custom_loss=normalised_distance, random_start=False, do_tqdm=False,
        )
        results.append(images.detach())
    return torch.cat(results), None


def run_engine(args, objective, seeds, **settings):
    # stop_at_bounds: the anchor's algorithm under torch 2.x (its input clamp passes no gradient at 0 and 1).
    engine = Engine(steps=args.steps, step_size=args.step_size, progress=False, log_every=50, stop_at_bounds=True, **settings)
    result = engine.run(objective, seeds)
    return result.images, result


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    with_anchor = "anchor" not in args.skip
    ours, attacker = build_models(args, device, with_anchor)
    targets, target_source = load_targets(args, device)
    size = targets.shape[-1]
    seeds = noise_images(args.items, (3, size, size), seed=args.seed, device=device)
    representation = Representation(ours)
    objective = InversionLoss(representation, targets, chunk_size=args.batch)
    one_step_gap = None
    if with_anchor:
        with torch.no_grad():  # same weights, same representation: the two implementations must agree
            gap = (anchor_features(attacker, targets[:4]) - representation(targets[:4])).abs().max().item()
        assert gap < 1e-4, f"the anchor's representation differs from ours by {gap}"
        # Same algorithm: after one step both implementations hold the same images (up to float
        # rounding). Later steps diverge slowly (ReLU and clamp boundaries amplify rounding), so
        # quality is compared on the median over items.
        one_step = argparse.Namespace(**{**vars(args), "steps": 1, "batch": min(4, args.items)})
        anchor_one, _ = run_anchor(one_step, attacker, targets[:4], seeds[:4])
        engine_one, _ = run_engine(one_step, InversionLoss(representation, targets[:4]), seeds[:4], micro_batch=4)
        one_step_gap = (anchor_one - engine_one).abs().max().item()
        print(f"after one step the anchor and the engine differ by at most {one_step_gap:.2e} per pixel")

    best = dict(micro_batch=args.items, precision="auto", channels_last=device.type == "cuda", compile=args.compile,
                cuda_graph={"auto": "auto", "true": True, "false": False}[args.cuda_graph])
    if args.compile and best["cuda_graph"] == "auto":
        best["cuda_graph"] = False  # a compiled objective makes its own graphs (compile_mode)
    engine_settings = {
        "engine": dict(micro_batch=args.batch),
        "engine-best": best,
        "engine-best-stop": {**best, "patience": args.patience, "rtol": args.rtol},
    }
    runs = {"anchor": lambda: run_anchor(args, attacker, targets, seeds)}
    for name, settings in engine_settings.items():
        runs[name] = lambda settings=settings: run_engine(args, objective, seeds, **settings)
    runs = {name: fn for name, fn in runs.items() if name not in args.skip}

    # Repeats go round-robin over the runs, starting one run later each time, and keep each run's
    # fastest time, so neither a change in the machine's load nor a run's position favours a run.
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    seconds = {name: [] for name in runs}
    outputs = {}
    names = list(runs)
    for repeat in range(args.repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            fn = runs[name]
            sync(device)
            start = time.perf_counter()
            outputs[name] = fn()
            sync(device)
            seconds[name].append(time.perf_counter() - start)
            print(f"{name:16s} {seconds[name][-1]:8.2f} s", flush=True)

    probe = min(2, args.items)
    step_flops = flops_per_item_step(objective, targets[:probe], torch.arange(probe, device=device))
    peak = bf16_peak_tflops(device)
    print(f"one step = {step_flops / 1e9:.3f} GFLOP per item (forward + backward); dense bf16 peak: "
          f"{f'{peak:.0f} TFLOP/s' if peak else 'n.a.'}")
    results, per_item = {}, {}
    for name, (images, engine_result) in outputs.items():
        fastest = min(seconds[name])
        with torch.no_grad():
            distance = objective(images).float()
        per_item[name] = distance
        steps_taken = engine_result.steps_used.sum().item() if engine_result is not None else args.items * args.steps
        speed = throughput(args.items * args.steps, fastest, step_flops, peak)
        speed["tflops"] = steps_taken * step_flops / fastest / 1e12  # the steps items actually took
        if peak:
            speed["fraction_of_bf16_peak"] = speed["tflops"] / peak
        results[name] = {
            "seconds": fastest,
            "all_seconds": seconds[name],
            "items_per_s": args.items / fastest,
            **speed,
            "median_final_distance": distance.median().item(),
            "mean_final_distance": distance.mean().item(),
            "final_distances": [round(d, 6) for d in distance.tolist()],
        }
        if engine_result is not None:
            results[name]["settings"] = {k: v for k, v in engine_settings[name].items()}
            results[name]["mean_steps_used"] = engine_result.steps_used.float().mean().item()
            results[name]["micro_batch"] = engine_result.micro_batch
        fraction = speed["fraction_of_bf16_peak"]
        print(f"{name:16s} best {fastest:8.2f} s  {args.items / fastest:8.3f} items/s  {speed['item_steps_per_s']:9.1f} item-steps/s  "
              f"{speed['tflops']:7.3f} TFLOP/s ({fraction if isinstance(fraction, str) else f'{fraction:.1%}'} of bf16 peak)  "
              f"median distance {distance.median().item():.4f}", flush=True)
    if "anchor" in results:
        for name in results:
            results[name]["better_than_anchor_on_items"] = int((per_item[name] < per_item["anchor"]).sum())
            results[name]["speedup_vs_anchor"] = results["anchor"]["seconds"] / results[name]["seconds"]
            results[name]["distance_ratio_vs_anchor"] = (
                results[name]["median_final_distance"] / results["anchor"]["median_final_distance"]
            )
        for name in results:
            if name != "anchor":
                print(f"{name:16s} {results[name]['speedup_vs_anchor']:.2f}x faster than the anchor, "
                      f"median distance x{results[name]['distance_ratio_vs_anchor']:.3f}, "
                      f"closer than the anchor on {results[name]['better_than_anchor_on_items']} of {args.items} items")
    early_stopping = None
    if {"engine-best", "engine-best-stop"} <= set(results):
        full, stopped = per_item["engine-best"], per_item["engine-best-stop"]
        early_stopping = {
            "patience": args.patience,
            "rtol": args.rtol,
            "median_distance_ratio": results["engine-best-stop"]["median_final_distance"] / results["engine-best"]["median_final_distance"],
            "items_worse": int((stopped > full * (1 + WORSE_BY)).sum()),
            "worse_by": WORSE_BY,
            "item_steps_saved": 1 - outputs["engine-best-stop"][1].steps_used.sum().item() / (args.items * args.steps),
            "speedup": results["engine-best"]["seconds"] / results["engine-best-stop"]["seconds"],
        }
        print(f"early stopping (patience {args.patience}, rtol {args.rtol:g}): median distance x{early_stopping['median_distance_ratio']:.3f}, "
              f"{early_stopping['items_worse']} of {args.items} items worse by more than {WORSE_BY:.0%}, "
              f"{early_stopping['item_steps_saved']:.1%} of item-steps saved, {early_stopping['speedup']:.2f}x faster than engine-best")

    report = {
        **environment(device),
        "device_type": device.type,
        "robustness": getattr(import_robustness(), "__version__", "1.2.1.post2") if with_anchor else None,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "config": {**args_config(args), "targets": target_source,
                   "image_size": size, "seeds": "uniform noise, one generator per item (invert.noise_images)"},
        "one_step_max_pixel_difference": one_step_gap,
        "flops_per_item_step": step_flops,
        "bf16_peak_tflops": peak,
        "results": results,
        "early_stopping": early_stopping,
    }
    write_result(report, "inversion", device, args.out)
    return report


if __name__ == "__main__":
    main()
