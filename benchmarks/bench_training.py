"""Training throughput: ``python -m training`` against the `robustness` library and a plain DataLoader loop.

Standard and PGD training of the CIFAR ResNet18, the same images, batch size, optimizer (SGD 0.1,
momentum 0.9, weight decay 5e-4), augmentation (the library's CIFAR transform: crop with 4-pixel
padding, flip, colour jitter 0.25, rotation 2 degrees) and attack (L2, eps 1.0, ``--pgd-steps``
steps of 2.5 eps / steps from a random start, last iterate, batch norm in eval mode), four ways:

1. ``ours``: ``training.trainer.train`` (the command's code path): data on the device as uint8,
   augmentation on the device, channels-last, no host syncs in the step loop, the attack on the
   model with batch norm folded into its convolutions (``training.folding``); ``precision=auto``
   (bf16 on CUDA, fp32 on CPU).
2. ``robustness``: the library's ``train.train_model`` (1.2.1.post2, patched for torch 2.x/CPU by
   ``benchmarks/robustness_compat.py``) with its own ``cifar_models.resnet18``, ``AttackerModel`` and
   ``TRAIN_TRANSFORMS_DEFAULT(32)``; its loaders are built from the same in-memory images
   (``make_loaders`` would try to download CIFAR), ``use_best=0`` and ``random_start=1`` so the
   attack equals ours.
3. ``dataloader``: a plain PyTorch loop: ``torch.utils.data.DataLoader`` over PIL images with the
   same torchvision transforms, our zoo ResNet18 in the default memory format, our ``pgd``.
4. ``kernels``: no data pipeline at all (the images already on the device as float channels-last
   batches, no augmentation) and ``ours``' arithmetic (training step, folded attack, SGD's fused
   kernel, the same precision: bf16 autocast on CUDA as ``precision=auto`` resolves, fp32 elsewhere),
   launched eagerly: the ceiling of any eager pipeline built on the same kernels.
   ``ours / kernels`` near 1 means the remaining time is the kernels' and their launches'.
5. ``ours-graph`` (with ``--cuda-graph``): ``ours`` with ``train.cuda_graph=true``, the whole step
   (attack, forward, backward, SGD) replayed as one CUDA graph (``training.step``), which removes
   the launches and can pass the eager ceiling. Off CUDA it runs the captured step's structure
   eagerly (no graphs there), so on a CPU it only shows that the path works.

Each runs ``--epochs`` epochs (default 2) and reports the throughput of the last one, in training
images per second (data loading and augmentation included, evaluation and checkpointing excluded),
by the wall clock and per second of this process's CPU time (steadier on a shared machine; DataLoader
worker processes are not counted, so with ``--workers`` > 0 the CPU-time ratios favour the baselines):
``ours`` from its ``metrics.jsonl``, the library through its ``epoch_hook``/``iteration_hook``
callbacks, the plain loop with a timer. The contenders take turns ``--repeats`` times (default 3)
and the median is reported, with every repeat's value; the ratios are given both between the
medians and as the median of each repeat's ratio (neighbours in time, robust to the machine's
drifts). DataLoaders use ``--workers`` processes (default 0: on a two-core machine worker
processes only compete with the compute threads). The ``robustness`` and ``dataloader`` contenders run
in fp32 (the library's only mixed precision is apex's fp16), so on CUDA the ratios against them include
what bf16 gains; ``kernels`` and ``ours`` share their precision. Each median is also given in achieved TFLOP/s,
with its share of the GPU's dense bf16 peak: one training step's FLOPs per image (the attack's forwards and
backwards to the input, the training forward and backward), counted by ``torch.utils.flop_counter`` in
``throughput.flops_per_training_image``, times images/s. Every contender does the same work, so the fp32
baselines' share is of a peak they do not aim at.

Data: the first ``--images`` images of the CIFAR-10 subset at ``../shared/data/cifar-10-mini`` when
present, else random images written in CIFAR's pickle layout (throughput does not depend on content).
Writes ``benchmarks/results/training_<device>.json`` with device, versions, config, results, ratios.

    python benchmarks/bench_training.py                      # CPU: 256 images, batch 64, 7 PGD steps, all cores
    python benchmarks/bench_training.py --images 10000 --batch-size 128 --workers 8   # GPU
    python benchmarks/bench_training.py ... --compile        # ours with torch.compile
    python benchmarks/bench_training.py --images 10000 --batch-size 128 --modes pgd --cuda-graph   # + the captured step
"""
from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_io import device_name, environment, write_result  # noqa: E402  (this folder is on sys.path when run as a script)
from robustness_compat import import_robustness  # noqa: E402  (this folder)
from throughput import bf16_peak_tflops, flops_per_training_image, throughput  # noqa: E402  (this folder)

