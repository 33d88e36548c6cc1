"""The batched runner: all items at once, each sample stepped on its own, no host syncs per step.

``Engine(config).run(objective, init)`` minimises a per-sample objective (see
:mod:`invert.objectives`) from the [0, 1] images ``init``, one row per item, and returns an
:class:`InversionResult`. The reference algorithm (Nanda et al. AAAI 2023, run there with their fork of the
``robustness`` library's ``Attacker``, deep-learning-base ``attack/``, ``constraint='unconstrained'`` with an
L2-normalised step, and ``use_best=True``; upstream ``robustness``'s ``L2Step`` with a huge eps is the same step,
which the benchmark's anchor uses) is, per sample,
``x <- clamp(x - eta * g / ||g||_2, 0, 1)`` for 5000 steps, keeping the lowest-loss iterate. Whether
pixels on the box boundary get gradient there depends on the torch release (recent ones: none, which is
``stop_at_bounds=True`` here); the default lets them move back in, as the authors' torch did (see
:class:`invert.params.Pixel`).

How the loop stays fast
    * Items are split into micro-batches that fit a memory budget: on CUDA, two probe steps measure
      the bytes each sample needs (``torch.cuda.max_memory_allocated``); elsewhere a fixed size.
    * Gradients are taken of the *sum* of per-sample losses, so each sample's gradient (and with it
      its whole trajectory) is independent of the rest of the batch; parameters of the objective
      are frozen during the run, so autograd never builds weight gradients.
    * Each iterate's loss is computed once and serves both the best-iterate tracking and the step
      (the reference does the same; one extra forward without autograd scores the last iterate).
    * No ``.item()`` in the loop: every ``log_every`` steps the engine copies a small summary (best
      losses, frozen and non-finite flags) to the host. On CUDA that copy is asynchronous and read
      one report later, so the GPU never waits for the host; this delays the progress bar, NaN
      errors and the removal of frozen samples by ``log_every`` steps, never the results.
    * Early stopping freezes a sample (its best iterate, loss and step count stop changing at once,
      on the device); frozen samples are compacted out of the working set at the next report, so
      they cost nothing after that, and a micro-batch ends when all its samples are frozen.
    * The whole step (forward, backward, update, clamp, bookkeeping) is one function that updates the
      working set in place (:meth:`_Runner.step`). With ``cuda_graph`` it is captured once per
      micro-batch as a CUDA graph and replayed, one launch per step instead of hundreds; frozen
      samples are then masked in place rather than compacted (shapes stay fixed), and the
      micro-batch still ends when all are frozen. Off CUDA, ``cuda_graph=True`` runs that same
      masked loop eagerly, with results equal to the compacting loop bit for bit where the model's
      kernels round alike at every batch size (the tests' small networks on one thread); compaction
      changes the batch the other samples see, and larger convolutions round differently at other
      batch sizes, which a long normalised descent amplifies (no item's objective depends on another's).
    * Options: bf16 autocast, channels-last, ``torch.compile`` of the objective, CUDA graphs.
"""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .config import InvertConfig, load_preset
from .graphs import capture_cuda_graph
from .modules import evaluation, memory_format
from .objectives import LpPrior, Objective, TotalVariation, TransformRobust
from .params import Parametrization, make_parametrization
from .steps import Stepper, make_stepper, select_state
from .validation import check_images, check_whole, hot_loop

logger = logging.getLogger(__name__)

_GRAPH_WARMUP_STEPS = 3  # eager steps on a copy before capture (PyTorch's CUDA-graph recipe warms up on a side stream)


class NonFiniteLossError(FloatingPointError):
    """The objective returned NaN or Inf for some items."""


