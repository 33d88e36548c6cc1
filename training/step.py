"""The supervised training step as one function over static buffers, replayed as a CUDA graph (``train.cuda_graph``).

At the paper's batch (128) a PGD-7 step of a CIFAR ResNet18 is bound by kernel launches, not arithmetic: eight
forward and backward passes of small convolutions, the attack's normalised steps and projections, the optimizer's
update. :class:`TrainStep` runs the whole step (the recipe's forward, attack included, under autocast; the backward;
the optimizer step; the epoch's running loss and accuracy sums) as ONE function, :meth:`TrainStep.step`, which the
trainer calls in one of three modes:

* ``eager``: the step on the batch as given (the trainer's loop as before, SGD now through its fused kernel);
* ``capture`` (CUDA): the step over static input, label and learning-rate buffers, warmed up for a few real steps on a
  side stream and then captured once with ``torch.cuda.graph`` and replayed for every batch (PyTorch's whole-network
  capture recipe, "CUDA Graphs" in the CUDA semantics notes);
* ``static``: the capture mode's structure run eagerly (the same buffers, learning-rate tensor and optimizer kernel,
  no graph), which is what ``train.cuda_graph=true`` does off CUDA so that the CPU can test it.

What capture needs, and how it is met here:

* no host synchronisation inside the step: the attacks (``training.attacks.maximize``) and the supervised recipes'
  losses are sync-free inside ``invert.validation.hot_loop()``; the epoch's loss and accuracy accumulate into
  device tensors in place (:attr:`TrainStep.sums`), read once per epoch;
* random draws (PGD's random start, TRADES' and MART's start noise) come from the default CUDA generator, which
  ``torch.cuda.graph`` registers: each replay advances its offset as an eager step does (the gpu tests compare
  captured with eager training);
* a learning rate the graph reads: ``torch.optim.SGD`` takes its ``lr`` as a Python number, baked into a captured
  kernel, or as a tensor, which its default kernels turn into a number (a host sync). So SGD steps, in every mode,
  through its fused kernel (``fused=True``, one kernel for all parameters) with a 0-d device tensor as ``lr``,
  refilled from the scheduler's value before each step or replay. The param groups keep their Python number
  between steps, so the scheduler, checkpoints and resumption never see a tensor. The fused kernel rounds a few
  entries differently from SGD's default kernels (the CPU's per-parameter loop, CUDA's ``foreach``): 3e-8 at most
  after three steps of a 1001-entry tensor on the CPU. The tensor is float64 on the CPU, where the kernel reads the
  learning rate as a double as it does a Python number; CUDA's fused kernel reads a float32;
* autocast without its weight-cast cache (PyTorch's advice for graphs), in every mode, so that the modes compute the
  same thing: the cache does not only save repeated casts. A recipe that runs the model twice (TRADES and MART: natural
  and adversarial inputs) shares one bf16 copy of each weight between the two passes, so the two gradients are summed
  in bf16 before the cast back; without the cache each pass casts its own copy and the sum is taken in float32. On a
  small CNN under bf16 autocast the two differ by up to 5e-4 in a weight's gradient after one step.

The trainer drops the last partial batch of an epoch, so every batch has the captured shape; a batch of another
shape still works (it runs the same function eagerly). Batch augmentation runs before the step, eagerly: it draws
the order of its colour-jitter steps on the host.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor, nn

from invert.graphs import capture_cuda_graph

from .config import ConfigError

logger = logging.getLogger(__name__)

GRAPH_SETTINGS = (False, True, "auto")
STEP_MODES = ("eager", "static", "capture")
# Real training steps run eagerly on a side stream before capture (PyTorch's recipe: cuDNN autotuning, autograd's
# and the optimizer's lazy state such as the momentum buffers).
WARMUP_STEPS = 3


def check_graph_setting(value: Any) -> bool | str:
    """``train.cuda_graph`` as False, True or ``"auto"`` (YAML 0/1 read as booleans); anything else is refused."""
    if value is None:
        return False
    if isinstance(value, bool) or value == "auto":
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    raise ConfigError(f"train.cuda_graph must be false, true or auto, got {value!r}")


def graph_blocker(recipe: nn.Module, optimizer: torch.optim.Optimizer, *, compiled: bool, world_size: int) -> Optional[str]:
    """Why this run's training step cannot be captured as a CUDA graph (on any device), or None when it can."""
    recipe_blocker = getattr(recipe, "graph_blocker", "it is not a training.recipes.Recipe")
    if recipe_blocker:
        return f"the {getattr(recipe, 'name', type(recipe).__name__)} recipe cannot be captured: {recipe_blocker}"
    if compiled:
        return "train.compile=true: torch.compile makes its own graphs (its mode='reduce-overhead'); use one or the other"
    if world_size > 1:
        return f"{world_size} processes: DistributedDataParallel's gradient all-reduce is not captured here"
    if type(optimizer) is not torch.optim.SGD:
        return f"the {type(optimizer).__name__} optimizer: only SGD's fused kernel reads its learning rate on the device"
    return None