from invert.validation import hot_loop  # noqa: E402
from training.attacks import ThreatModel, attack_mode, bn_mode, pgd  # noqa: E402
from training.data import load_dataset  # noqa: E402
from training.models import build_model  # noqa: E402

CIFAR_MINI = REPO.parent / "shared" / "data" / "cifar-10-mini"
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 5e-4


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256, help="training images per epoch")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2,
                        help="epochs per run; the last one is timed (with 1, the library's setup falls inside its timed epoch)")
    parser.add_argument("--pgd-steps", type=int, default=7, help="attack steps (7: the pgd recipe's default)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per contender, interleaved; the median is reported")
    parser.add_argument("--eps", type=float, default=1.0, help="L2 radius of the training attack")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes of the two baselines")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--modes", nargs="+", default=["standard", "pgd"], choices=["standard", "pgd"])
    parser.add_argument("--runs", nargs="+", default=["ours", "robustness", "dataloader", "kernels"],
                        choices=["ours", "ours-graph", "robustness", "dataloader", "kernels"])
    parser.add_argument("--compile", action="store_true",
                        help="ours: train.compile=true (torch.compile; compiling falls in the first, untimed epoch)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="add ours-graph: ours with train.cuda_graph=true (the step replayed as one CUDA graph; "
                             "capture falls in the first, untimed epoch; off CUDA the same structure runs eagerly)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/training_<device>.json)")
    args = parser.parse_args(argv)
    for name in ("images", "batch_size", "epochs", "pgd_steps", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.images < args.batch_size:
        parser.error(f"--images {args.images} is less than one batch (--batch-size {args.batch_size}): nothing would be timed")
    if not args.eps > 0:
        parser.error(f"--eps must be positive, got {args.eps}")
    if args.cuda_graph and args.compile:
        parser.error("--cuda-graph and --compile both want to own the step's graphs: run them separately")
    if args.cuda_graph and "ours-graph" not in args.runs:
        args.runs = ["ours-graph", *args.runs]
    return args


def prepare_data(args, workdir: Path) -> tuple[Path, str]:
    """A CIFAR-10 pickle folder holding the benchmark's images: the real subset, or random images."""
    if (CIFAR_MINI / "cifar-10-batches-py").is_dir():
        real = load_dataset("cifar10", "train", root=CIFAR_MINI)
        if len(real) >= args.images:
            return CIFAR_MINI, f"cifar-10-mini (first {args.images} of {len(real)} images)"
    folder = workdir / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    n = max(args.images, args.batch_size)
    for name, count in [(f"data_batch_{i}", n if i == 1 else 0) for i in range(1, 6)] + [("test_batch", 64)]:
        batch = {"data": rng.integers(0, 256, (count, 3072), dtype=np.uint8), "labels": rng.integers(0, 10, count).tolist()}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{k}" for k in range(10)]}, f)
    return workdir, "random images in CIFAR's layout"


def first_images(root: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` training images (HWC uint8) and labels: what the baselines' loaders serve."""
    data = load_dataset("cifar10", "train", root=root)
    return data.images[:n].permute(0, 2, 3, 1).numpy(), data.labels[:n].numpy()


class ImageDataset(torch.utils.data.Dataset):
    """In-memory HWC uint8 images → PIL → ``transform``, like torchvision's CIFAR10 class."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        from PIL import Image

        return self.transform(Image.fromarray(self.images[i])), int(self.labels[i])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_ours(args, mode: str, root: Path, workdir: Path, cuda_graph: bool = False) -> dict:
    from hydra import compose, initialize_config_dir

    from conf import CONFIG_DIR
    from training.trainer import train

    overrides = [
        "model=resnet18", "data=cifar10", f"data.root={root}", f"train={mode}",
        f"run_dir={workdir / ('ours-graph-' + mode if cuda_graph else 'ours-' + mode)}",
        f"train.epochs={args.epochs}", f"train.batch_size={args.batch_size}", f"data_limit.train={args.images}", "data_limit.test=64",
        f"train.optimizer.lr={LR}", f"train.optimizer.momentum={MOMENTUM}", f"train.optimizer.weight_decay={WEIGHT_DECAY}",
        "train.schedule.name=constant", "train.eval.every=0", "train.eval.final_subset=0", "progress=false", f"device={args.device}",
        "keep_checkpoints=1", f"train.compile={str(args.compile).lower()}", f"train.cuda_graph={str(cuda_graph).lower()}",
    ]
    if mode == "pgd":
        overrides += ["train.attack.norm=l2", f"train.attack.eps={args.eps}", f"train.attack.steps={args.pgd_steps}",
                      "train.attack.random_start=true", "train.attack_bn=eval"]
    with initialize_config_dir(str(CONFIG_DIR), version_base=None):
        cfg = compose("train", overrides=overrides)
    # data_limit picks a seeded sample; the baselines take the first images: same count, same kind of data.
    result = train(cfg)
    last = result.summary["history"][-1]
    return {"images_per_second": last["images_per_second"], "epoch_seconds": last["epoch_seconds"],
            "images_per_cpu_second": last["images_per_second"] * last["epoch_seconds"] / last["epoch_cpu_seconds"],
            "precision": result.summary["precision"], "channels_last": result.summary["channels_last"], "compile": result.summary["compile"],
            "cuda_graph": result.summary["cuda_graph"]}


def run_robustness(args, mode: str, root: Path, workdir: Path, device: torch.device) -> dict:
    import_robustness()  # the library, patched for torch 2.x and CPU
    from robustness import data_augmentation, datasets, model_utils
    from robustness import train as rtrain

    images, labels = first_images(root, args.images)
    test_images, test_labels = images[:16], labels[:16]
    train_loader = torch.utils.data.DataLoader(ImageDataset(images, labels, data_augmentation.TRAIN_TRANSFORMS_DEFAULT(32)),
                                               batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                               drop_last=True, pin_memory=device.type == "cuda")
    val_loader = torch.utils.data.DataLoader(ImageDataset(test_images, test_labels, data_augmentation.TEST_TRANSFORMS_DEFAULT(32)),
                                             batch_size=16, num_workers=0)
    dataset = datasets.CIFAR(str(root))
    model, _ = model_utils.make_and_restore_model(arch="resnet18", dataset=dataset)
    marks: dict[str, float] = {}
    last_epoch = args.epochs - 1
    counter = {"epoch": 0, "batches": 0}
    last_batch = len(train_loader) - 1

    def iteration_hook(model, i, loop_type, inp, target):
        if loop_type == "train" and counter["epoch"] == last_epoch:
            counter["batches"] += 1
            if i == last_batch:  # a sync after every step kept the library's host work from overlapping the GPU's
                sync(device)
                marks["end"], marks["cpu_end"] = time.perf_counter(), time.process_time()

    def epoch_hook(model, log_info):
        counter["epoch"] += 1
        if counter["epoch"] == last_epoch:
            sync(device)
            marks["start"], marks["cpu_start"] = time.perf_counter(), time.process_time()

    out_dir = workdir / f"robustness-{mode}"
    out_dir.mkdir(parents=True, exist_ok=True)
    train_args = SimpleNamespace(
        out_dir=str(out_dir), epochs=args.epochs, lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, step_lr=None,
        step_lr_gamma=0.1, custom_lr_multiplier=None, lr_interpolation="step", adv_train=int(mode == "pgd"), adv_eval=0,
        log_iters=1, save_ckpt_iters=-1, mixed_precision=0, constraint="2", eps=args.eps, attack_lr=2.5 * args.eps / args.pgd_steps,
        attack_steps=args.pgd_steps, use_best=0, random_restarts=0, random_start=1, custom_eps_multiplier=None,
        iteration_hook=iteration_hook, epoch_hook=epoch_hook,
    )
    if args.epochs == 1:
        marks["start"], marks["cpu_start"] = time.perf_counter(), time.process_time()
    rtrain.train_model(train_args, model, (train_loader, val_loader))
    seconds, cpu_seconds = marks["end"] - marks["start"], marks["cpu_end"] - marks["cpu_start"]
    done = counter["batches"] * args.batch_size
    return {"images_per_second": done / seconds, "epoch_seconds": seconds, "images_per_cpu_second": done / cpu_seconds,
            "precision": "fp32", "channels_last": False}


def run_dataloader(args, mode: str, root: Path, device: torch.device) -> dict:
    from torchvision import transforms

    images, labels = first_images(root, args.images)
    transform = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(),
                                    transforms.ColorJitter(0.25, 0.25, 0.25), transforms.RandomRotation(2), transforms.ToTensor()])
    loader = torch.utils.data.DataLoader(ImageDataset(images, labels, transform), batch_size=args.batch_size, shuffle=True,
                                         num_workers=args.workers, drop_last=True, pin_memory=device.type == "cuda")
    model = build_model("resnet18", "cifar10").to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    threat = ThreatModel("l2", args.eps, steps=args.pgd_steps, random_start=True)
    criterion = torch.nn.CrossEntropyLoss()
    seconds, cpu_seconds, done = 0.0, 0.0, 0
    for _ in range(args.epochs):
        sync(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        done = 0
        with hot_loop():  # the range check would cost a sync per forward; the loop's typical code has none
            for x, y in loader:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                if mode == "pgd":
                    with bn_mode(model, "eval"):
                        x = pgd(model, x, y, threat)
                loss = criterion(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                done += len(y)
        sync(device)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return {"images_per_second": done / seconds, "epoch_seconds": seconds, "images_per_cpu_second": done / cpu_seconds,
            "precision": "fp32", "channels_last": False}


def run_kernels_only(args, mode: str, root: Path, device: torch.device) -> dict:
    """The same arithmetic with no data pipeline at all: the images already on the device as float
    channels-last batches, no augmentation, then ``ours``' training step (and, for PGD, its folded
    attack). The ceiling of any pipeline built on the same convolution kernels, so ``ours / kernels``
    shows how much overhead is left."""
    images, labels = first_images(root, args.images)
    batches = args.images // args.batch_size
    x_all = torch.from_numpy(images).to(device).permute(0, 3, 1, 2).float().div(255)
    x_all = x_all[: batches * args.batch_size].contiguous(memory_format=torch.channels_last).split(args.batch_size)
    y_all = torch.from_numpy(labels).long().to(device)[: batches * args.batch_size].split(args.batch_size)
    model = build_model("resnet18", "cifar10").to(device).to(memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, fused=True)  # as ours
    threat = ThreatModel("l2", args.eps, steps=args.pgd_steps, random_start=True)
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()  # what ours' precision=auto resolves to
    with hot_loop():
        for _ in range(args.epochs):
            sync(device)
            start, cpu_start = time.perf_counter(), time.process_time()
            for x, y in zip(x_all, y_all):
                # As ours' TrainStep: the attack and the forward under autocast without its weight-cast cache.
                with torch.autocast(device.type, dtype=torch.bfloat16 if bf16 else torch.float32, enabled=bf16, cache_enabled=False):
                    if mode == "pgd":
                        with attack_mode(model, "eval") as target:
                            x = pgd(target, x, y, threat)
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            sync(device)
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    done = batches * args.batch_size
    return {"images_per_second": done / seconds, "epoch_seconds": seconds, "images_per_cpu_second": done / cpu_seconds,
            "precision": "bf16" if bf16 else "fp32", "channels_last": True}


def check_same_work(args, root: Path) -> dict:
    """Before anything is timed, that the contenders compute the same thing, in fp32 on the CPU (a GPU's TF32
    convolutions would blur the comparison; the algorithms are what is checked) from one set of weights and a batch of up
    to 32 images: one step of the library's attack (its ``AttackerModel``, our weights loaded into its ResNet18) and of ours,
    on the model as the plain loop attacks it and with batch norm folded as ``ours`` and ``kernels`` do, give the same
    adversarial images; the plain loop's SGD and ``kernels``' fused SGD, given the same gradients, the same weights.
    Returns the largest gaps; stops the benchmark where one is more than rounding. (This random network's input
    gradient is itself only good to about 1e-3 of a step in fp32: the plain attack differs from its float64 twin by
    4e-4 per pixel, the folded one by 1e-4; another step rule would differ by about a step.)

    One step, from images inside (0, 1): the library normalises its input through a clamp, which under the torch
    releases that pass no gradient at a clamp's bounds (README: ``invert.stop_at_bounds``) freezes the pixels that
    reach 0 or 1, where ours keep their gradient. Later steps then differ on those pixels: the same work (the same
    forwards and backwards), slightly different images."""
    import_robustness()
    from robustness import datasets, model_utils

    device = torch.device("cpu")
    images, labels = first_images(root, min(args.batch_size, 32))
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255) * 0.96 + 0.02  # no pixel on a bound
    y = torch.from_numpy(labels).long()
    threat = ThreatModel("l2", args.eps, steps=1, step_size=2.5 * args.eps / args.pgd_steps, random_start=False)
    torch.manual_seed(0)
    plain_model = build_model("resnet18", "cifar10").to(device).train()
    kernels_model = build_model("resnet18", "cifar10").to(device).to(memory_format=torch.channels_last).train()
    kernels_model.load_state_dict(plain_model.state_dict())
    library, _ = model_utils.make_and_restore_model(arch="resnet18", dataset=datasets.CIFAR(str(root)))
    library.model.load_state_dict(plain_model.net.state_dict())
    library = library.to(device).eval()
    with hot_loop():
        with bn_mode(plain_model, "eval"):
            plain = pgd(plain_model, x, y, threat)
        with attack_mode(kernels_model, "eval") as target:
            folded = pgd(target, x.contiguous(memory_format=torch.channels_last), y, threat)
        _, theirs = library(x, y, make_adv=True, constraint="2", eps=args.eps, step_size=threat.alpha, iterations=1, random_start=False,
                            use_best=False)
        torch.nn.functional.cross_entropy(plain_model(plain), y).backward()
        for mine, theirs_ in zip(kernels_model.parameters(), plain_model.parameters()):
            mine.grad = torch.empty_like(mine).copy_(theirs_.grad)  # in the parameter's own (channels-last) layout, as autograd gives it
        for model, fused in ((plain_model, False), (kernels_model, True)):
            torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, fused=fused).step()
    with torch.no_grad():
        weights = max(float((a - b).abs().max()) for a, b in zip(plain_model.parameters(), kernels_model.parameters()))
    gaps = {"attack_step_library_vs_plain": float((theirs - plain).abs().max()), "attack_step_folded_vs_plain": float((folded - plain).abs().max()),
            "sgd_step_fused_vs_plain": weights}
    print("same work: " + ", ".join(f"{name} {gap:.1e}" for name, gap in gaps.items()))
    limits = {"attack_step_library_vs_plain": 1e-2 * threat.alpha, "attack_step_folded_vs_plain": 1e-2 * threat.alpha, "sgd_step_fused_vs_plain": 1e-6}
    wrong = {name: gap for name, gap in gaps.items() if not gap <= limits[name]}
    if wrong:
        raise SystemExit(f"the contenders do not compute the same thing ({wrong}, limits {limits}): the ratios would compare different work")
    return gaps


def median_result(runs: list[dict]) -> dict:
    """The median of repeated measurements (throughputs and epoch time), with every repeat's throughput."""
    result = dict(runs[0])
    for key in ("images_per_second", "images_per_cpu_second", "epoch_seconds"):
        result[key] = float(np.median([run[key] for run in runs]))
    result["repeats_images_per_second"] = [run["images_per_second"] for run in runs]
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from training.config import resolve_device

    device = resolve_device(args.device)
    measured: dict[str, list[dict]] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_training_") as tmp:
        root, data_note = prepare_data(args, Path(tmp))
        print(f"data: {data_note}; device: {device_name(device)}; load average before: {load_before}")
        same_work = check_same_work(args, root) if "pgd" in args.modes else None
        # Contenders take turns, repeat after repeat, so that a slow spell of a shared machine hits all.
        for repeat in range(args.repeats):
            workdir = Path(tmp) / f"repeat{repeat}"
            for mode in args.modes:
                for run in args.runs:
                    torch.manual_seed(0)
                    if run in ("ours", "ours-graph"):
                        result = run_ours(args, mode, root, workdir, cuda_graph=run == "ours-graph")
                    elif run == "robustness":
                        result = run_robustness(args, mode, root, workdir, device)
                    elif run == "dataloader":
                        result = run_dataloader(args, mode, root, device)
                    else:
                        result = run_kernels_only(args, mode, root, device)
                    measured.setdefault(f"{mode}/{run}", []).append(result)
                    print(f"[{repeat + 1}/{args.repeats}] {mode:8s} {run:11s} {result['images_per_second']:8.1f} images/s, "
                          f"{result['images_per_cpu_second']:8.1f} images per CPU-second ({result['epoch_seconds']:.1f} s for the timed epoch)")
    results = {key: median_result(runs) for key, runs in measured.items()}
    # The same work for every contender (ResNet18's matmuls and convolutions), so TFLOP/s rank as images/s do.
    peak = bf16_peak_tflops(device)
    probe = torch.rand(2, 3, 32, 32), torch.tensor([0, 1])
    flops = {mode: flops_per_training_image(build_model("resnet18", "cifar10"), *probe, args.pgd_steps if mode == "pgd" else 0)
             for mode in args.modes}
    print(f"one training step = {', '.join(f'{flops[m] / 1e9:.2f} GFLOP per image ({m})' for m in args.modes)}; "
          f"dense bf16 peak: {f'{peak:.0f} TFLOP/s' if peak else 'n.a.'}")
    for key, result in results.items():
        mode = key.split("/")[0]
        speed = throughput(result["images_per_second"], 1.0, flops[mode], peak)  # the images of one second
        result["tflops"], result["fraction_of_bf16_peak"] = speed["tflops"], speed["fraction_of_bf16_peak"]
        fraction = result["fraction_of_bf16_peak"]
        print(f"{key:22s} {result['images_per_second']:8.1f} images/s {result['tflops']:7.3f} TFLOP/s "
              f"({fraction if isinstance(fraction, str) else f'{fraction:.1%}'} of bf16 peak, {result['precision']})")
    ratios = {}
    for mode in args.modes:
        for mine, others in (("ours", ("robustness", "dataloader", "kernels")), ("ours-graph", ("robustness", "dataloader", "kernels", "ours"))):
            ours = results.get(f"{mode}/{mine}")
            for other in others:
                if ours and f"{mode}/{other}" in results:
                    theirs = results[f"{mode}/{other}"]
                    ratios[f"{mode}: {mine} / {other}"] = ours["images_per_second"] / theirs["images_per_second"]
                    ratios[f"{mode}: {mine} / {other} (CPU time)"] = ours["images_per_cpu_second"] / theirs["images_per_cpu_second"]
                    # Ratios within each repeat (neighbours in time), then their median: robust to slow drifts of the machine.
                    paired = [a / b for a, b in zip(ours["repeats_images_per_second"], theirs["repeats_images_per_second"])]
                    ratios[f"{mode}: {mine} / {other} (median of paired repeats)"] = float(np.median(paired))
    for name, ratio in ratios.items():
        print(f"{name:56s} {ratio:.2f}x")
    report = {
        "benchmark": "training throughput (images/s of the last epoch, median of the repeats)",
        **environment(device),
        "load_average_before": load_before,  # other jobs on a shared machine slow every contender
        "load_average_after": os.getloadavg(),
        "data": data_note,
        "config": {"arch": "resnet18", "images": args.images, "batch_size": args.batch_size, "epochs": args.epochs,
                   "timed_epoch": args.epochs, "repeats": args.repeats, "pgd": {"norm": "l2", "eps": args.eps, "steps": args.pgd_steps,
                   "step_size": 2.5 * args.eps / args.pgd_steps, "random_start": True, "bn": "eval"},
                   "optimizer": {"lr": LR, "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY},
                   "augmentation": "crop pad 4 + flip + colour jitter 0.25 + rotation 2", "workers": args.workers,
                   "compile_ours": args.compile, "cuda_graph_ours_graph": args.cuda_graph},
        "same_work_max_gaps": same_work,  # check_same_work: the attacks and one training step agree before anything is timed
        "flops_per_training_image": flops,
        "bf16_peak_tflops": peak,
        "results": results,
        "ratios": ratios,
    }
    write_result(report, "training", device, args.out)
    return report


if __name__ == "__main__":
    main()