@dataclass
class InversionResult:
    """What :meth:`Engine.run` returns; tensors live on the device of ``init``.

    images: (N, C, H, W) in [0, 1], each item's best iterate (its last one if ``keep_best`` is off).
    best_loss: (N,) the loss of ``images`` as the search held them (float32; ``images`` come back in ``init``'s dtype).
    initial_loss: (N,) the loss of ``init``.
    last_loss: (N,) the loss of each item's last iterate (where it stopped, or at ``steps``); with ``keep_best``
        ``best_loss`` may be lower. The two together say whether an item was still moving.
    steps_used: (N,) gradient steps each item took before it finished or was frozen.
    loss_curve: (len(curve_steps), N) each item's best loss so far at ``curve_steps`` (0, log_every, 2 log_every,
        ..., steps); with ``keep_best=False``, its current loss (which may rise).
    curve_steps: the step of each row of ``loss_curve``.
    micro_batch: the micro-batch size that was used.
    loop: how the steps ran: ``eager`` (frozen items compacted away at each report), ``masked`` (fixed shapes, frozen
        items masked: ``cuda_graph=True`` off CUDA, or a capture that failed under ``cuda_graph='auto'``) or
        ``cuda-graph`` (the step replayed as a CUDA graph); micro-batches that ran differently are joined by ``+``.
    item_steps_computed: the item-steps the device computed. At least ``steps_used.sum()``: frozen items stay in
        the batch until the next report (eager) or until every item of their micro-batch is frozen (masked, cuda-graph),
        so early stopping saves that much less work.
    task_loss: (N,) the caller's objective alone at ``images``, in float32, without the config's priors (``tv_weight``,
        ``lp_weight``) and transformation robustness, which serve the search: for an inversion, the normalised distance
        that says whether it converged (a bf16 run's losses have a floor of about 0.003 there), of ``images`` as returned
        (rounded to a bf16 or fp16 ``init``'s dtype first). It is ``best_loss`` itself when the run was fp32 without
        those settings and ``init`` float32.
    """

    images: Tensor
    best_loss: Tensor
    initial_loss: Tensor
    last_loss: Tensor
    steps_used: Tensor
    loss_curve: Tensor
    curve_steps: list[int]
    micro_batch: int
    loop: str
    item_steps_computed: int
    task_loss: Tensor


class _HostMirror:
    """Copies small device tensors to the host every report without stalling the device.

    On CUDA, :meth:`exchange` starts an asynchronous copy into pinned memory and returns the copy
    started at the *previous* report (finished long ago, so waiting on its event is free). On other
    devices copies are synchronous and it returns the new one.
    """

    def __init__(self, device: torch.device):
        self.lagged = device.type == "cuda"
        self.pending: Optional[tuple[Tensor, Any, Any]] = None

    def exchange(self, packed: Tensor, meta: Any) -> Optional[tuple[Tensor, Any]]:
        if not self.lagged:
            return packed.cpu(), meta
        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(packed.device))  # the copy's stream, not the current device's (cuda:1 runs)
        previous, self.pending = self.pending, (host, event, meta)
        if previous is None:
            return None
        previous[1].synchronize()
        return previous[0], previous[2]

    def drain(self) -> Optional[tuple[Tensor, Any]]:
        """The last pending copy, if any (at the end of a micro-batch)."""
        if self.pending is None:
            return None
        host, event, meta = self.pending
        self.pending = None
        event.synchronize()
        return host, meta


@dataclass
class _Working:
    """The per-sample tensors of the samples still being stepped (rows = samples)."""

    rows: Tensor  # item index of each row, into the run (and into the objective's buffers)
    param: Tensor
    state: dict[str, Tensor]
    best_param: Tensor
    best_loss: Tensor
    reference: Tensor  # the best loss at its last improvement by more than rtol (early stopping)
    since: Tensor  # the value of ``evaluated`` at that improvement
    evaluated: Tensor  # iterates scored while active (steps_used = evaluated - 1)
    frozen: Tensor
    nonfinite: Tensor
    initial_loss: Tensor
    last_loss: Tensor

    def select(self, keep: Tensor) -> "_Working":
        return _Working(
            rows=self.rows[keep],
            param=self.param[keep],
            state=select_state(self.state, keep),
            best_param=self.best_param[keep],
            best_loss=self.best_loss[keep],
            reference=self.reference[keep],
            since=self.since[keep],
            evaluated=self.evaluated[keep],
            frozen=self.frozen[keep],
            nonfinite=self.nonfinite[keep],
            initial_loss=self.initial_loss[keep],
            last_loss=self.last_loss[keep],
        )

    def clone(self) -> "_Working":
        """A deep copy (the CUDA-graph warm-up steps a copy, so that warming up changes no result)."""
        return _Working(**{k: ({n: t.clone() for n, t in v.items()} if isinstance(v, dict) else v.clone()) for k, v in vars(self).items()})


def _bcast(mask: Tensor, like: Tensor) -> Tensor:
    return mask.view(-1, *([1] * (like.ndim - 1)))


