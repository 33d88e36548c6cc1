"""The whole ``python -m perceptual measure`` pipeline, timed end to end and by stage.

Runs the command's own code (``perceptual.pipelines.measure.run`` on the Hydra config ``measure``) and
times its stages by wrapping the functions it calls (inclusive times; the controversial stage includes
its own observers):

* ``build``: model construction and checkpoint loading;
* ``inversion``: ``stimuli.make_inversion_set`` (the engine: all targets x seed types of one model);
* ``accuracy``: clean and robust accuracy (PGD);
* ``observe``: the observers judging the inversion sets;
* ``controversial``: the controversial set of the model pair and its judgement.

Paper scale (the issue's workload): two CIFAR-10 ResNet18, ``invert=paper`` (5000 steps), 100 targets
x (noise, train) seeds, controversial stimuli from 20 origins x 3 restarts. Without ``--checkpoints`` the
models get seeded random weights (speed does not depend on them; the alignment numbers then mean
nothing). ``--scale tiny`` runs two small CNNs on scikit-learn's digits in seconds (the test).

``--engine best`` (the default) runs the preset with the engine's fast settings, ``precision=auto``
(bf16 on CUDA), ``channels_last=true`` and ``cuda_graph=auto``, as the README's GPU example does;
``--engine paper`` runs the preset as it is (fp32, eager), the issue's 232 s anchor on an H100.
``--invert KEY=VALUE`` overrides come after either.

    python benchmarks/bench_measure.py                                   # paper scale (a GPU job)
    python benchmarks/bench_measure.py --engine paper                    # the preset as it is: fp32, no graph
    python benchmarks/bench_measure.py --checkpoints standard.pt robust.pt --data-root ~/data
    python benchmarks/bench_measure.py --scale tiny                      # seconds, CPU
"""
from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results_io import environment, write_result  # noqa: E402  (this folder is on sys.path when run as a script)

import stimuli  # noqa: E402
from perceptual import measure as measure_module  # noqa: E402
from perceptual.pipelines.measure import run as run_measure  # noqa: E402
from training.checkpoints import save_checkpoint  # noqa: E402
from training.models import build_model  # noqa: E402

CIFAR_MINI = REPO.parent / "shared" / "data" / "cifar-10-mini"
SCALES = {
    # The workload: two ResNet18, invert=paper, 100 targets, controversial 20 origins x 3 restarts.
    "paper": dict(data="cifar10", arch="resnet18", kwargs={}, n_targets=100, invert="paper", steps=None,
                  origins=20, restarts=3, controversial_steps=None, accuracy_limit=None, threat_steps=20),
    "tiny": dict(data="digits", arch="small_cnn", kwargs={"width": 8}, n_targets=4, invert="fast", steps=20,
                 origins=2, restarts=2, controversial_steps=10, accuracy_limit=40, threat_steps=2),
}
STAGES = ("build", "inversion", "accuracy", "observe", "controversial")
ENGINES = {"best": ["precision=auto", "channels_last=true", "cuda_graph=auto"], "paper": []}  # on top of the scale's preset


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="paper")
    parser.add_argument("--checkpoints", nargs=2, default=None, metavar=("A", "B"), help="the two models' weights (default: seeded random)")
    parser.add_argument("--data-root", type=Path, default=CIFAR_MINI, help="folder holding cifar-10-batches-py/ (paper scale)")
    parser.add_argument("--observers", nargs="+", default=["auto"], help="observer names, or auto (the command's default panel)")
    parser.add_argument("--engine", choices=sorted(ENGINES), default="best",
                        help="best: the preset with precision=auto, channels_last=true, cuda_graph=auto; paper: the preset as it is")
    parser.add_argument("--invert", nargs="*", default=[], metavar="KEY=VALUE", help="more engine overrides, e.g. micro_batch=400")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on CPU")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/measure_<scale>_<engine>_<device>.json)")
    return parser.parse_args(argv)


def random_checkpoints(scale: dict, folder: Path) -> list[Path]:
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        paths.append(save_checkpoint(build_model(scale["arch"], scale["data"], **scale["kwargs"]), folder / f"model{seed}.safetensors"))
    return paths