def resolve_step_mode(setting: Any, device: torch.device, blocker: Optional[str]) -> str:
    """The :data:`STEP_MODES` entry ``train.cuda_graph`` asks for on ``device`` (see the module docstring).

    ``false``: eager. ``auto``: capture on CUDA when nothing blocks it, else eager (an info log says why).
    ``true``: capture on CUDA, the same structure eagerly elsewhere; a blocker is an error naming it.
    """
    setting = check_graph_setting(setting)
    if setting is False:
        return "eager"
    if blocker is not None:
        if setting is True:
            raise ConfigError(f"train.cuda_graph=true, but {blocker}. Set train.cuda_graph=auto (falls back to the "
                              "eager step) or false.")
        logger.info("train.cuda_graph=auto: the training step runs eagerly, because %s", blocker)
        return "eager"
    if device.type == "cuda":
        return "capture"
    if setting is True:
        logger.info("train.cuda_graph=true on %s: running the captured step's structure eagerly (no CUDA graphs here)", device)
        return "static"
    return "eager"


def _match_momentum_layouts(optimizer: torch.optim.Optimizer) -> None:
    """Give each SGD momentum buffer its parameter's memory layout. The fused kernel walks parameter, gradient and
    buffer in memory order, so a buffer in another layout (a checkpoint saved with ``channels_last=false`` and resumed
    with ``true``) would be updated with the wrong entries; SGD's default kernels index logically and never cared."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            buffer = optimizer.state.get(param, {}).get("momentum_buffer")
            if buffer is not None and buffer.stride() != param.stride():
                optimizer.state[param]["momentum_buffer"] = torch.empty_like(param).copy_(buffer)


def _start_late_momentum_buffers(optimizer: torch.optim.Optimizer) -> bool:
    """Start the momentum buffer of a parameter that gets its first gradient after the others have theirs (a branch
    switched on later, a head unfrozen later); return whether every parameter of a momentum group now has one.

    SGD's default kernels start such a buffer at the parameter's (weight-decayed) gradient g'. The fused kernel treats a
    step as the first only when no buffer exists at all and otherwise fails on the missing one, so the buffer is
    started at d/m · g', which its update m · b + (1 - d) · g' turns into g' (zero for the usual dampening d = 0)."""
    complete = True
    for group in optimizer.param_groups:
        momentum = group["momentum"]
        if not momentum:
            continue
        missing = [p for p in group["params"] if p.grad is not None and "momentum_buffer" not in optimizer.state.get(p, {})]
        started = len(missing) < sum(p.grad is not None for p in group["params"])  # some buffers exist: not the first step
        for param in missing if started else ():
            buffer = torch.zeros_like(param)  # the parameter's layout, which the fused kernel walks (_match_momentum_layouts)
            if group["dampening"]:
                gradient = -param.grad if group["maximize"] else param.grad
                buffer.copy_(gradient).add_(param.detach(), alpha=group["weight_decay"]).mul_(group["dampening"] / momentum)
            optimizer.state[param]["momentum_buffer"] = buffer
        complete = complete and started and all("momentum_buffer" in optimizer.state.get(p, {}) for p in group["params"])
    return complete


@contextlib.contextmanager
def _device_learning_rate(optimizer: torch.optim.Optimizer, rates: list[Tensor]) -> Iterator[None]:
    """SGD stepping with its fused kernel and each group's ``lr`` read from ``rates`` (0-d device tensors); the groups
    get their Python numbers back afterwards, so the scheduler and ``state_dict`` never see a tensor."""
    saved = [(group["lr"], group.get("fused")) for group in optimizer.param_groups]
    for group, rate in zip(optimizer.param_groups, rates):
        group["lr"], group["fused"] = rate, True
    try:
        yield
    finally:
        for group, (lr, fused) in zip(optimizer.param_groups, saved):
            group["lr"], group["fused"] = lr, fused