class Engine:
    """Runs objectives over batches of items. ``Engine(config, **overrides)``; ``Engine.preset(name)``."""

    def __init__(self, config: Optional[InvertConfig] = None, **overrides: Any):
        # Through from_dict so that a misspelt override gets the list of valid keys.
        self.config = InvertConfig.from_dict({**asdict(config or InvertConfig()), **overrides})

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "Engine":
        """An engine with the preset ``conf/invert/<name>.yaml`` (``paper``, ``fast``, ``default``)."""
        return cls(load_preset(name, **overrides))

    def resolved_precision(self, device: torch.device) -> str:
        """The precision a run on ``device`` uses: ``auto`` is bf16 on a CUDA device that has it, else fp32."""
        precision = self.config.precision
        if precision == "auto":
            return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
        return precision

    # ------------------------------------------------------------------ public entry point

    def run(self, objective: nn.Module, init: Tensor, *, item_offset: int = 0, desc: str = "invert") -> InversionResult:
        """Minimise ``objective`` from the [0, 1] images ``init`` (N, C, H, W), one row per item.

        ``objective(x, items, step) -> (n,)`` (see :mod:`invert.objectives`); row i of ``init`` is
        item i of the objective's buffers. The counts must match: one starting image per item (per
        target, per origin). The one exception, by rule: a single starting image (shape (1, C, H, W))
        is used for every item, as a shared seed. ``item_offset`` shifts the items' random keys (for runs
        split into shards that should draw as one run). The objective is run in eval mode with its
        parameters frozen; both are restored afterwards. With ``channels_last``, its 4-D weights are
        channels-last for the run and back in their own layout afterwards (numerically harmless). The search runs in float32 whatever
        ``init``'s dtype (``precision`` says how the objective computes); the images come back in ``init``'s dtype.
        """
        cfg = self.config
        check_images(init, "init")
        # a float offset (1.5) keyed every item's random draws as item_offset 1: shards drew alike without a word
        check_whole(item_offset, "item_offset", least=0, why=" (the first item's global number)")
        item_offset = int(item_offset)
        # A bf16 or fp16 iterate would round every step away and saturate the steppers' step counts at 256.
        caller_dtype, init = init.dtype, init.float()
        if not callable(objective):
            raise TypeError(f"objective must be callable (an nn.Module), got {type(objective).__name__}")
        objective = _as_objective(objective)
        _check_image_shape(init, getattr(objective, "image_shape", None))
        init = _match_items(init, objective.num_items)
        device = init.device
        for tensor in list(objective.parameters()) + list(objective.buffers()):
            if tensor.device != device:
                raise ValueError(
                    f"objective holds tensors on {tensor.device} but init is on {device}: move one with .to(device)"
                )
        task_objective, objective = objective, self._with_extras(objective, item_offset, device)
        n = init.shape[0]
        parametrization = make_parametrization(cfg.parametrization, cfg.stop_at_bounds)
        # steps=0 only scores the starting images; a schedule over zero steps is never consulted.
        stepper = make_stepper(cfg.stepper, cfg.step_size, cfg.adam_betas, cfg.adam_eps, cfg.step_schedule, max(cfg.steps, 1))
        use_bf16 = self.resolved_precision(device) == "bf16"
        curve_steps = list(range(0, cfg.steps, cfg.log_every)) + [cfg.steps]

        with (evaluation(objective, freeze_parameters=True), memory_format(objective, torch.channels_last if cfg.channels_last else None),
              hot_loop(), torch.no_grad(), _cudnn_mode(device, cfg.deterministic)):
            loss_fn = torch.compile(objective, dynamic=True, mode=cfg.compile_mode) if cfg.compile else objective
            runner = _Runner(cfg, loss_fn, parametrization, stepper, device, use_bf16, _graph_mode(cfg, device))
            micro_batch = self._micro_batch_size(runner, init)
            out = _Outputs.allocate(init, len(curve_steps))
            chunks = range(0, n, micro_batch)
            bar = tqdm(total=cfg.steps * len(chunks), desc=desc, disable=not cfg.progress, leave=False)
            try:
                for start in chunks:
                    stop = min(start + micro_batch, n)
                    runner.run_chunk(init[start:stop], start, stop, out, bar)
            finally:
                bar.close()
            images = out.images.to(caller_dtype)
            # bf16 features leave a floor (~0.003 at the target itself); images rounded to a half-precision init move (~1 %)
            rescored = objective is not task_objective or use_bf16 or images.dtype != out.images.dtype
            task_loss = runner.task_loss(task_objective, images.float(), micro_batch) if rescored else out.best_loss.clone()
        return InversionResult(
            images=images,
            best_loss=out.best_loss,
            initial_loss=out.initial_loss,
            last_loss=out.last_loss,
            steps_used=out.steps_used,
            loss_curve=_forward_fill(out.curve),
            curve_steps=curve_steps,
            micro_batch=micro_batch,
            loop="+".join(dict.fromkeys(runner.loops)),
            item_steps_computed=runner.item_steps_computed,
            task_loss=task_loss,
        )

    # ------------------------------------------------------------------ helpers

    def _with_extras(self, objective: Objective, item_offset: int, device: torch.device) -> Objective:
        """The caller's objective under transformation robustness, plus the config's priors on the image itself: the
        transformations serve the representation term only, as in the authors' deep-learning-base (``BaseLoss`` warps
        the input of its representation losses; "regularization must be applied to the original image")."""
        cfg = self.config
        if cfg.transform_robust:
            objective = TransformRobust(
                objective, samples=cfg.transform_samples, seed=cfg.seed, item_offset=item_offset
            ).to(device)
        if cfg.tv_weight:
            objective = objective + TotalVariation(cfg.tv_weight, cfg.tv_beta)
        if cfg.lp_weight:
            objective = objective + LpPrior(cfg.lp_weight, cfg.lp_p)
        return objective

    def _micro_batch_size(self, runner: "_Runner", init: Tensor) -> int:
        cfg, n = self.config, init.shape[0]
        if cfg.micro_batch is not None:
            return min(cfg.micro_batch, n)
        if init.device.type != "cuda":
            return min(cfg.cpu_micro_batch, n)
        size = runner.measure_micro_batch(init, cfg.memory_fraction)
        logger.info("micro-batch of %d items (of %d) from the CUDA memory budget", size, n)
        return size