def overrides(args, scale: dict, checkpoints: list[Path], out: Path) -> list[str]:
    kwargs = "{" + ",".join(f"{k}:{v}" for k, v in scale["kwargs"].items()) + "}"
    models = ",".join(f"{{name:{scale['arch']},checkpoint:'{path}',label:{label},kwargs:{kwargs}}}"
                      for path, label in zip(checkpoints, ("model_a", "model_b")))
    observers = args.observers[0] if args.observers == ["auto"] else "[" + ",".join(args.observers) + "]"
    values = [
        f"data={scale['data']}", f"invert={scale['invert']}", f"models=[{models}]", f"n_targets={scale['n_targets']}",
        f"out='{out}'", f"device={args.device}", f"observers={observers}", f"threat.steps={scale['threat_steps']}",
        f"controversial={{model_a:model_a,model_b:model_b,lambda_:0.1,n_origins:{scale['origins']},restarts:{scale['restarts']},"
        f"steps:{scale['controversial_steps'] if scale['controversial_steps'] else 'null'}}}",
    ]
    if scale["data"] == "cifar10":
        values.append(f"data.root='{args.data_root}'")
    if scale["accuracy_limit"]:
        values.append(f"accuracy_limit={scale['accuracy_limit']}")
    if scale["steps"]:
        values.append(f"invert.steps={scale['steps']}")
    return values + [f"invert.{item}" for item in ENGINES[args.engine] + args.invert]


class StageTimer:
    """Wraps the pipeline's functions and sums their wall time per stage (CUDA synchronised at both ends)."""

    def __init__(self, device: torch.device):
        self.device, self.seconds, self.calls, self._patches = device, defaultdict(float), defaultdict(int), []

    def wrap(self, owner, name: str, stage: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            self._sync()
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self._sync()
                self.seconds[stage] += time.perf_counter() - start
                self.calls[stage] += 1

        setattr(owner, name, timed)
        self._patches.append((owner, name, original))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def restore(self) -> None:
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)


def compose(values: list[str]):
    import hydra

    with hydra.initialize_config_module(config_module="conf", version_base=None):
        return hydra.compose(config_name="measure", overrides=values)


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    scale = SCALES[args.scale]
    if scale["data"] == "cifar10" and not (args.data_root / "cifar-10-batches-py").is_dir():
        raise SystemExit(f"paper scale needs CIFAR-10: no cifar-10-batches-py/ under {args.data_root} (pass --data-root)")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        checkpoints = [Path(p) for p in args.checkpoints] if args.checkpoints else random_checkpoints(scale, scratch)
        cfg = compose(overrides(args, scale, checkpoints, scratch / "report"))
        timer = StageTimer(device)
        timer.wrap(measure_module, "build_model", "build")
        timer.wrap(stimuli, "make_inversion_set", "inversion")
        timer.wrap(measure_module, "model_accuracy", "accuracy")
        timer.wrap(measure_module, "observe_set", "observe")
        timer.wrap(measure_module, "measure_controversial", "controversial")
        started = time.perf_counter()
        try:
            data = run_measure(cfg)
        finally:
            timer.restore()
        total = time.perf_counter() - started
    stages = {stage: round(timer.seconds[stage], 3) for stage in STAGES}
    print(f"measure ({args.scale} scale, engine {args.engine}) on {environment(device)['device']}: {total:.1f} s end to end")
    for stage in STAGES:
        print(f"  {stage:14s} {stages[stage]:9.2f} s  ({timer.calls[stage]} call(s))")
    report = {
        **environment(device),
        "device_type": device.type,
        "config": {"scale": args.scale, **scale, "checkpoints": [str(p) for p in args.checkpoints] if args.checkpoints else "seeded random weights",
                   "observers": args.observers, "engine": args.engine, "invert_overrides": ENGINES[args.engine] + args.invert},
        "seconds": total,
        "stage_seconds": stages,
        "stage_calls": dict(timer.calls),
        "pipeline_seconds": data.get("seconds"),
        "median_final_distance": {label: m["median_final_distance"] for label, m in data["models"].items()},
    }
    write_result(report, f"measure_{args.scale}_{args.engine}", device, args.out)
    return report


if __name__ == "__main__":
    main()
