"""The batched runner: all items at once, each sample stepped on its own, no host syncs per step.

``Engine(config).run(objective, init)`` minimises a per-sample objective (see
:mod:`invert.objectives`) from the [0, 1] images ``init``, one row per item, and returns an
:class:`InversionResult`. The reference algorithm (Nanda et al. AAAI 2023, run there with the
``robustness`` library's ``Attacker`` and ``use_best=True``) is, per sample,
``x <- clamp(x - eta * g / ||g||_2, 0, 1)`` for 5000 steps, keeping the lowest-loss iterate; as in
that run under torch 2.x, pixels on the box boundary get no gradient (see :class:`invert.params.Pixel`).

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
    * Options: bf16 autocast, channels-last, ``torch.compile`` of the objective.
"""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .config import InvertConfig, load_preset
from .modules import evaluation
from .objectives import LpPrior, Objective, TotalVariation, TransformRobust
from .params import Parametrization, make_parametrization
from .steps import Stepper, make_stepper, select_state
from .validation import check_images, hot_loop

logger = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """The objective returned NaN or Inf for some items."""


@dataclass
class InversionResult:
    """What :meth:`Engine.run` returns; tensors live on the device of ``init``.

    images: (N, C, H, W) in [0, 1], each item's best iterate (its last one if ``keep_best`` is off).
    best_loss: (N,) the loss of ``images``.
    initial_loss: (N,) the loss of ``init``.
    last_loss: (N,) the loss of each item's last iterate (where it stopped, or at ``steps``); with ``keep_best``
        ``best_loss`` may be lower. The two together say whether an item was still moving.
    steps_used: (N,) gradient steps each item took before it finished or was frozen.
    loss_curve: (len(curve_steps), N) each item's best loss so far at ``curve_steps``
        (0, log_every, 2 log_every, ..., steps).
    curve_steps: the step of each row of ``loss_curve``.
    micro_batch: the micro-batch size that was used.
    """

    images: Tensor
    best_loss: Tensor
    initial_loss: Tensor
    last_loss: Tensor
    steps_used: Tensor
    loss_curve: Tensor
    curve_steps: list[int]
    micro_batch: int


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
        event.record()
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
    reference: Tensor  # best loss at the start of the current patience window
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
            evaluated=self.evaluated[keep],
            frozen=self.frozen[keep],
            nonfinite=self.nonfinite[keep],
            initial_loss=self.initial_loss[keep],
            last_loss=self.last_loss[keep],
        )


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

    # ------------------------------------------------------------------ public entry point

    def run(self, objective: nn.Module, init: Tensor, *, item_offset: int = 0, desc: str = "invert") -> InversionResult:
        """Minimise ``objective`` from the [0, 1] images ``init`` (N, C, H, W), one row per item.

        ``objective(x, items, step) -> (n,)`` (see :mod:`invert.objectives`); row i of ``init`` is
        item i of the objective's buffers. The counts must match: one starting image per item (per
        target, per origin). The one exception, by rule: a single starting image (shape (1, C, H, W))
        is used for every item, as a shared seed. ``item_offset`` shifts the items' random keys (for runs
        split into shards that should draw as one run). The objective is run in eval mode with its
        parameters frozen; both are restored afterwards. With ``channels_last``, its 4-D weights are
        converted to channels-last in place (numerically harmless).
        """
        cfg = self.config
        check_images(init, "init")
        if not callable(objective):
            raise TypeError(f"objective must be callable (an nn.Module), got {type(objective).__name__}")
        objective = _as_objective(objective)
        init = _match_items(init, objective.num_items)
        device = init.device
        for tensor in list(objective.parameters()) + list(objective.buffers()):
            if tensor.device != device:
                raise ValueError(
                    f"objective holds tensors on {tensor.device} but init is on {device}: move one with .to(device)"
                )
        objective = self._with_extras(objective, item_offset, device)
        n = init.shape[0]
        parametrization = make_parametrization(cfg.parametrization, cfg.stop_at_bounds)
        stepper = make_stepper(cfg.stepper, cfg.step_size, cfg.adam_betas, cfg.adam_eps, cfg.step_schedule, cfg.steps)
        use_bf16 = cfg.precision == "bf16" or (
            cfg.precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()
        )
        curve_steps = list(range(0, cfg.steps, cfg.log_every)) + [cfg.steps]

        with evaluation(objective, freeze_parameters=True), hot_loop(), torch.no_grad(), _cudnn_mode(device, cfg.deterministic):
            if cfg.channels_last:
                objective.to(memory_format=torch.channels_last)
            loss_fn = torch.compile(objective, dynamic=True, mode=cfg.compile_mode) if cfg.compile else objective
            runner = _Runner(cfg, loss_fn, parametrization, stepper, device, use_bf16)
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
        return InversionResult(
            images=out.images,
            best_loss=out.best_loss,
            initial_loss=out.initial_loss,
            last_loss=out.last_loss,
            steps_used=out.steps_used,
            loss_curve=_forward_fill(out.curve),
            curve_steps=curve_steps,
            micro_batch=micro_batch,
        )

    # ------------------------------------------------------------------ helpers

    def _with_extras(self, objective: Objective, item_offset: int, device: torch.device) -> Objective:
        """The caller's objective plus the config's priors and transformation robustness."""
        cfg = self.config
        if cfg.tv_weight:
            objective = objective + TotalVariation(cfg.tv_weight, cfg.tv_beta)
        if cfg.lp_weight:
            objective = objective + LpPrior(cfg.lp_weight, cfg.lp_p)
        if cfg.transform_robust:
            objective = TransformRobust(
                objective, samples=cfg.transform_samples, seed=cfg.seed, item_offset=item_offset
            ).to(device)
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
    """Wraps a callable ``fn(x, items, step)`` (a function or a module) as an :class:`Objective`."""

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
    """The step loop for one micro-batch at a time."""

    def __init__(
        self,
        cfg: InvertConfig,
        loss_fn: nn.Module,
        parametrization: Parametrization,
        stepper: Stepper,
        device: torch.device,
        use_bf16: bool,
    ):
        self.cfg, self.loss_fn, self.parametrization, self.stepper = cfg, loss_fn, parametrization, stepper
        self.device = device
        self.autocast = (
            (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_bf16 else contextlib.nullcontext
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

    # -- the loop

    def _start(self, init: Tensor, rows: Tensor) -> _Working:
        param = self.parametrization.from_image(init)
        if self.cfg.channels_last and param.ndim == 4:
            param = param.contiguous(memory_format=torch.channels_last)
        n = param.shape[0]
        inf = torch.full((n,), math.inf, device=self.device)
        return _Working(
            rows=rows,
            param=param,
            state=self.stepper.init_state(param),
            best_param=param,
            best_loss=inf,
            reference=inf,
            evaluated=torch.zeros(n, dtype=torch.long, device=self.device),
            frozen=torch.zeros(n, dtype=torch.bool, device=self.device),
            nonfinite=torch.zeros(n, dtype=torch.bool, device=self.device),
            initial_loss=inf,
            last_loss=inf,
        )

    def _track(self, w: _Working, loss: Tensor) -> None:
        """Score the current iterate: best tracking, non-finite flags, early stopping. Device-only."""
        cfg = self.cfg
        active = ~w.frozen
        improved = active & (loss < w.best_loss) if cfg.keep_best else active
        w.best_loss = torch.where(improved, loss, w.best_loss)
        w.best_param = torch.where(_bcast(improved, w.param), w.param, w.best_param)
        w.evaluated = w.evaluated + active
        w.last_loss = torch.where(active, loss, w.last_loss)
        w.nonfinite = w.nonfinite | (active & ~torch.isfinite(loss))
        if cfg.loss_threshold is not None:
            w.frozen = w.frozen | (w.best_loss <= cfg.loss_threshold)

    def _check_patience(self, w: _Working) -> None:
        stalled = (w.reference - w.best_loss) <= self.cfg.rtol * w.reference.abs()
        w.frozen = w.frozen | stalled
        w.reference = w.best_loss

    def run_chunk(self, init: Tensor, start: int, stop: int, out: _Outputs, bar: Any) -> None:
        """Optimise items ``start:stop`` (``init`` holds their seeds) and write their results."""
        cfg = self.cfg
        w = self._start(init, torch.arange(start, stop, device=self.device))
        rows_host = np.arange(start, stop)  # the host's copy of the working-set layout
        mirror = _HostMirror(self.device)
        step = torch.zeros((), dtype=torch.long, device=self.device)
        last_report = 0
        for t in range(cfg.steps):
            loss, grad = self.loss_and_grad(w.param, w.rows, step)
            if t == 0:
                w.initial_loss = loss
                w.reference = loss
            self._track(w, loss)
            if cfg.patience is not None and t > 0 and t % cfg.patience == 0:
                self._check_patience(w)
            w.param = self.parametrization.project(self.stepper.step(w.param, grad, w.state))
            step += 1
            if t % cfg.log_every == 0:
                out.curve[t // cfg.log_every].index_copy_(0, w.rows, w.best_loss)
                snapshot = mirror.exchange(self._summary(w), (rows_host, t))
                bar.update(t - last_report)
                last_report = t
                if snapshot is not None:
                    w, rows_host = self._report(snapshot, w, rows_host, out, bar)
                    if w.rows.numel() == 0:
                        break
        if w.rows.numel() > 0:
            loss = self.loss(w.param, w.rows, step)
            if cfg.steps == 0:
                w.initial_loss = loss
            self._track(w, loss)
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

    def _report(self, snapshot, w: _Working, rows_host: np.ndarray, out: _Outputs, bar: Any):
        self._raise_if_nonfinite(snapshot)
        best, frozen, _, snap_rows, t = self._unpack(snapshot)
        active = int((~frozen).sum())
        finite = best[np.isfinite(best)]
        stats = (float(np.median(finite)), float(finite.min()), float(finite.max())) if finite.size else (math.nan,) * 3
        bar.set_postfix(active=active, best_median=f"{stats[0]:.4g}", refresh=False)
        logger.info("step %d: %d/%d samples active, best loss median %.4g (min %.4g, max %.4g)", t, active, len(best), *stats)
        # Compact: drop the rows the snapshot saw frozen (the snapshot may be one report old).
        drop = np.isin(rows_host, snap_rows[frozen])
        if not drop.any():
            return w, rows_host
        self._write(w, _to_device(np.flatnonzero(drop), self.device), out)
        return w.select(_to_device(np.flatnonzero(~drop), self.device)), rows_host[~drop]

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
        probe = max(1, min(8, n // 2))
        peaks = []
        for size in (probe, 2 * probe):
            torch.cuda.synchronize(device)
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            w = self._start(init[:size], torch.arange(size, device=device))
            loss, grad = self.loss_and_grad(w.param, w.rows, torch.zeros((), dtype=torch.long, device=device))
            self._track(w, loss)
            w.param = self.parametrization.project(self.stepper.step(w.param, grad, w.state))
            torch.cuda.synchronize(device)
            peaks.append(torch.cuda.max_memory_allocated(device) - base)
            del w, loss, grad
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