class _CallableObjective(Objective):
    """Wraps a callable ``fn(x, items, step)`` (a function or a module) as an :class:`Objective`. A module is put in
    eval mode, frozen and checked for its device with the run; a model that a plain function closes over is not seen:
    put it in eval mode yourself (a batch norm in train mode would couple the items), or pass an Objective module."""

    def __init__(self, fn: Any):
        super().__init__()
        self.fn = fn

    def forward(self, x: Tensor, items: Optional[Tensor] = None, step: Any = 0) -> Tensor:
        return self.fn(x, items, step)


@contextlib.contextmanager
def _cudnn_mode(device: torch.device, deterministic: bool):
    """Deterministic cuDNN kernels (and no autotuning) for the run on CUDA; the previous flags are restored."""
    if device.type != "cuda" or not deterministic:
        yield
        return
    previous = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous


def _graph_mode(cfg: InvertConfig, device: torch.device) -> str:
    """How :class:`_Runner` loops: ``capture`` (CUDA graph), ``masked`` (the same loop eagerly) or ``off``."""
    if cfg.cuda_graph is False:
        return "off"
    if device.type == "cuda" and not cfg.compile:  # a compiled objective makes its own graphs (compile_mode)
        return "capture"
    if cfg.cuda_graph is True:
        logger.info("cuda_graph=True on %s: running the captured loop's structure eagerly (no graphs off CUDA)", device)
        return "masked"
    return "off"


def _check_image_shape(init: Tensor, image_shape: Optional[tuple]) -> None:
    """Refuse starting images of another (C, H, W) than the objective's reference images: a pooled representation gives
    features of one length at any size, so 16 x 16 seeds against 32 x 32 targets would run to the end and come back at 16 x 16."""
    if image_shape is not None and tuple(init.shape[1:]) != tuple(image_shape):
        shape = "x".join(map(str, image_shape))
        raise ValueError(f"init's images are {'x'.join(map(str, init.shape[1:]))} (C x H x W) but the objective's targets or origins are "
                         f"{shape}: resize or crop the seeds to {shape} (e.g. torch.nn.functional.interpolate) before inverting")


