"""The training loop behind ``python -m training``: any recipe, any zoo model, one or many GPUs.

:func:`train` takes the composed config (``conf/train.yaml``: ``model``, ``data``, ``train`` and the
run settings) and returns a :class:`TrainResult`. The loop is built for a GPU:

* the whole training set lives on the device as uint8; each epoch is one seeded permutation cut
  into fixed-size batches (the last partial batch is dropped), so no DataLoader and no host copies;
* augmentation runs on the device inside the recipe (``training.augment``);
* nothing in the step loop waits for the device: losses and accuracies accumulate as device
  tensors and are read once per epoch (and every ``progress_every`` steps for the progress bar);
  the step loop runs inside ``invert.validation.hot_loop()``, the data having been validated once;
* bf16 autocast (``precision``), channels-last memory (``channels_last``) and ``torch.compile``
  (``compile``) are options; under ``torchrun`` (``WORLD_SIZE`` > 1) every process trains a batch of
  ``batch_size`` through ``DistributedDataParallel``, so the global batch is ``batch_size × WORLD_SIZE`` at the
  same learning rate (divide ``train.batch_size`` by the process count to keep a recipe's batch);
* ``cuda_graph`` (false | true | auto) replays the whole step (attack, forward, backward, optimizer
  step) as one CUDA graph (``training.step``); an execution setting like ``compile``: it changes
  neither the result nor what a resumed run must match.

Checkpoints are written every ``save_every`` epochs (``training.run``); ``resume=true`` continues
from the last one and, on one process, reproduces the uninterrupted run exactly (the RNG states are
part of the checkpoint, and evaluation draws from its own seeded generator).
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.distributed as torch_dist
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import Tensor

from invert.validation import hot_loop

from .attacks import ThreatModel, check_norm, config_number
from .checkpoints import CheckpointError, load_into
from .config import ConfigError, check_train_config, check_whole_number, dataset_from_config, expand_path, model_from_config, resolve_device
from .config import get as _get
from .data import IN_MEMORY, ImageSet
from .evaluate import correct_counts, gradient_masking_report
from .models import Classifier
from .optim import build_optimizer, build_scheduler
from .recipes import Recipe, build_recipe
from .run import RunDirectory, RunDirectoryError
from .step import TrainStep, check_graph_setting, graph_blocker, resolve_step_mode

logger = logging.getLogger(__name__)

PRECISIONS = ("auto", "bf16", "fp32")
# Keys that may change between an interrupted run and its resumption (paths, evaluation, speed knobs).
RESUMABLE_CHANGES = ("data.root", "data.download", "train.eval", "train.compile", "train.channels_last", "train.precision",
                     "train.attack_fold_bn", "train.cuda_graph")


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained classifier (in eval mode, as :func:`training.build_model` returns
    one), the summary and where the run lives. ``completed`` is False when the run stopped early on purpose
    (``stop_after_epochs``)."""

    model: Classifier
    summary: dict[str, Any]
    run_dir: Path
    completed: bool = True


@dataclass
class Distributed:
    """The process group under ``torchrun`` (one process per GPU), or a single process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    cuda: bool = False  # whether each process drives the GPU of its local rank

    @classmethod
    def from_env(cls, requested_device: str | None = "auto") -> "Distributed":
        """The process group torchrun describes in the environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``).

        Each process takes the GPU of its local rank (``cuda:LOCAL_RANK``, NCCL). With more processes on a
        machine than it has GPUs, ``device=auto`` trains on the CPU with gloo (a warning says so) and
        ``device=cuda`` is refused: start one process per GPU (``--nproc_per_node`` at most the GPU count).
        """
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        wants_cuda = requested_device in (None, "auto", "cuda") or str(requested_device).startswith("cuda")
        if str(requested_device).startswith("cuda") and local_world > gpus:
            raise ConfigError(
                f"device={requested_device} with {local_world} processes on this machine but {gpus} GPU(s): start one process "
                f"per GPU (torchrun --nproc_per_node={max(gpus, 1)}), or use device=cpu (gloo)"
            )
        cuda = wants_cuda and gpus > 0 and local_world <= gpus
        if wants_cuda and gpus > 0 and not cuda:
            logger.warning("%d processes on this machine but %d GPU(s): training on the CPU with gloo; for GPU training "
                           "start one process per GPU (torchrun --nproc_per_node=%d)", local_world, gpus, gpus)
        owns = False
        if not torch_dist.is_initialized():
            if cuda:
                torch.cuda.set_device(local)
            torch_dist.init_process_group("nccl" if cuda else "gloo")
            owns = True
        return cls(rank, world, local, owns, cuda)

    def device(self, requested: str | None) -> torch.device:
        if self.world_size > 1:
            return torch.device("cuda", self.local_rank) if self.cuda else torch.device("cpu")
        return resolve_device(requested)

    def sum(self, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
        if self.world_size == 1:
            return dict(tensors)
        out = {}
        for key, value in tensors.items():
            value = value.clone()
            torch_dist.all_reduce(value)
            out[key] = value
        return out

    def sync_buffers(self, module: torch.nn.Module) -> None:
        """Give every process rank 0's buffers (batch-norm running statistics). DDP broadcasts them at
        the start of each forward, so after the last training forward each rank holds its own update;
        evaluation, hooks such as fast AT's guard, and the checkpoint need one model on all ranks."""
        if self.world_size > 1:
            for buffer in module.buffers():
                torch_dist.broadcast(buffer, src=0)

    def barrier(self) -> None:
        if self.world_size > 1:
            torch_dist.barrier()

    def close(self) -> None:
        if self.owns_group:
            torch_dist.destroy_process_group()


