"""invert: a batched optimisation engine over images (representation inversion, controversial stimuli).

Knows tensors and nn.Modules only. See :mod:`invert.engine` for the runner, :mod:`invert.objectives`
for the losses, :mod:`invert.steps` for steppers and projections (shared with the attacks in
``training``), :mod:`invert.params` for parametrisations and :mod:`invert.config` for the presets.
"""
from .config import InvertConfig, load_preset, preset_names
from .engine import Engine, InversionResult, NonFiniteLossError, invert_batch, resolve_engine
from .modules import batch_slices, module_device
from .objectives import (
    ClassControversialLoss,
    ControversialLoss,
    Distance,
    DistanceToReferences,
    InversionLoss,
    LpPrior,
    Objective,
    SumObjective,
    TotalVariation,
    TransformRobust,
    TwoWayControversialLoss,
    check_push_weight,
    check_sharpness,
    compute_features,
)
from .params import Fourier, Pixel, Sigmoid, make_parametrization
from .rng import NOISE_KINDS, hashed_uniform, item_generator, noise_images, seeded_rng, stream_seed
from .steps import (
    Adam,
    L2Step,
    LinfStep,
    clamp01,
    make_stepper,
    per_sample_norm,
    project_l2,
    project_linf,
    random_start_l2,
    random_start_linf,
)
from .validation import check_images, hot_loop

__all__ = [
    "Adam", "ClassControversialLoss", "ControversialLoss", "Distance", "DistanceToReferences", "Engine",
    "Fourier", "InversionLoss", "InversionResult", "InvertConfig", "L2Step", "LinfStep", "LpPrior",
    "NOISE_KINDS", "NonFiniteLossError", "Objective", "Pixel", "Sigmoid", "SumObjective", "TotalVariation", "TransformRobust",
    "TwoWayControversialLoss",
    "check_images", "check_push_weight", "check_sharpness", "clamp01", "compute_features", "hashed_uniform", "hot_loop", "invert_batch", "item_generator",
    "load_preset", "make_parametrization", "make_stepper", "noise_images", "per_sample_norm", "preset_names",
    "project_l2", "project_linf", "random_start_l2", "random_start_linf", "resolve_engine", "batch_slices", "module_device", "seeded_rng",
    "stream_seed",
]