def _match_items(init: Tensor, num_items: Optional[int]) -> Tensor:
    """``init`` with one row per item of the objective (a single row is shared by all; see :meth:`Engine.run`)."""
    if num_items is None or init.shape[0] == num_items:
        return init
    if init.shape[0] == 1:
        return init.expand(num_items, *init.shape[1:]).contiguous()
    raise ValueError(
        f"the objective holds {num_items} items (targets or origins) but init has {init.shape[0]} starting images: "
        f"pass one start per item (e.g. seeds.repeat_interleave(k, 0) for k starts per target, with the targets "
        f"repeated to match), or a single start (1, C, H, W) to share it"
    )


def _as_objective(objective: nn.Module) -> Objective:
    return objective if isinstance(objective, Objective) else _CallableObjective(objective)


@dataclass
class _Outputs:
    images: Tensor
    best_loss: Tensor
    initial_loss: Tensor
    last_loss: Tensor
    steps_used: Tensor
    curve: Tensor

    @classmethod
    def allocate(cls, init: Tensor, points: int) -> "_Outputs":
        n, device = init.shape[0], init.device
        return cls(
            images=torch.empty_like(init, memory_format=torch.contiguous_format),
            best_loss=torch.full((n,), math.nan, device=device),
            initial_loss=torch.full((n,), math.nan, device=device),
            last_loss=torch.full((n,), math.nan, device=device),
            steps_used=torch.zeros(n, dtype=torch.long, device=device),
            curve=torch.full((points, n), math.nan, device=device),
        )


def _forward_fill(curve: Tensor) -> Tensor:
    """Fill each column's NaNs with its last value above (compacted samples stop being written)."""
    points = torch.arange(curve.shape[0], device=curve.device).unsqueeze(1).expand_as(curve)
    last = torch.where(torch.isnan(curve), torch.zeros_like(points), points).cummax(dim=0).values
    return curve.gather(0, last)