class TrainStep:
    """One optimisation step of a supervised recipe (see the module docstring), in ``mode`` (:data:`STEP_MODES`).

    ``forward(inputs, labels) -> (loss, stats)`` is the recipe (or its DDP wrapper in eager mode).
    ``strict``: a failed capture raises (``train.cuda_graph=true``) instead of falling back to the static mode.
    """

    def __init__(self, forward: Callable[[Tensor, Tensor], tuple[Tensor, dict[str, Tensor]]], optimizer: torch.optim.Optimizer,
                 *, device: torch.device, bf16: Optional[torch.dtype], mode: str = "eager", strict: bool = False):
        if mode not in STEP_MODES:
            raise ValueError(f"unknown step mode {mode!r}: use one of {STEP_MODES}")
        if mode == "capture" and device.type != "cuda":
            raise ValueError(f"capture needs a CUDA device, got {device}")
        self.forward, self.optimizer = forward, optimizer
        self.device, self.bf16, self.mode, self.strict = device, bf16, mode, strict
        # The epoch's running sums of the loss and of every stat, on the device (in place: the graph adds into them).
        self.sums: dict[str, Tensor] = {}
        self._inputs: Optional[Tensor] = None
        self._labels: Optional[Tensor] = None
        # SGD's learning rates as device tensors (see the module docstring); other optimizers step as they are (eager only).
        dtype = torch.float64 if device.type == "cpu" else torch.float32
        sgd = type(optimizer) is torch.optim.SGD
        self._rates = [torch.tensor(float(g["lr"]), dtype=dtype, device=device) for g in optimizer.param_groups] if sgd else []
        if sgd:
            _match_momentum_layouts(optimizer)  # the optimizer's state is final here (a resumed run has loaded it)
        self._calls = 0
        self._replay: Optional[Callable[[], None]] = None
        self._buffers_complete = not sgd  # every momentum buffer started (see _start_late_momentum_buffers)

    @property
    def captured(self) -> bool:
        return self._replay is not None

    @property
    def ran_as(self) -> str:
        """How the steps so far ran, for the summary: ``capture`` once a graph was captured, ``static`` for the captured
        step's structure run eagerly (no CUDA here, a failed capture, or too few steps to pass the warm-up), else ``eager``."""
        return "capture" if self.captured else "static" if self.mode == "capture" else self.mode

    def start_epoch(self) -> None:
        """Zero the running sums in place (a captured graph keeps adding into the same tensors)."""
        for total in self.sums.values():
            total.zero_()

    def step(self, inputs: Tensor, labels: Tensor) -> None:
        """THE training step: forward (attack included) under autocast, backward, optimizer step, running sums. The
        eager and static modes call it directly; capture records it once and replays it."""
        with torch.autocast(self.device.type, dtype=self.bf16 or torch.float32, enabled=self.bf16 is not None, cache_enabled=False):
            loss, stats = self.forward(inputs, labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if not self._buffers_complete:
            self._buffers_complete = _start_late_momentum_buffers(self.optimizer)
        with _device_learning_rate(self.optimizer, self._rates) if self._rates else contextlib.nullcontext():
            self.optimizer.step()
        for key, value in (("loss", loss), *stats.items()):
            if key not in self.sums:  # first step only; capture comes after the warm-up steps
                self.sums[key] = torch.zeros((), device=value.device)
            self.sums[key].add_(value.detach().float())

    def __call__(self, inputs: Tensor, labels: Tensor) -> None:
        """Train on one batch (``inputs`` prepared by the recipe, ``labels``) in this step's mode."""
        self._fill_rates()
        if self.mode == "eager":
            self.step(inputs, labels)
            return
        if self._inputs is None:
            self._inputs, self._labels = torch.empty_like(inputs), torch.empty_like(labels)
        if inputs.shape != self._inputs.shape or labels.shape != self._labels.shape or inputs.stride() != self._inputs.stride():
            self.step(inputs, labels)  # a batch of another shape: the same function, eagerly
            return
        self._inputs.copy_(inputs)
        self._labels.copy_(labels)
        if self._replay is None and self.mode == "capture" and self._calls >= WARMUP_STEPS:
            self._replay = self._capture()
        if self._replay is not None:
            self._replay()
        elif self.mode == "capture":
            self._warm_up()
        else:
            self.step(self._inputs, self._labels)
        self._calls += 1

    def _fill_rates(self) -> None:
        for rate, group in zip(self._rates, self.optimizer.param_groups):
            rate.fill_(group["lr"])

    def _warm_up(self) -> None:
        """A real step on a side stream (PyTorch's capture recipe: lazy state is created off the capturing stream)."""
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self.step(self._inputs, self._labels)
        current.wait_stream(side)

    def _capture(self) -> Optional[Callable[[], None]]:
        """:meth:`step` over the static buffers as one CUDA graph; its ``replay``, or None where capture failed and
        ``strict`` is off (the static mode then carries on with the same function, eagerly)."""
        replay = capture_cuda_graph(
            lambda: self.step(self._inputs, self._labels), device=self.device, strict=self.strict, what="the training step",
            suspect="the recipe's forward", fix="Set train.cuda_graph=auto to fall back to the eager step, or false.",
        )
        if replay is None:
            self.mode = "static"
        else:
            logger.info("training step captured as a CUDA graph after %d eager warm-up steps", self._calls)
        return replay


__all__ = ["GRAPH_SETTINGS", "STEP_MODES", "TrainStep", "WARMUP_STEPS", "check_graph_setting", "graph_blocker", "resolve_step_mode"]
