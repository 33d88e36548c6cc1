"""The engine's configuration: one flat dataclass whose fields are the keys of ``conf/invert/*.yaml``.

Presets (the Hydra config group ``invert``): ``paper`` (= ``default``) is the reference of Nanda et
al. (AAAI 2023): L2-normalised steps of eta 1.0 on pixels, 5000 iterations, keeping each sample's
best iterate. ``fast`` trades a little quality for speed: fewer steps, early stopping, bf16 on CUDA,
channels-last.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from omegaconf import OmegaConf

from .objectives import LP_BELOW_ONE, NEGATIVE_PRIOR
from .params import PARAMETRIZATIONS
from .steps import STEP_SCHEDULES, STEPPERS
from .validation import check_number

PRECISIONS = ("fp32", "bf16", "auto")
CUDA_GRAPH_MODES = (False, True, "auto")


BOOLEAN_FIELDS = ("stop_at_bounds", "keep_best", "transform_robust", "channels_last", "compile", "deterministic", "progress")
FLOAT_FIELDS = ("step_size", "adam_eps", "rtol", "tv_weight", "tv_beta", "lp_weight", "lp_p", "memory_fraction")


@dataclass
class InvertConfig:
    """How the engine optimises. Every field is a key of the ``invert`` Hydra group.

    Optimisation
        steps: iterations (gradient steps) per sample.
        stepper: ``l2`` (x - eta g/||g||, the reference), ``linf`` (sign steps) or ``adam``.
        step_size: eta for ``l2``/``linf``, the learning rate for ``adam``.
        step_schedule: ``constant`` (the reference), ``cosine`` or ``linear``: the step size decays from
            ``step_size`` towards 0 over ``steps`` (see :class:`invert.steps.ScheduledStep`).
        adam_betas, adam_eps: Adam's constants.
        parametrization: ``pixel`` (clamped, the reference), ``sigmoid`` or ``fourier``.
        stop_at_bounds: ``pixel`` only: pixels exactly at 0 or 1 get no gradient, as the ``robustness``
            reference behaves under torch releases since 2026, whose clamp (its input's) passes no
            gradient at the bounds (:func:`invert.params.clamp_stops_gradient_at_bounds`). Off by
            default: the authors' torch passed it (subgradient 1 from 2018 to 2026), and over long runs
            stuck pixels saturate the image (1000-step digits demo: robust 2AFC 15 % with it off, 4 % on).
            The benchmark sets it to what the installed torch does, to run exactly the anchor's algorithm.
        keep_best: return each sample's lowest-loss iterate (``robustness``'s use_best) instead of
            the last one.
    Early stopping (per sample; a frozen sample costs nothing more once compacted away)
        patience: freeze a sample whose best loss (its last loss with ``keep_best=False``) improved by less
            than ``rtol`` (relative) over the last ``patience`` steps; None turns it off.
        rtol: the relative improvement required per window.
        loss_threshold: freeze a sample as soon as its best loss is at or below this; None: off.
    Objective extras, added to the caller's objective by the engine
        tv_weight, tv_beta: total variation prior (off at weight 0).
        lp_weight, lp_p: alpha-norm prior on x - 0.5 (off at weight 0).
        transform_robust, transform_samples: average the objective over random jitter, scale and
            rotation (the authors' ``trans_robust``), with this many draws per step. The best
            iterate is then chosen on this stochastic loss, as in the authors' code.
        seed: base seed of every random draw, keyed per item.
    Execution
        precision: ``fp32``, ``bf16`` (autocast) or ``auto`` (bf16 on CUDA, fp32 elsewhere).
        channels_last: run the model and 4-D parameters in channels-last memory format.
        compile: ``torch.compile`` the objective (``compile_mode`` is its mode).
        cuda_graph: on CUDA, capture the whole step (forward and backward, the normalised update, the clamp, best
            and early-stopping bookkeeping) once per micro-batch as a CUDA graph and replay it: one launch per
            step instead of hundreds, for small batches where the step is bound by kernel launches. Finished
            samples are masked, not removed, so the graph is never captured again. ``True``: capture, or fail with
            the reason; ``'auto'``: capture where possible (CUDA, no ``compile``), else the eager loop (where a
            capture on CUDA fails, the captured loop's masked structure, run eagerly); ``False``: eager. Off CUDA,
            ``True`` runs the captured loop's structure eagerly (the same results; a test checks).
        deterministic: on CUDA, run with deterministic cuDNN algorithms (``torch.backends.cudnn.deterministic``,
            no autotuning), so that an item's result does not depend on the run: a sharded set then equals
            the unsharded one bit for bit, provided each chunk gets the same micro-batches (a fixed
            ``micro_batch``, or chunks that fit one). Not covered: ``transform_robust``'s ``grid_sample``, whose
            CUDA backward sums with atomic adds in no fixed order. Off: cuDNN may pick faster, non-deterministic
            backward kernels whose float sums differ from run to run.
        micro_batch: items per micro-batch; None: measured from the memory budget on CUDA,
            ``cpu_micro_batch`` elsewhere.
        memory_fraction: share of free GPU memory the micro-batches may use.
        log_every: the engine reads results back, logs, updates the progress bar, checks for
            NaN/Inf and drops frozen samples every this many steps (its only host syncs).
        progress: show a tqdm progress bar.
    """

    steps: int = 5000
    stepper: str = "l2"
    step_size: float = 1.0
    step_schedule: str = "constant"
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    parametrization: str = "pixel"
    stop_at_bounds: bool = False
    keep_best: bool = True
    patience: Optional[int] = None
    rtol: float = 1e-3
    loss_threshold: Optional[float] = None
    tv_weight: float = 0.0
    tv_beta: float = 2.0
    lp_weight: float = 0.0
    lp_p: float = 6.0
    transform_robust: bool = False
    transform_samples: int = 1
    seed: int = 0
    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False
    compile_mode: Optional[str] = None
    cuda_graph: Union[bool, str] = False
    deterministic: bool = True
    micro_batch: Optional[int] = None
    cpu_micro_batch: int = 256
    memory_fraction: float = 0.8
    log_every: int = 50
    progress: bool = True

    def __post_init__(self) -> None:
        self.adam_betas = tuple(self.adam_betas)  # YAML gives a list
        if self.stepper not in STEPPERS:
            raise ValueError(f"unknown stepper {self.stepper!r}; choose one of {sorted(STEPPERS)}")
        if self.step_schedule not in STEP_SCHEDULES:
            raise ValueError(f"unknown step_schedule {self.step_schedule!r}; choose one of {sorted(STEP_SCHEDULES)}")
        if self.parametrization not in PARAMETRIZATIONS:
            raise ValueError(
                f"unknown parametrization {self.parametrization!r}; choose one of {sorted(PARAMETRIZATIONS)}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {list(PRECISIONS)}")
        for name in ("steps", "patience", "log_every", "micro_batch", "cpu_micro_batch", "transform_samples", "seed"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
                raise ValueError(f"{name} must be an integer, got {value!r} (write 1000, not 1e3 or 1000.0)")
        for name in BOOLEAN_FIELDS:  # Hydra reads keep_best=no as the text 'no', which is truthy
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value in (0, 1):
                setattr(self, name, bool(value))
            elif not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {value!r}")
        for name in FLOAT_FIELDS:  # a text value ('1e-3 ' from a shell) failed later in math.isfinite with an unnamed TypeError
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if not all(isinstance(beta, numbers.Real) and not isinstance(beta, bool) for beta in self.adam_betas):
            raise ValueError(f"adam_betas must be two numbers, got {list(self.adam_betas)!r}")
        if self.loss_threshold is not None and (isinstance(self.loss_threshold, bool) or not isinstance(self.loss_threshold, numbers.Real)
                                                or not math.isfinite(self.loss_threshold)):
            raise ValueError(f"loss_threshold must be a finite number (or null for none), got {self.loss_threshold!r}: NaN switched it off")
        for name in ("log_every", "cpu_micro_batch", "transform_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        # NaN and inf fail every check below: a NaN step size would surface later as a NaN loss blamed on the objective
        if not (math.isfinite(self.step_size) and self.step_size > 0):
            raise ValueError(f"step_size must be a positive finite number, got {self.step_size}")
        if (len(self.adam_betas) != 2 or not all(0 <= beta < 1 for beta in self.adam_betas)
                or not (math.isfinite(self.adam_eps) and self.adam_eps > 0)):
            raise ValueError(f"adam_betas must be two numbers in [0, 1) and adam_eps positive and finite, got {list(self.adam_betas)}, {self.adam_eps}")
        check_number(self.rtol, "rtol", least=0)
        check_number(self.tv_weight, "tv_weight", least=0, why=NEGATIVE_PRIOR)
        check_number(self.lp_weight, "lp_weight", least=0, why=NEGATIVE_PRIOR)
        check_number(self.tv_beta, "tv_beta", positive=True)
        check_number(self.lp_p, "lp_p", least=1, why=LP_BELOW_ONE)
        if self.stop_at_bounds and self.parametrization != "pixel":
            raise ValueError(f"stop_at_bounds applies to parametrization=pixel only (a {self.parametrization} image never sits at a clamp); "
                             "set stop_at_bounds=false")
        if self.patience is not None and self.patience < 1:
            raise ValueError(f"patience must be at least 1 step (or None to disable), got {self.patience}")
        if self.micro_batch is not None and self.micro_batch < 1:
            raise ValueError(f"micro_batch must be at least 1 (or None for automatic), got {self.micro_batch}")
        if isinstance(self.cuda_graph, numbers.Integral) and self.cuda_graph in (0, 1):  # YAML/CLI 0 and 1 as booleans
            self.cuda_graph = bool(self.cuda_graph)
        if not (isinstance(self.cuda_graph, bool) or self.cuda_graph == "auto"):  # 0.0 == False, yet the engine tests `is False`
            raise ValueError(f"cuda_graph must be one of {list(CUDA_GRAPH_MODES)}, got {self.cuda_graph!r}")
        if self.cuda_graph is True and self.compile:
            raise ValueError(
                "cuda_graph=True and compile=True both want to own the step's CUDA graphs: use cuda_graph=True alone, "
                "or compile=True with compile_mode='reduce-overhead' (cuda_graph='auto' then steps aside)"
            )
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {self.memory_fraction}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "InvertConfig":
        """Build from a mapping (a YAML file, a Hydra ``DictConfig``), rejecting unknown keys."""
        if OmegaConf.is_config(values):  # a Hydra/OmegaConf container: resolve interpolations first
            values = OmegaConf.to_container(values, resolve=True)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown invert config keys {unknown}; valid keys are {sorted(known)}")
        try:
            return cls(**dict(values))
        except ValueError as err:  # 'steps must be >= 0' reads as the invert node's, whichever command composed it
            raise ValueError(f"invert config: {err}") from None

    def to_dict(self) -> dict[str, Any]:
        """The config as plain YAML-ready values (the inverse of :meth:`from_dict`)."""
        values = dataclasses.asdict(self)
        values["adam_betas"] = list(self.adam_betas)
        return values


# The presets as changes to the defaults. The Hydra group ``conf/invert/<name>.yaml`` spells out the same
# values key by key (a test keeps them equal), so the engine needs no config package to be used on its own.
PRESETS: dict[str, dict[str, Any]] = {
    "paper": {},
    "default": {},
    "fast": {"steps": 2000, "patience": 200, "precision": "auto", "channels_last": True},
}


def preset_names() -> list[str]:
    """The engine's presets (also the Hydra group ``invert``)."""
    return sorted(PRESETS)


def load_preset(name: str, **overrides: Any) -> InvertConfig:
    """The preset ``name`` (``paper``, ``fast``, ``default``), with overrides."""
    if name not in PRESETS:
        raise ValueError(f"unknown invert preset {name!r}; available presets: {preset_names()}")
    return InvertConfig.from_dict({**InvertConfig().to_dict(), **PRESETS[name], **overrides})