class _Runner:
    """The step loop for one micro-batch at a time.

    ``graphs``: ``off`` (eager, frozen samples compacted away at reports), ``capture`` (the step replayed as a CUDA
    graph, frozen samples masked) or ``masked`` (the captured loop's structure run eagerly: the graph-free fallback
    of ``cuda_graph=True`` off CUDA; it gives the same results as ``off``). A capture that fails under
    ``cuda_graph='auto'`` runs the ``capture`` loop without a graph, i.e. masked.
    """

    def __init__(
        self,
        cfg: InvertConfig,
        loss_fn: nn.Module,
        parametrization: Parametrization,
        stepper: Stepper,
        device: torch.device,
        use_bf16: bool,
        graphs: str = "off",
    ):
        self.cfg, self.loss_fn, self.parametrization, self.stepper = cfg, loss_fn, parametrization, stepper
        self.device = device
        self.graphs = graphs
        self.loops: list[str] = []  # how each micro-batch ran (InversionResult.loop)
        self.item_steps_computed = 0
        # No autocast cache: it would hold casts across steps, which a CUDA graph capture does not allow; the engine's
        # weights are frozen (requires_grad off), which the cache skips anyway.
        self.autocast = (
            (lambda: torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)) if use_bf16 else contextlib.nullcontext
        )

    # -- one evaluation

    def _image(self, param: Tensor) -> Tensor:
        image = self.parametrization.to_image(param)
        if self.cfg.channels_last and image.ndim == 4:
            image = image.contiguous(memory_format=torch.channels_last)
        return image

    def loss(self, param: Tensor, rows: Tensor, step: Tensor) -> Tensor:
        with self.autocast():
            return self._checked(self.loss_fn(self._image(param), rows, step), param).float()

    def loss_and_grad(self, param: Tensor, rows: Tensor, step: Tensor) -> tuple[Tensor, Tensor]:
        with torch.enable_grad():
            param = param.detach().requires_grad_(True)
            loss = self.loss(param, rows, step)
            (grad,) = torch.autograd.grad(loss.sum(), param)
        return loss.detach(), grad

    @staticmethod
    def _checked(loss: Tensor, param: Tensor) -> Tensor:
        if not isinstance(loss, Tensor) or loss.shape != param.shape[:1]:
            shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
            raise ValueError(
                f"the objective must return one loss per sample, shape ({param.shape[0]},), got {shape}; "
                "do not reduce over the batch (no .mean() / .sum())"
            )
        return loss

    def task_loss(self, objective: nn.Module, images: Tensor, micro_batch: int) -> Tensor:
        """``objective`` (the caller's, without the engine's extras) at the kept ``images``, one micro-batch at a time, at
        the last step, in float32."""
        rows = torch.arange(images.shape[0], device=images.device)
        step = torch.tensor(self.cfg.steps, device=images.device)
        losses = []
        for start in range(0, images.shape[0], micro_batch):
            image = images[start:start + micro_batch]
            losses.append(self._checked(objective(image, rows[start:start + micro_batch], step), image).float())
        return torch.cat(losses)

    # -- the loop

    def _start(self, init: Tensor, rows: Tensor) -> _Working:
        """The working set of ``init``'s samples; every tensor is its own buffer (the step updates them in place)."""
        param = self.parametrization.from_image(init)
        layout = torch.channels_last if self.cfg.channels_last and param.ndim == 4 else torch.contiguous_format
        param = param.clone(memory_format=layout)
        n = param.shape[0]

        def filled(value: float) -> Tensor:
            return torch.full((n,), value, device=self.device)

        def zeros(dtype: torch.dtype) -> Tensor:
            return torch.zeros(n, dtype=dtype, device=self.device)

        return _Working(
            rows=rows,
            param=param,
            state=self.stepper.init_state(param),
            best_param=param.clone(memory_format=layout),
            best_loss=filled(math.inf),
            reference=filled(math.inf),
            since=zeros(torch.long),
            evaluated=zeros(torch.long),
            frozen=zeros(torch.bool),
            nonfinite=zeros(torch.bool),
            initial_loss=filled(math.inf),
            last_loss=filled(math.inf),
        )

    def _track(self, w: _Working, loss: Tensor) -> None:
        """Score the current iterate in place: best tracking, non-finite flags, early stopping. Device-only."""
        cfg = self.cfg
        active = ~w.frozen
        w.initial_loss.copy_(torch.where(active & (w.evaluated == 0), loss, w.initial_loss))
        improved = active & (loss < w.best_loss) if cfg.keep_best else active
        w.best_loss.copy_(torch.where(improved, loss, w.best_loss))
        w.best_param.copy_(torch.where(_bcast(improved, w.param), w.param, w.best_param))
        w.evaluated.add_(active)
        w.last_loss.copy_(torch.where(active, loss, w.last_loss))
        w.nonfinite.logical_or_(active & ~torch.isfinite(loss))
        if cfg.patience is not None:
            self._check_patience(w, active)
        if cfg.loss_threshold is not None:
            w.frozen.logical_or_(w.best_loss <= cfg.loss_threshold)

    def _check_patience(self, w: _Working, active: Tensor) -> None:
        """Freeze a sample once ``patience`` steps have passed since its best loss last improved by more than
        ``rtol`` (relative to the best loss at that improvement).

        The window slides per sample (as ``torch.optim.lr_scheduler.ReduceLROnPlateau`` with ``threshold_mode='rel'``
        counts bad epochs), so ``patience`` means exactly that many steps. The engine's first rule compared the best
        loss at fixed boundaries (steps patience, 2 patience, ...), which waited anywhere between ``patience`` and
        ``2 patience`` steps depending on where a stall began. Neither rule protects quality by itself: with the
        paper's fixed L2 step (eta 1) the best loss stalls for long stretches and then improves again, so the
        patience must outlast those stalls (``benchmarks/early_stopping_study.py`` measures what a setting costs).
        """
        cfg = self.cfg
        significant = active & (torch.isinf(w.reference) | (w.reference - w.best_loss > cfg.rtol * w.reference.abs()))
        w.reference.copy_(torch.where(significant, w.best_loss, w.reference))
        w.since.copy_(torch.where(significant, w.evaluated, w.since))
        w.frozen.logical_or_(active & (w.evaluated - w.since >= cfg.patience))

    def step(self, w: _Working, step: Tensor) -> None:
        """One iteration of the working set, in place and without a host sync: score the iterate (forward and
        backward), track it, step it; frozen samples keep their iterate. This one function is what the eager loop
        calls and what :meth:`_capture` records as a CUDA graph, so the two paths compute the same thing."""
        loss, grad = self.loss_and_grad(w.param, w.rows, step)
        self._track(w, loss)
        stepped = self.parametrization.project(self.stepper.step(w.param, grad, w.state))
        w.param.copy_(torch.where(_bcast(w.frozen, stepped), w.param, stepped))
        step.add_(1)

    def _capture(self, w: _Working, step: Tensor) -> Optional[Callable[[], None]]:
        """:meth:`step` over ``w``'s buffers captured as one CUDA graph; returns its ``replay`` (None where capture
        failed and ``cuda_graph='auto'`` allows the eager loop).

        Warm-up steps (cuDNN autotuning, autograd's lazy state; PyTorch's capture recipe) run on a copy of the working
        set on a side stream, so they change no result; capture itself executes nothing.
        """
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)

        def warm_up() -> None:
            with torch.cuda.stream(side):
                copy, copy_step = w.clone(), step.clone()
                for _ in range(_GRAPH_WARMUP_STEPS):
                    self.step(copy, copy_step)
            current.wait_stream(side)

        return capture_cuda_graph(
            lambda: self.step(w, step), device=self.device, strict=self.cfg.cuda_graph is True, what="the engine's step",
            suspect="the objective", fix="Set cuda_graph='auto' to fall back to the eager loop, or cuda_graph=false.", warm_up=warm_up,
        )

    def run_chunk(self, init: Tensor, start: int, stop: int, out: _Outputs, bar: Any) -> None:
        """Optimise items ``start:stop`` (``init`` holds their seeds) and write their results.

        Eager (``graphs`` off), frozen samples are compacted out of the working set at each report; with graphs the
        shapes are fixed, frozen samples stay masked in place, and the chunk ends when all of them are frozen.
        """
        cfg = self.cfg
        w = self._start(init, torch.arange(start, stop, device=self.device))
        rows_host = np.arange(start, stop)  # the host's copy of the working-set layout
        mirror = _HostMirror(self.device)
        step = torch.zeros((), dtype=torch.long, device=self.device)
        replay = self._capture(w, step) if self.graphs == "capture" and cfg.steps > 0 else None
        if self.graphs == "capture" and cfg.steps > 0 and replay is None:
            self.graphs = "masked"  # capture failed (cuda_graph='auto'): not tried again, with its warm-up and warning, per micro-batch
        compact = self.graphs == "off"
        self.loops.append("cuda-graph" if replay is not None else "eager" if compact else "masked")
        finished = False
        last_report = 0
        for t in range(cfg.steps):
            if replay is not None:
                replay()
            else:
                self.step(w, step)
            self.item_steps_computed += w.rows.numel()  # shape metadata: no sync
            if t % cfg.log_every == 0:
                out.curve[t // cfg.log_every].index_copy_(0, w.rows, w.best_loss)
                snapshot = mirror.exchange(self._summary(w), (rows_host, t))
                bar.update(t - last_report)
                last_report = t
                if snapshot is not None:
                    w, rows_host, finished = self._report(snapshot, w, rows_host, out, bar, compact)
                    if finished:
                        break
        if not finished:
            self._track(w, self.loss(w.param, w.rows, step))  # the last iterate (after the last step)
            out.curve[-1].index_copy_(0, w.rows, w.best_loss)
        bar.update(cfg.steps - last_report)
        for snapshot in (mirror.drain(), (self._summary(w).cpu(), (rows_host, cfg.steps))):
            if snapshot is not None:
                self._raise_if_nonfinite(snapshot)
        self._write(w, torch.arange(w.rows.numel(), device=self.device), out)

    # -- reports (every log_every steps): the loop's only host syncs

    @staticmethod
    def _summary(w: _Working) -> Tensor:
        return torch.cat([w.best_loss, w.frozen.float(), w.nonfinite.float()])

    @staticmethod
    def _unpack(snapshot: tuple[Tensor, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        packed, (rows_host, t) = snapshot
        best, frozen, nonfinite = packed.numpy().reshape(3, -1)
        return best, frozen > 0, nonfinite > 0, rows_host, t

    def _raise_if_nonfinite(self, snapshot: tuple[Tensor, Any]) -> None:
        _, _, nonfinite, rows_host, t = self._unpack(snapshot)
        if nonfinite.any():
            bad = rows_host[nonfinite].tolist()
            raise NonFiniteLossError(
                f"the objective returned NaN or Inf for {len(bad)} item(s) {bad[:10]} by step {t}. "
                "Check the objective (a norm of zero, log of 0), the seed images, or try a smaller "
                "step_size or precision='fp32'."
            )

    def _report(self, snapshot, w: _Working, rows_host: np.ndarray, out: _Outputs, bar: Any, compact: bool):
        """Log a snapshot; compact frozen samples away (``compact``). Returns (working set, its rows, all finished)."""
        self._raise_if_nonfinite(snapshot)
        best, frozen, _, snap_rows, t = self._unpack(snapshot)
        active = int((~frozen).sum())
        finite = best[np.isfinite(best)]
        stats = (float(np.median(finite)), float(finite.min()), float(finite.max())) if finite.size else (math.nan,) * 3
        bar.set_postfix(active=active, best_median=f"{stats[0]:.4g}", refresh=False)
        logger.info("step %d: %d/%d samples active, best loss median %.4g (min %.4g, max %.4g)", t, active, len(best), *stats)
        if not compact:  # fixed shapes (a captured graph): frozen samples stay, masked
            return w, rows_host, active == 0
        # Compact: drop the rows the snapshot saw frozen (the snapshot may be one report old).
        drop = np.isin(rows_host, snap_rows[frozen])
        if not drop.any():
            return w, rows_host, False
        self._write(w, _to_device(np.flatnonzero(drop), self.device), out)
        keep = np.flatnonzero(~drop)
        return w.select(_to_device(keep, self.device)), rows_host[keep], keep.size == 0

    def _write(self, w: _Working, index: Tensor, out: _Outputs) -> None:
        """Store finished samples' results in the outputs."""
        rows = w.rows[index]
        # The clamp only removes float rounding of non-pixel parametrisations (about 1e-7).
        images = self.parametrization.to_image(w.best_param[index]).clamp(0.0, 1.0).contiguous()
        out.images.index_copy_(0, rows, images)
        out.best_loss.index_copy_(0, rows, w.best_loss[index])
        out.initial_loss.index_copy_(0, rows, w.initial_loss[index])
        out.last_loss.index_copy_(0, rows, w.last_loss[index])
        out.steps_used.index_copy_(0, rows, w.evaluated[index] - 1)

    # -- memory probe (CUDA only)

    def measure_micro_batch(self, init: Tensor, memory_fraction: float) -> int:
        """The largest micro-batch that fits ``memory_fraction`` of free GPU memory.

        Two probe steps of p and 2p samples give the fixed and the per-sample peak memory
        (``torch.cuda.max_memory_allocated``): peak(n) ~ fixed + n * per_sample.
        """
        n, device = init.shape[0], init.device
        if n == 1:  # nothing to choose, and the two probes need two items
            return 1
        probe = max(1, min(8, n // 2))
        peaks = []
        for size in (probe, 2 * probe):
            torch.cuda.synchronize(device)
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            w = self._start(init[:size], torch.arange(size, device=device))
            self.step(w, torch.zeros((), dtype=torch.long, device=device))
            torch.cuda.synchronize(device)
            peaks.append(torch.cuda.max_memory_allocated(device) - base)
            del w
        per_sample = max((peaks[1] - peaks[0]) / probe, peaks[1] / (2 * probe) * 0.25, 1.0)
        fixed = max(peaks[0] - probe * per_sample, 0.0)
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        budget = memory_fraction * (free + cached) - fixed
        return int(max(1, min(n, budget // per_sample)))


def _to_device(index: np.ndarray, device: torch.device) -> Tensor:
    """A host index array on the device without a blocking copy (pinned memory on CUDA)."""
    tensor = torch.from_numpy(index.astype(np.int64))
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def resolve_engine(engine: Engine | InvertConfig | Mapping | str | None) -> Engine:
    """An :class:`invert.Engine` from an engine, a config, a mapping of config keys, a preset name
    (``paper``, ``fast``) or None (the paper's settings, :class:`invert.InvertConfig` defaults)."""
    if engine is None:
        return Engine(InvertConfig())
    if isinstance(engine, Engine):
        return engine
    if isinstance(engine, InvertConfig):
        return Engine(engine)
    if isinstance(engine, str):
        return Engine.preset(engine)
    if isinstance(engine, Mapping) or hasattr(engine, "_metadata"):
        return Engine(InvertConfig.from_dict(engine))
    raise TypeError(f"engine must be an invert.Engine, InvertConfig, mapping or preset name, got {type(engine).__name__}")


def invert_batch(
    objective: nn.Module, init: Tensor, config: Optional[InvertConfig] = None, **overrides: Any
) -> InversionResult:
    """One-call form of ``Engine(config, **overrides).run(objective, init)``."""
    return Engine(config, **overrides).run(objective, init)
