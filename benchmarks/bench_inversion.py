"""Representation inversion: our engine against the `robustness` library, same run, same everything.

Three runs invert the same targets from the same seeds with the same model weights, step rule
(x <- clamp(x - eta g/||g||_2, 0, 1)), step size and step count, keeping each sample's best iterate:

1. anchor: ``robustness.attacker.AttackerModel`` (1.2.1.post2, patched for torch 2.x/CPU by
   ``benchmarks/robustness_compat.py``) with a custom loss = the normalised representation distance,
   the L2 constraint with a huge eps, ``targeted=True``, ``use_best=True``, in batches of
   ``--batch`` (32, as Nanda et al. ran it). Its model is ``robustness.cifar_models.resnet18`` (or
   ``imagenet_models.resnet50``) holding our network's state dict; its representation is
   ``with_latent=True, fake_relu=True``; the target features are computed once (in the loss they
   would be recomputed every step). The library as the paper ran it: its ``calc_loss`` runs the model
   once for its own logits and the custom loss runs it again, so each anchor step does two forwards and
   one backward where the engine does one of each (``anchor_forwards_per_step`` in the JSON); its
   TFLOP/s are counted at the engine's one forward, so they understate the work it does.
2. engine: ``invert.Engine`` with the same batch size (``micro_batch=--batch``), fp32.
3. engine-best: one batch of all items, bf16 + channels-last on CUDA (``precision=auto``), the step
   replayed as a CUDA graph (``--cuda-graph``, default ``auto``), ``torch.compile`` when ``--compile``.
4. engine-best-stop: engine-best with per-sample early stopping (``--patience``/``--rtol``); its
   median distance and the items it made worse (by more than 1 %) are reported against engine-best,
   beside the share of item-steps it saved.

Quality is the median final normalised distance ||g(x) - g(x_t)|| / ||g(x_t)||, recomputed for all
runs with the same fp32 representation. Speed: items/s, item-steps/s (items x steps / s, the nominal
workload), achieved TFLOP/s (the FLOPs of one forward and backward per item-step, counted by
``torch.utils.flop_counter``, times the item-steps the device computed) and its share of the GPU's
dense bf16 peak (``benchmarks/throughput.py``; "n.a." on a CPU). The item-steps computed are the
engine's own count (``InversionResult.item_steps_computed``): with a CUDA graph, items frozen by early
stopping stay in the replayed batch until its last item freezes, so stopping saves time only when whole
batches finish; ``loop`` records how each engine run stepped (``cuda-graph``, ``masked`` where a capture
fell back, ``eager``). The JSON (device, versions, config, results) goes to
``benchmarks/results/inversion_<device>.json`` and is rewritten after each run, so a run cut short keeps
the runs it finished. The runs go in the order engine-best, engine-best-stop, engine, anchor (the
goal's numbers first). ``--skip anchor`` also allows zoo models without a ``robustness`` twin
(``--arch small_cnn``). Targets are the CIFAR-10 test images under ``--data-root`` (default
``../shared/data/cifar-10-mini``), else uniform random images (then the distances mean little).

At 200 items x 5000 steps the anchor alone took 368 s and the fp32 engine 266 s on an H100: more than
one 10-minute job together. Split it: the goal's runs at full length, and the anchor ratio at fewer steps
(each run's time per step is constant without early stopping):

    python benchmarks/bench_inversion.py --items 200 --steps 5000 --skip anchor engine --cuda-graph true
    python benchmarks/bench_inversion.py --items 200 --steps 1000 --skip engine-best-stop --cuda-graph true

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

from invert import Engine, InversionLoss, InvertConfig, noise_images  # noqa: E402
from invert.params import clamp_stops_gradient_at_bounds  # noqa: E402
from training.data import DATASET_STATS, IMAGE_SIZE, load_dataset  # noqa: E402
from training.models import build_model  # noqa: E402
from training.representation import Representation  # noqa: E402

CIFAR_MINI = REPO.parent / "shared" / "data" / "cifar-10-mini"
RUNS = ("engine-best", "engine-best-stop", "engine", "anchor")  # the order they run in: the goal's numbers first
ANCHOR_FORWARDS_PER_STEP = 2  # robustness's calc_loss runs the model, then the custom loss runs it again
# Early stopping of engine-best-stop: the shortest patience that cost no quality in benchmarks/early_stopping_study.py
# (CIFAR ResNet18, random weights, 2000 steps: patience 50, 200 and 500 made the median distance x1.57, x1.16, x1.03).
PATIENCE, RTOL = 1000, 1e-3
WORSE_BY = 0.01  # an item counts as made worse by early stopping when its distance grew by more than 1 %


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="resnet18", help="resnet18 (CIFAR) or resnet50 (with --dataset imagenet)")
    parser.add_argument("--dataset", default="cifar10", choices=["cifar10", "imagenet"])
    parser.add_argument("--checkpoint", default=None, help="weights for the model (default: seeded random init; speed does not depend on them)")
    parser.add_argument("--data-root", type=Path, default=CIFAR_MINI, help="folder holding cifar-10-batches-py/ (the targets; else random images)")
    parser.add_argument("--items", type=int, default=32, help="targets to invert (one noise seed each)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-size", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=32, help="the anchor's batch size, and run 2's micro-batch")
    parser.add_argument("--patience", type=int, default=PATIENCE, help="early stopping patience of engine-best-stop (steps)")
    parser.add_argument("--rtol", type=float, default=RTOL, help="early stopping tolerance of engine-best-stop (relative)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the objective in engine-best(-stop)")
    parser.add_argument("--cuda-graph", default="auto", choices=["auto", "true", "false"], help="engine-best(-stop): replay the step as a CUDA graph")
    parser.add_argument("--repeats", type=int, default=1, help="time each run this many times (round-robin), keep the fastest")
    parser.add_argument("--warmup-steps", type=int, default=10,
                        help="untimed run of every contender first at this many steps (first-use kernels, lazy loading; 0: none)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on CPU (default: all cores)")
    parser.add_argument("--seed", type=int, default=0, help="weights, target choice and noise seeds")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--skip", nargs="*", default=[], choices=list(RUNS))
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/inversion_<device>.json)")
    args = parser.parse_args(argv)
    for name in ("items", "steps", "batch", "repeats", "patience"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.warmup_steps < 0:
        parser.error(f"--warmup-steps must be 0 (none) or more, got {args.warmup_steps}")
    if set(RUNS) <= set(args.skip):
        parser.error(f"--skip leaves no run to time: skip at most {len(RUNS) - 1} of {list(RUNS)}")
    if args.compile and args.cuda_graph == "true":  # InvertConfig refuses it too, but only once the models are built
        parser.error("--compile and --cuda-graph true are two ways to replay the step: choose one (--cuda-graph auto or false with --compile)")
    return args


# --------------------------------------------------------------------------- setup


def load_targets(args, device) -> tuple[torch.Tensor, str]:
    size = IMAGE_SIZE[args.dataset]
    if args.dataset == "cifar10" and (args.data_root / "cifar-10-batches-py").is_dir():
        data = load_dataset("cifar10", "test", root=args.data_root)
        if args.items > len(data.images):
            raise SystemExit(f"--items {args.items} is more than the {len(data.images)} test images under {args.data_root}")
        index = torch.randperm(len(data.images), generator=torch.Generator().manual_seed(args.seed))[: args.items]
        return (data.images[index].float() / 255).to(device), f"CIFAR-10 test images ({args.data_root.name})"
    print(f"no cifar-10-batches-py/ under {args.data_root}: inverting uniform random images (pass --data-root for CIFAR-10)")
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


def anchor_target_features(args, attacker, targets) -> torch.Tensor:
    """The anchor's target features, computed before its timed run as the engine's are (in ``InversionLoss``)."""
    with torch.no_grad():
        return torch.cat([anchor_features(attacker, chunk) for chunk in targets.split(args.batch)])


def run_anchor(args, attacker, target_features, seeds):
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
    # stop_at_bounds: the anchor's algorithm under the installed torch (does its input clamp pass gradient at 0 and 1?).
    engine = Engine(steps=args.steps, step_size=args.step_size, progress=False, log_every=50,
                    stop_at_bounds=clamp_stops_gradient_at_bounds(), **settings)
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
        anchor_one, _ = run_anchor(one_step, attacker, anchor_target_features(one_step, attacker, targets[:4]), seeds[:4])
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

    anchor_targets = anchor_target_features(args, attacker, targets) if with_anchor else None

    def contenders(run_args) -> dict:
        runs = {"anchor": lambda: run_anchor(run_args, attacker, anchor_targets, seeds)}
        for name, settings in engine_settings.items():
            runs[name] = lambda settings=settings: run_engine(run_args, objective, seeds, **settings)
        return {name: runs[name] for name in RUNS if name not in args.skip}

    runs = contenders(args)
    if args.warmup_steps > 0:  # untimed: the first run paid every contender's first-use costs (a CUDA graph's capture stays timed)
        for warm in contenders(argparse.Namespace(**{**vars(args), "steps": min(args.warmup_steps, args.steps)})).values():
            warm()
            sync(device)

    probe = min(2, args.items)
    step_flops = flops_per_item_step(objective, targets[:probe], torch.arange(probe, device=device))
    peak = bf16_peak_tflops(device)
    print(f"one step = {step_flops / 1e9:.3f} GFLOP per item (forward + backward); dense bf16 peak: "
          f"{f'{peak:.0f} TFLOP/s' if peak else 'n.a.'}")
    report = {
        **environment(device),
        "device_type": device.type,
        "robustness": getattr(import_robustness(), "__version__", "1.2.1.post2") if with_anchor else None,
        "load_average_before": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "config": {**args_config(args), "targets": target_source, "image_size": size, "run_order": list(runs),
                   "seeds": "uniform noise, one generator per item (invert.noise_images)"},
        "one_step_max_pixel_difference": one_step_gap,
        "anchor_forwards_per_step": ANCHOR_FORWARDS_PER_STEP if with_anchor else None,
        # The engine's default on CUDA (its shards equal the unsharded run); the anchor runs cuDNN's defaults.
        "engine_deterministic_cudnn": InvertConfig().deterministic,
        "flops_per_item_step": step_flops,
        "bf16_peak_tflops": peak,
    }

    # Repeats go round-robin over the runs, starting one run later each time, and keep each run's
    # fastest time, so neither a change in the machine's load nor a run's position favours a run.
    seconds = {name: [] for name in runs}
    outputs, distances = {}, {}
    names = list(runs)
    for repeat in range(args.repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            sync(device)
            start = time.perf_counter()
            outputs[name] = runs[name]()
            sync(device)
            seconds[name].append(time.perf_counter() - start)
            print(f"{name:16s} {seconds[name][-1]:8.2f} s", flush=True)
            with torch.no_grad():  # quality: every run's images through the same fp32 objective
                distances[name] = objective(outputs[name][0]).float()
            # Rewritten after every run: a job cut short by its time limit keeps what it finished.
            results = summarise(args, outputs, distances, seconds, engine_settings, step_flops, peak)
            report.update(results=results, **compare_runs(args, results, distances, outputs),
                          load_average_after=os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
            write_result(report, "inversion", device, args.out)
    for name, result in report["results"].items():
        fraction = result["fraction_of_bf16_peak"]
        print(f"{name:16s} best {result['seconds']:8.2f} s  {result['items_per_s']:8.3f} items/s  {result['item_steps_per_s']:9.1f} item-steps/s  "
              f"{result['tflops']:7.3f} TFLOP/s ({fraction if isinstance(fraction, str) else f'{fraction:.1%}'} of bf16 peak)  "
              f"median distance {result['median_final_distance']:.4f}" + (f"  [{result['loop']}]" if "loop" in result else ""), flush=True)
    for name, result in report["results"].items():
        if "speedup_vs_anchor" in result and name != "anchor":
            print(f"{name:16s} {result['speedup_vs_anchor']:.2f}x faster than the anchor, median distance x{result['distance_ratio_vs_anchor']:.3f}, "
                  f"closer than the anchor on {result['better_than_anchor_on_items']} of {args.items} items")
    stopping = report.get("early_stopping")
    if stopping:
        print(f"early stopping (patience {args.patience}, rtol {args.rtol:g}): median distance x{stopping['median_distance_ratio']:.3f}, "
              f"{stopping['items_worse']} of {args.items} items worse by more than {WORSE_BY:.0%}, "
              f"{stopping['item_steps_saved']:.1%} of item-steps saved ({stopping['item_steps_computed_saved']:.1%} of those computed), "
              f"{stopping['speedup']:.2f}x faster than engine-best")
    return report


def summarise(args, outputs: dict, distances: dict, seconds: dict, engine_settings: dict, step_flops: float, peak: float | None) -> dict:
    """Each finished run's speed and quality (``distances``: its items' final distances)."""
    results = {}
    for name, (_, engine_result) in outputs.items():
        fastest = min(seconds[name])
        distance = distances[name]
        # The work the device did: every item-step for the anchor, the engine's own count for ours.
        computed = engine_result.item_steps_computed if engine_result is not None else args.items * args.steps
        speed = throughput(args.items * args.steps, fastest, step_flops, peak)
        speed["tflops"] = computed * step_flops / fastest / 1e12
        if peak:
            speed["fraction_of_bf16_peak"] = speed["tflops"] / peak
        results[name] = {
            "seconds": fastest,
            "all_seconds": seconds[name],
            "items_per_s": args.items / fastest,
            **speed,
            "item_steps_computed": computed,
            "median_final_distance": distance.median().item(),
            "mean_final_distance": distance.mean().item(),
            "final_distances": [round(d, 6) for d in distance.tolist()],
        }
        if engine_result is not None:
            results[name].update(settings=dict(engine_settings[name]), loop=engine_result.loop, micro_batch=engine_result.micro_batch,
                                 mean_steps_used=engine_result.steps_used.float().mean().item())
    return results


def compare_runs(args, results: dict, distances: dict, outputs: dict) -> dict:
    """The ratios against the anchor (added to ``results``) and what early stopping cost, where both runs finished."""
    if "anchor" in results:
        for name, result in results.items():
            result["better_than_anchor_on_items"] = int((distances[name] < distances["anchor"]).sum())
            result["speedup_vs_anchor"] = results["anchor"]["seconds"] / result["seconds"]
            result["distance_ratio_vs_anchor"] = result["median_final_distance"] / results["anchor"]["median_final_distance"]
    if not {"engine-best", "engine-best-stop"} <= set(results):
        return {"early_stopping": None}
    full, stopped = distances["engine-best"], distances["engine-best-stop"]
    stopped_result = outputs["engine-best-stop"][1]
    return {"early_stopping": {
        "patience": args.patience,
        "rtol": args.rtol,
        "median_distance_ratio": results["engine-best-stop"]["median_final_distance"] / results["engine-best"]["median_final_distance"],
        "items_worse": int((stopped > full * (1 + WORSE_BY)).sum()),
        "worse_by": WORSE_BY,
        "item_steps_saved": 1 - stopped_result.steps_used.sum().item() / (args.items * args.steps),
        "item_steps_computed_saved": 1 - stopped_result.item_steps_computed / (args.items * args.steps),
        "speedup": results["engine-best"]["seconds"] / results["engine-best-stop"]["seconds"],
    }}


if __name__ == "__main__":
    main()