@dataclass
class _Progress:
    """Totals that survive a resume: epochs done, steps, training time and images seen."""

    epoch: int = 0
    step: int = 0
    train_seconds: float = 0.0
    images: int = 0
    stopped: str | None = None
    history: list = field(default_factory=list)


def _resolve_precision(name: str, device: torch.device) -> torch.dtype | None:
    if name not in PRECISIONS:
        raise ConfigError(f"unknown precision {name!r}: use one of {PRECISIONS} (fp16 needs loss scaling; use bf16)")
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if name == "bf16" else None


def _resolve_flag(value: Any, name: str) -> bool:
    """``auto`` / true / false. Channels-last is the fast layout for convolutions on GPUs and, with
    oneDNN, on CPUs too (measured 1.2x for ResNet18 training steps, 2x for attack steps here)."""
    if value in ("auto", None):
        return True
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{name} must be auto, true or false, got {value!r}")


def _limit(data: ImageSet, n: int | None, seed: int) -> ImageSet:
    """A fixed sample of ``n`` images (a seeded permutation, so classes stay mixed)."""
    if n is None or n >= len(data):
        return data
    if n < 1:
        raise ConfigError(f"data_limit must be positive or null, got {n}")
    index = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:n].sort().values
    return data.subset(index)


def _epoch_batches(n: int, batch_size: int, dist: Distributed, seed: int, epoch: int, device: torch.device) -> Tensor:
    """(steps, batch_size) indices of this process's batches: one permutation per epoch, the same on
    every process (seeded by seed and epoch, so a resumed run draws the same order)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(n, generator=generator)
    steps = n // (batch_size * dist.world_size)
    order = order[: steps * batch_size * dist.world_size].view(steps, dist.world_size, batch_size)[:, dist.rank]
    return order.to(device, non_blocking=True)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def run_identity(config: DictConfig | Mapping) -> dict[str, Any]:
    """The settings that make a run the model it is, dotted: model, data, the recipe's settings, seed and data limit,
    without those a resumed run may change (:data:`RESUMABLE_CHANGES`: where the data lives, evaluation, speed)."""
    container = OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else config
    watched = ("model.", "data.", "train.", "seed", "data_limit.")
    return {key: value for key, value in _flatten(container).items() if key.startswith(watched) and not key.startswith(RESUMABLE_CHANGES)}


def check_same_run(saved_yaml: str | None, cfg: DictConfig, run_dir: Path) -> None:
    """Refuse to resume (or reuse) a run under a config that changes what is being trained."""
    if saved_yaml is None:
        return
    saved = run_identity(OmegaConf.to_container(OmegaConf.create(saved_yaml), resolve=False))
    current = run_identity(cfg)
    differences = [key for key in sorted(set(saved) | set(current)) if saved.get(key) != current.get(key)]
    if differences:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in differences[:6])
        raise RunDirectoryError(
            f"cannot resume {run_dir}: the config differs from the one it was started with ({details}). "
            f"Use the same settings, or start a new run with another run_dir."
        )


def _rng_state(device: torch.device) -> dict[str, Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: Mapping[str, Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _threat_or_none(cfg) -> ThreatModel | None:
    return None if cfg is None else ThreatModel.from_config(cfg)


def masking_settings(cfg, eval_threat: ThreatModel | None) -> dict | None:
    """``train.eval.masking`` as :func:`gradient_masking_report`'s arguments, or None when it is off. Parsed before the
    first epoch, since the report runs after the last one: ``eps`` is null (the norm's ladder), a number, a fraction like
    8/255 or a list of them (a fraction or a scalar crashed there, after the whole run and before its model was saved)."""
    masking = cfg or {}
    if not masking.get("enabled", False):
        return None
    eps = masking.get("eps")
    values = list(eps) if isinstance(eps, (list, tuple, ListConfig)) else [eps]
    try:
        norm = check_norm(masking.get("norm") or (eval_threat.norm if eval_threat else "l2"))
        eps = None if eps is None else [config_number(value, "train.eval.masking.eps") for value in values]
    except ValueError as err:
        raise ConfigError(f"train.eval.masking: {err}") from None
    if eps is not None and (not eps or not all(math.isfinite(e) and e > 0 for e in eps)):
        raise ConfigError(f"train.eval.masking.eps must be positive numbers (or null for the {norm} ladder), got {values}")
    settings = dict(norm=norm, eps=eps, steps=int(masking.get("steps", 20)), unbounded_steps=int(masking.get("unbounded_steps", 50)),
                    limit=masking.get("limit", 256))
    if settings["steps"] < 1 or settings["unbounded_steps"] < 1:
        raise ConfigError(f"train.eval.masking.steps and unbounded_steps must be >= 1, got {settings['steps']} and {settings['unbounded_steps']}")
    if settings["limit"] is not None:  # read only after the last epoch, by the report
        check_whole_number(settings["limit"], "train.eval.masking.limit", hint=" test images (or null for all)")
    return settings


def _evaluate(model: Classifier, test: ImageSet, threat: ThreatModel | None, dist: Distributed, *, robust_limit: int | None,
              restarts: int, batch_size: int, seed: int) -> dict[str, float]:
    """Clean accuracy on ``test`` and robust accuracy on its first ``robust_limit`` images; each process
    takes every world_size-th image and the counts are summed."""
    shard = test if dist.world_size == 1 else test.subset(torch.arange(dist.rank, len(test), dist.world_size))
    counts = correct_counts(model, shard, batch_size=batch_size)
    totals = dist.sum({"n": counts["n"], "clean": counts["clean"]})
    out = {"test_clean_acc": int(totals["clean"]) / max(1, int(totals["n"]))}
    if threat is not None and (robust_limit is None or robust_limit > 0):
        robust_set = test if robust_limit is None else test.subset(torch.arange(min(robust_limit, len(test))))
        if dist.world_size > 1:
            robust_set = robust_set.subset(torch.arange(dist.rank, len(robust_set), dist.world_size))
        counts = correct_counts(model, robust_set, threat, restarts=restarts, batch_size=batch_size, seed=seed + dist.rank)
        totals = dist.sum({"n": counts["n"], "robust": counts["robust"]})
        out["test_robust_acc"] = int(totals["robust"]) / max(1, int(totals["n"]))
        out["robust_images"] = int(totals["n"])
    return out


def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, dynamic_ncols=True)


def train(cfg: DictConfig) -> TrainResult:
    """Train ``cfg.model`` on ``cfg.data`` with recipe ``cfg.train`` in ``cfg.run_dir`` (see module docstring)."""
    dist = Distributed.from_env(_get(cfg, "device", "auto"))
    try:
        with contextlib.ExitStack() as held:  # the run directory, from when it is first touched until the run returns
            return _train(cfg, dist, held)
    finally:
        dist.close()


def _train(cfg: DictConfig, dist: Distributed, held: contextlib.ExitStack) -> TrainResult:
    wall_start = time.perf_counter()
    check_train_config(cfg)  # before any data is read: a misspelt key must not start a default run
    tcfg = cfg.train
    device = dist.device(_get(cfg, "device", "auto"))
    seed = int(_get(cfg, "seed", 0))
    check_whole_number(tcfg.epochs, "train.epochs")  # 2.5 trained 2 epochs and reported 2
    check_whole_number(tcfg.batch_size, "train.batch_size")
    for key in ("data_limit.train", "data_limit.test"):  # 0.5 failed in slicing, after the data was read
        if _get(cfg, key) is not None:
            check_whole_number(_get(cfg, key), key, hint=" images (or null for all)")
    check_whole_number(_get(cfg, "keep_checkpoints", 2), "keep_checkpoints", least=0, hint=" (0 = all)")  # -1 kept every one
    check_whole_number(_get(cfg, "save_every", 1), "save_every", hint=" epochs")
    epochs, batch_size = int(tcfg.epochs), int(tcfg.batch_size)
    if batch_size < 2 and "simclr" in str(_get(tcfg, "name", "")):
        raise ConfigError("train.batch_size=1 gives SimCLR no negatives (the loss is 0, nothing is learnt): use at least 2")
    bf16 = _resolve_precision(_get(tcfg, "precision", "auto"), device)
    channels_last = _resolve_flag(_get(tcfg, "channels_last", "auto"), "train.channels_last")
    graph_setting = check_graph_setting(_get(tcfg, "cuda_graph", False))
    show_progress = bool(_get(cfg, "progress", True)) and dist.is_main
    progress_every = max(1, int(_get(cfg, "progress_every", 25)))

    torch.manual_seed(seed + dist.rank)
    if cfg.data.name not in IN_MEMORY:  # before an ImageNet folder of a million files is walked, only to be refused
        raise ConfigError(f"training needs an in-memory data set ({', '.join(IN_MEMORY)}), got {cfg.data.name!r}")
    train_set = dataset_from_config(cfg.data, "train")
    test_set = dataset_from_config(cfg.data, "test")
    train_set = _limit(train_set, _get(cfg, "data_limit.train"), seed).to(device)
    test_set = _limit(test_set, _get(cfg, "data_limit.test"), seed).to(device)
    if len(train_set) < batch_size * dist.world_size:
        raise ConfigError(
            f"train.batch_size={batch_size} x {dist.world_size} process(es) exceeds the {len(train_set)} training images"
        )
    steps_per_epoch = len(train_set) // (batch_size * dist.world_size)

    model = model_from_config(cfg.model, cfg.data.name, num_classes=train_set.num_classes).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    recipe = build_recipe(tcfg, model, train_set, seed=seed).to(device)
    recipe.channels_last = channels_last
    optimizer = build_optimizer(recipe.named_parameters(), tcfg.optimizer)
    scheduler = build_scheduler(optimizer, tcfg.schedule, epochs, steps_per_epoch)
    compiled = bool(_get(tcfg, "compile", False))
    # Before the run directory is touched: train.cuda_graph=true on a recipe that cannot be captured is refused here.
    step_mode = resolve_step_mode(graph_setting, device, graph_blocker(recipe, optimizer, compiled=compiled, world_size=dist.world_size))
    eval_cfg = tcfg.get("eval") or {}
    eval_threat = _threat_or_none(eval_cfg.get("attack"))
    masking = masking_settings(eval_cfg.get("masking"), eval_threat)
    # Used only after the epochs (evaluation), or read as another count (0 epochs before stopping trained one).
    counts = {f"train.eval.{key}": eval_cfg.get(key) for key in ("batch_size", "restarts", "final_restarts")}
    if eval_cfg.get("every") is not None:  # int(0.5) turned per-epoch evaluation off without a word
        check_whole_number(eval_cfg.get("every"), "train.eval.every", least=0, hint=" epochs (0 = no per-epoch evaluation)")
    for key, value in {**counts, "stop_after_epochs": _get(cfg, "stop_after_epochs"), "save_every": _get(cfg, "save_every")}.items():
        if value is not None:
            check_whole_number(value, key, hint=" (or null for the default)")
    for key in ("subset", "final_subset"):  # a count of test images, not a fraction (0.5 measured the headline on 1 image)
        if eval_cfg.get(key) is not None:
            check_whole_number(eval_cfg.get(key), f"train.eval.{key}", least=0, hint=" test images (0 = none, null = all)")

    run = RunDirectory(expand_path(_get(cfg, "run_dir", "runs/default")))
    if dist.is_main:  # rank 0 writes the run; a DDP job does not wait for another's, as its other ranks would time out at a barrier
        held.enter_context(run.held(wait=dist.world_size == 1))
        run.remove_stale_temporaries()  # under the lock: what a killed run left
    # What a saved step count means: the scheduler counts steps, so a resumed run must take as many per epoch.
    layout = {"train_images": len(train_set), "processes": dist.world_size, "steps_per_epoch": steps_per_epoch}
    progress = _resume_or_start(run, cfg, recipe, optimizer, scheduler, device, dist, layout)
    finished = _finished_run(run, recipe, progress, epochs, tcfg.get("eval"))
    if finished is not None:
        return finished

    if compiled:
        for module in recipe.hot_modules():
            module.compile()
    forward = recipe
    if dist.world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        forward = DistributedDataParallel(recipe, device_ids=[device.index] if device.type == "cuda" else None)
    train_step = TrainStep(forward, optimizer, device=device, bf16=bf16, mode=step_mode, strict=graph_setting is True)

    def summarise(status: str) -> dict[str, Any]:  # the run's summary now: progress, and the step's mode (a failed capture falls back)
        return _summary(cfg, recipe, progress, device, dist, bf16, channels_last, train_step.ran_as, wall_start, status=status)

    stop_after = _get(cfg, "stop_after_epochs")
    save_every = max(1, int(_get(cfg, "save_every", 1)))
    keep = int(_get(cfg, "keep_checkpoints", 2))
    epochs_this_call = 0
    while progress.epoch < epochs and progress.stopped is None:
        epoch = progress.epoch
        record = _train_epoch(recipe, train_step, scheduler, train_set, progress, dist=dist, device=device, seed=seed,
                              epoch=epoch, epochs=epochs, batch_size=batch_size, show_progress=show_progress,
                              progress_every=progress_every)
        dist.sync_buffers(recipe)
        if not math.isfinite(record.get("train_loss", 0.0)):
            _diverged(run, record, cfg, dist, summarise, f"non-finite training loss ({record['train_loss']}) in epoch {record['epoch']}")
        if not _all_finite(recipe):  # the last update can break the weights after every loss of the epoch was finite
            _diverged(run, record, cfg, dist, summarise,
                      f"non-finite weights after epoch {record['epoch']} (its mean loss {record.get('train_loss')} was finite)")
        every = int(eval_cfg.get("every", 1) or 0)
        if recipe.supervised and every and (epoch + 1) % every == 0:
            record.update(_evaluate(recipe.model, test_set, eval_threat, dist, robust_limit=eval_cfg.get("subset"),
                                    restarts=int(eval_cfg.get("restarts", 1)), batch_size=int(eval_cfg.get("batch_size", 256)),
                                    seed=seed))
        reason = progress.stopped or recipe.after_epoch(epoch)
        if reason:
            progress.stopped = reason
            record["stopped"] = reason
        progress.epoch = epoch + 1
        progress.history.append({k: v for k, v in record.items() if isinstance(v, (int, float))})
        epochs_this_call += 1
        last = progress.epoch == epochs or progress.stopped is not None
        interrupt = stop_after is not None and epochs_this_call >= int(stop_after)
        if dist.is_main:
            run.log_metrics(record)
            if last or interrupt or progress.epoch % save_every == 0:
                _save(run, recipe, optimizer, scheduler, progress, device, keep, layout)
            _print_epoch(record, epochs, show_progress)
        dist.barrier()
        if interrupt and not last:
            summary = summarise(status="interrupted")
            if dist.is_main:
                run.write_summary(summary)
                logger.info("stopped after %d epoch(s) as asked (stop_after_epochs); continue with resume=true run_dir=%s",
                            epochs_this_call, run.path)
            return TrainResult(recipe.model.eval(), summary, run.path, completed=False)

    final_model = recipe.finalize(train_set)
    final = _evaluate(final_model, test_set, eval_threat, dist, robust_limit=eval_cfg.get("final_subset"),
                      restarts=int(eval_cfg.get("final_restarts", eval_cfg.get("restarts", 1))),
                      batch_size=int(eval_cfg.get("batch_size", 256)), seed=seed)
    summary = summarise(status="completed")
    summary.update(clean_accuracy=final["test_clean_acc"], robust_accuracy=final.get("test_robust_acc"),
                   robust_images=final.get("robust_images"), robust_attack=eval_threat.to_dict() if eval_threat else None)
    if dist.is_main:  # the model first: an optional report that fails must not cost the trained model
        run.save_model(final_model, {"recipe": recipe.name, "clean_accuracy": summary["clean_accuracy"],
                                     "robust_accuracy": summary["robust_accuracy"], "epochs": progress.epoch})
    if masking is not None and dist.is_main:
        report = gradient_masking_report(final_model, test_set, **masking, seed=seed)
        summary["gradient_masking"] = report.to_dict()
        logger.info("%s", report)
    if dist.is_main:
        run.write_summary(summary)
        logger.debug("%s", format_summary(summary))  # `python -m training` prints it; callers have the summary
    dist.barrier()
    return TrainResult(final_model.eval(), summary, run.path, completed=True)


class TrainingDiverged(FloatingPointError):
    """The training loss stopped being a number: the run stops, its last finite checkpoint kept."""


def _all_finite(recipe: Recipe) -> bool:
    """Whether every parameter and buffer (batch norm's running statistics too) is a number: one host sync per epoch."""
    tensors = [t for t in (*recipe.parameters(), *recipe.buffers()) if t.is_floating_point()]
    return not tensors or bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def _diverged(run: RunDirectory, record: dict, cfg: DictConfig, dist: Distributed, summarise: Callable[..., dict], reason: str) -> None:
    """Stop a run whose epoch ended with a non-finite mean loss or non-finite weights, before they are evaluated or
    checkpointed: the metrics show the epoch, the summary says ``diverged``, and the checkpoint of the last finite epoch
    stays the latest."""
    record["stopped"] = reason
    if dist.is_main:
        run.log_metrics(record)
        run.write_summary({**summarise(status="diverged"), "stopped": reason})
    dist.barrier()
    latest = run.latest()  # with save_every > 1 the last finished epoch may have no checkpoint
    kept = f"the checkpoint of epoch {latest.epoch} is kept" if latest else "no checkpoint was written"
    raise TrainingDiverged(f"training diverged: {reason}; {kept} in {run.path}. Lower train.optimizer.lr (now "
                           f"{cfg.train.optimizer.get('lr')}) or train in fp32 (train.precision=fp32), and start a new run_dir")


def _finished_run(run: RunDirectory, recipe: Recipe, progress: _Progress, epochs: int, eval_cfg: Any = None) -> TrainResult | None:
    """A resumed run that already completed returns its saved model and summary: nothing is retrained, re-probed or
    re-evaluated (commands that train what they need, such as ``reproduce``, call :func:`train` again on every run).
    ``train.eval`` may differ from the saved run's (it is a resumable change); then the reused numbers are the saved
    settings', and a warning says so."""
    summary = run.read_summary()
    model_path = run.path / "model.safetensors"
    done = progress.epoch >= epochs or progress.stopped is not None
    if not done or not summary or summary.get("status") != "completed" or not model_path.exists():
        return None
    load_into(recipe.model, model_path)
    logger.info("%s is complete: its model and summary are reused (delete the folder to train it again)", run.path)
    saved_eval = OmegaConf.select(OmegaConf.create(run.read_config_text() or "{}"), "train.eval")
    current = OmegaConf.to_container(eval_cfg, resolve=True) if isinstance(eval_cfg, DictConfig) else eval_cfg
    if current is not None and saved_eval is not None and OmegaConf.to_container(saved_eval, resolve=True) != current:
        logger.warning("%s was evaluated with other train.eval settings than these; its saved accuracies are those settings' "
                       "(evaluate the saved model with python -m perceptual audit, or train into another run_dir)", run.path)
    return TrainResult(recipe.model, summary, run.path, completed=True)


def _completed_without_checkpoints(run: RunDirectory, cfg: DictConfig, summary: Mapping[str, Any]) -> _Progress:
    """A completed run whose ``checkpoints/`` were removed (to free disk) still holds its model and summary: it is
    reused under ``resume=true``, as with its checkpoints, and otherwise refused; it is never trained over from scratch."""
    if not bool(_get(cfg, "resume", False)):
        raise RunDirectoryError(
            f"{run.path} already holds a completed run (model.safetensors and summary.json; its checkpoints/ were removed). "
            f"Pass resume=true to reuse it, or choose another run_dir=..."
        )
    check_same_run(run.read_config_text(), cfg, run.path)
    done = int(summary.get("epochs_completed", 0))
    if done < int(cfg.train.epochs) and not summary.get("stopped"):  # without optimizer state it cannot go on
        raise RunDirectoryError(f"{run.path} completed {done} epochs and its checkpoints/ were removed, so it cannot be "
                                f"continued to train.epochs={cfg.train.epochs}: start a new run with another run_dir=...")
    return _Progress(epoch=done, train_seconds=float(summary.get("train_seconds") or 0.0),
                     stopped=summary.get("stopped"), history=list(summary.get("history") or []))


def _resume_or_start(run: RunDirectory, cfg: DictConfig, recipe: Recipe, optimizer, scheduler, device, dist: Distributed,
                     layout: Mapping[str, int]) -> _Progress:
    ref = run.latest()
    if ref is None:
        summary = run.read_summary() if run.model_path.is_file() else None
        if summary and summary.get("status") == "completed":
            return _completed_without_checkpoints(run, cfg, summary)
        if dist.is_main:
            run.write_config(OmegaConf.to_yaml(cfg, resolve=True))
            if run.metrics_path.exists():  # a run that died before its first checkpoint
                run.truncate_metrics(0)
        dist.barrier()
        return _Progress()
    if not bool(_get(cfg, "resume", False)):
        raise RunDirectoryError(
            f"{run.path} already holds a run (checkpoint of epoch {ref.epoch}). Pass resume=true to continue it, "
            f"or choose another run_dir=..."
        )
    check_same_run(run.read_config_text(), cfg, run.path)
    try:
        load_into(recipe.model, ref.weights)
        state = run.load_state(ref)
    except (CheckpointError, RunDirectoryError) as err:  # a damaged file: say which earlier checkpoint is still there
        raise RunDirectoryError(f"{err}{run.resume_hint(ref)}") from err
    _check_same_layout(state.get("layout"), layout, run.path)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    for name, module in recipe.auxiliary_modules().items():
        module.load_state_dict(state["auxiliary"][name])
    recipe.load_extra_state(state.get("recipe", {}))
    if dist.world_size == 1:
        _set_rng_state(state["rng"], device)
    else:  # each process had its own stream; only rank 0's was saved, so reseed the others per epoch
        torch.manual_seed(int(_get(cfg, "seed", 0)) * 7919 + dist.rank * 104_729 + ref.epoch)
    progress = _Progress(epoch=int(state["epoch"]), step=int(state["step"]), train_seconds=float(state["train_seconds"]),
                         images=int(state["images"]), stopped=state.get("stopped"), history=list(state.get("history", [])))
    if dist.is_main:
        run.truncate_metrics(progress.epoch, progress.history)
        logger.info("resuming %s after epoch %d", run.path, progress.epoch)
    return progress


def _check_same_layout(saved: Mapping[str, int] | None, layout: Mapping[str, int], path: Path) -> None:
    """Refuse to resume on other data or another number of processes: the learning-rate schedule resumes at a step count,
    which would then fall in another epoch (a 2-GPU run resumed on 1 climbed back up; one on fewer images trained at lr 0),
    and the global batch would change. Checkpoints saved before the layout was recorded are not checked."""
    if saved is None or dict(saved) == dict(layout):
        return
    changed = "; ".join(f"{key} {saved.get(key)} then, {value} now" for key, value in layout.items() if saved.get(key) != value)
    raise RunDirectoryError(
        f"{path} cannot resume with another data layout ({changed}): its learning-rate schedule counts steps, which would "
        f"fall in other epochs. Resume with the same training data (data.root, data_limit) on {saved.get('processes')} "
        "process(es) (torchrun --nproc_per_node=N), or start a new run_dir"
    )


def _save(run: RunDirectory, recipe: Recipe, optimizer, scheduler, progress: _Progress, device, keep: int, layout: Mapping[str, int]) -> None:
    state = {
        "layout": dict(layout),
        "epoch": progress.epoch,
        "step": progress.step,
        "train_seconds": progress.train_seconds,
        "images": progress.images,
        "stopped": progress.stopped,
        "history": progress.history,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "auxiliary": {name: module.state_dict() for name, module in recipe.auxiliary_modules().items()},
        "recipe": recipe.extra_state(),
        "rng": _rng_state(device),
    }
    run.save_checkpoint(progress.epoch, recipe.model, state, {"recipe": recipe.name}, keep=keep)


def _train_epoch(recipe: Recipe, train_step: TrainStep, scheduler, train_set: ImageSet, progress: _Progress, *, dist: Distributed,
                 device: torch.device, seed: int, epoch: int, epochs: int, batch_size: int, show_progress: bool,
                 progress_every: int) -> dict[str, Any]:
    batches = _epoch_batches(len(train_set), batch_size, dist, seed, epoch, device)
    images, labels = train_set.images, train_set.labels
    train_step.start_epoch()
    lr = float(scheduler.get_last_lr()[0])  # the rate of the epoch's first step; a per-step schedule changes it within the epoch
    sums = train_step.sums  # device tensors the step adds into; read every progress_every steps and at the end
    steps_done = 0
    step_hook = dist.world_size > 1 and type(recipe).after_step is not Recipe.after_step
    recipe.train()
    bar = _progress_bar(len(batches), f"epoch {epoch + 1}/{epochs}", show_progress)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    with hot_loop():
        for index in batches:
            train_step(recipe.prepare(images[index]), labels[index])
            scheduler.step()
            steps_done += 1
            progress.step += 1
            if step_hook:
                dist.sync_buffers(recipe)  # the hook (fast AT's guard) must decide the same on every rank
            reason = recipe.after_step(progress.step - 1)
            bar.update(1)
            if show_progress and steps_done % progress_every == 0:
                bar.set_postfix(loss=f"{float(sums['loss']) / steps_done:.4f}", acc=f"{float(sums['acc']) / steps_done:.3f}")
            if reason:
                progress.stopped = reason
                break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    bar.close()
    totals = dist.sum({k: v for k, v in sums.items()})
    images_done = steps_done * batch_size * dist.world_size
    progress.train_seconds += seconds
    progress.images += images_done
    record: dict[str, Any] = {"epoch": epoch + 1, "step": progress.step, "lr": lr}
    for key, value in totals.items():
        mean = float(value) / max(1, steps_done * dist.world_size)
        record["train_loss" if key == "loss" else f"train_{key}"] = mean
    # CPU time of this process too: on a shared machine it is a steadier measure of the work done.
    record.update(epoch_seconds=seconds, epoch_cpu_seconds=cpu_seconds,
                  images_per_second=images_done / seconds if seconds > 0 else math.nan)
    if progress.stopped:
        record["stopped"] = progress.stopped
    return record


def _print_epoch(record: Mapping[str, Any], epochs: int, enabled: bool) -> None:
    if not enabled:
        return
    from tqdm.auto import tqdm

    parts = [f"epoch {record['epoch']}/{epochs}", f"loss {record.get('train_loss', math.nan):.4f}", f"train acc {record.get('train_acc', math.nan):.3f}"]
    if "test_clean_acc" in record:
        parts.append(f"test clean {record['test_clean_acc']:.3f}")
    if "test_robust_acc" in record:
        parts.append(f"robust {record['test_robust_acc']:.3f}")
    parts.append(f"{record['images_per_second']:.0f} img/s")
    if record.get("stopped"):
        parts.append(f"STOPPED: {record['stopped']}")
    tqdm.write(" | ".join(parts))


def _summary(cfg: DictConfig, recipe: Recipe, progress: _Progress, device, dist: Distributed, bf16, channels_last: bool, step_mode: str,
             wall_start: float, status: str) -> dict[str, Any]:
    return {
        "status": status,
        "run_dir": str(expand_path(_get(cfg, "run_dir", "runs/default"))),
        "model": cfg.model.name,
        "dataset": cfg.data.name,
        "recipe": recipe.describe(),
        "epochs_completed": progress.epoch,
        "epochs": int(cfg.train.epochs),
        "stopped": progress.stopped,
        "train_seconds": progress.train_seconds,
        "images_per_second": progress.images / progress.train_seconds if progress.train_seconds > 0 else None,
        "wall_seconds_this_call": time.perf_counter() - wall_start,
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "world_size": dist.world_size,
        "precision": "bf16" if bf16 is not None else "fp32",
        "channels_last": channels_last,
        "compile": bool(_get(cfg.train, "compile", False)),
        "cuda_graph": step_mode,
        "torch": torch.__version__,
        "history": progress.history,
    }


def format_summary(summary: Mapping[str, Any]) -> str:
    """A few human-readable lines from a run summary."""
    lines = [f"{summary['recipe']['recipe']} {summary['model']} on {summary['dataset']}: {summary['status']}, "
             f"{summary['epochs_completed']}/{summary['epochs']} epochs" + (f" (stopped: {summary['stopped']})" if summary.get("stopped") else "")]
    if summary.get("clean_accuracy") is not None:
        lines.append(f"  clean accuracy   {summary['clean_accuracy']:.4f}")
    if summary.get("robust_accuracy") is not None:
        attack = summary.get("robust_attack") or {}
        lines.append(f"  robust accuracy  {summary['robust_accuracy']:.4f}  ({attack.get('norm')} eps {attack.get('eps'):.4g}, "
                     f"{attack.get('steps')} steps, {summary.get('robust_images')} images)")
    ips = summary.get("images_per_second")
    lines.append(f"  training time    {summary['train_seconds']:.1f} s" + (f", {ips:.1f} images/s" if ips else "")
                 + f" on {summary['device']} x{summary['world_size']} ({summary['precision']})")
    lines.append(f"  run directory    {summary['run_dir']}")
    return "\n".join(lines)


__all__ = ["Distributed", "TrainResult", "TrainingDiverged", "check_same_run", "format_summary", "run_identity", "train"]
