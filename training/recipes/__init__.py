"""Training recipes (Hydra group ``train``): standard, pgd, trades, mart, fast_at, simclr, adv_simclr.

:func:`build_recipe` turns a ``train`` config node and a zoo classifier into a :class:`Recipe`; the
trainer (``training.trainer``) drives it. Every recipe works with every zoo architecture.
"""
from __future__ import annotations

from typing import Any, Callable

from ..attacks import ThreatModel, config_number, fgsm_threat
from ..augment import SimCLRAugment
from ..config import ConfigError
from ..data import ImageSet
from ..models import Classifier
from .base import Recipe, supervised_augment_from_config
from .fast_at import GUARD_ACTIONS, CollapseGuard, FastATRecipe, held_batch
from .simclr import AdversarialSimCLRRecipe, ProjectionHead, SimCLRRecipe, classifier_head, encoder_of, linear_probe
from .supervised import MartRecipe, PGDRecipe, StandardRecipe, TradesRecipe

RecipeBuilder = Callable[..., Recipe]
# name -> builder(train_cfg, model, train_data, seed) -> Recipe. Add one with @register_recipe("name").
RECIPES: dict[str, RecipeBuilder] = {}
# name -> the conf/train/<file>.yaml holding its keys (a recipe registered in code may reuse another's).
RECIPE_DEFAULTS: dict[str, str] = {}


def register_recipe(name: str, defaults: str | None = None) -> Callable[[RecipeBuilder], RecipeBuilder]:
    """Register ``builder(train_cfg, model, train_data, seed) -> Recipe`` as ``train.name=<name>``.

    ``defaults`` names the recipe config whose keys it reads (``conf/train/<defaults>.yaml``; default: its own
    file ``conf/train/<name>.yaml``): ``python -m training train=standard train.name=<name>`` then runs it.
    """

    def register(builder: RecipeBuilder) -> RecipeBuilder:
        if name in RECIPES and RECIPES[name] is not builder:
            raise ValueError(f"a training recipe named {name!r} is already registered")
        RECIPES[name] = builder
        RECIPE_DEFAULTS[name] = defaults or name
        return builder

    return register


def _node(cfg, key: str) -> Any:
    value = cfg.get(key)
    if value is None:
        raise ConfigError(f"train.{key} is required for recipe {cfg.get('name')!r}")
    return value


def _threat(cfg, **overrides) -> ThreatModel:
    return ThreatModel.from_config(_node(cfg, "attack"), **overrides)


def _common(cfg) -> dict[str, Any]:
    return {"augment": supervised_augment_from_config(cfg.get("augment")), "label_smoothing": float(cfg.get("label_smoothing", 0.0) or 0.0)}


@register_recipe("standard")
def _standard(cfg, model, train_data, seed):
    return StandardRecipe(model, **_common(cfg))


def _fold_bn(cfg) -> bool:
    return bool(cfg.get("attack_fold_bn", True))


@register_recipe("pgd")
def _pgd(cfg, model, train_data, seed):
    return PGDRecipe(model, _threat(cfg), attack_bn=cfg.get("attack_bn", "eval"), fold_bn=_fold_bn(cfg), **_common(cfg))


@register_recipe("trades")
def _trades(cfg, model, train_data, seed):
    return TradesRecipe(model, _threat(cfg, random_start=False), beta=float(cfg.get("beta", 6.0)), fold_bn=_fold_bn(cfg), **_common(cfg))


@register_recipe("mart")
def _mart(cfg, model, train_data, seed):
    return MartRecipe(model, _threat(cfg, random_start=False), beta=float(cfg.get("beta", 6.0)), fold_bn=_fold_bn(cfg), **_common(cfg))


@register_recipe("fast_at")
def _fast_at(cfg, model, train_data, seed):
    given = ThreatModel.from_config(_node(cfg, "attack"), steps=1)  # parses and checks norm, eps, step size
    threat = fgsm_threat(given.norm, given.eps, given.step_size, given.random_start)
    guard_cfg = cfg.get("guard") or {}
    guard, every = None, None
    if guard_cfg.get("enabled", True):
        images, labels = held_batch(train_data.images, train_data.labels, int(guard_cfg.get("batch_size", 256)), seed)
        steps = int(guard_cfg.get("steps", 5))
        step_size = config_number(guard_cfg.get("step_size"), "guard.step_size")  # Wong et al.: 2/255 for 8/255 = eps / 4
        guard_threat = ThreatModel(threat.norm, threat.eps, steps=steps, step_size=step_size or threat.eps / 4)
        guard = CollapseGuard(model, images, labels, guard_threat, max_drop=float(guard_cfg.get("max_drop", 0.2)),
                              action=guard_cfg.get("action", "rollback"), seed=seed)
        every = guard_cfg.get("every_steps")
    return FastATRecipe(model, threat, guard=guard, guard_every_steps=None if every is None else int(every),
                        attack_bn=cfg.get("attack_bn", "train"), **_common(cfg))


PROBE_INT_KEYS = ("epochs", "batch_size", "seed", "feature_batch_size")  # linear_probe's counts; its other settings are floats


def _refuse_supervised_settings(cfg) -> None:
    """SimCLR's config inherits standard.yaml's keys, but its loss has no labels and it draws its views with
    ``train.simclr.*``: a label smoothing or a supervised augmentation would be ignored, so it is refused."""
    name = cfg.get("name")
    smoothing = float(cfg.get("label_smoothing", 0.0) or 0.0)
    if smoothing:
        raise ConfigError(f"train.label_smoothing={smoothing} has no effect on {name}: the contrastive loss has no labels (remove the override)")
    turned_on = [f"train.augment.{key}={value}" for key, value in (cfg.get("augment") or {}).items() if value]
    if turned_on:
        raise ConfigError(f"{', '.join(turned_on)}: train.augment is the supervised recipes' augmentation and {name} would ignore it; "
                          "its two views come from train.simclr.{crop_scale,strength,jitter_p,grayscale_p}")


def _simclr_kwargs(cfg, train_data: ImageSet) -> dict[str, Any]:
    _refuse_supervised_settings(cfg)
    s = cfg.get("simclr") or {}
    augment = SimCLRAugment(
        size=train_data.image_size,
        scale=s.get("crop_scale", (0.08, 1.0)),
        strength=float(s.get("strength", 0.5)),
        jitter_p=float(s.get("jitter_p", 0.8)),
        grayscale_p=float(s.get("grayscale_p", 0.2)),
    )
    probe = dict(cfg.get("probe") or {})
    return {"augment": augment, "temperature": float(s.get("temperature", 0.5)), "projection_dim": int(s.get("projection_dim", 128)),
            "probe": {k: (int(v) if k in PROBE_INT_KEYS else float(v)) for k, v in probe.items()}}


@register_recipe("simclr")
def _simclr(cfg, model, train_data, seed):
    kwargs = _simclr_kwargs(cfg, train_data)
    kwargs["probe"].setdefault("seed", seed)
    return SimCLRRecipe(model, kwargs.pop("augment"), **kwargs)


@register_recipe("adv_simclr")
def _adv_simclr(cfg, model, train_data, seed):
    kwargs = _simclr_kwargs(cfg, train_data)
    kwargs["probe"].setdefault("seed", seed)
    return AdversarialSimCLRRecipe(model, kwargs.pop("augment"), threat=_threat(cfg), attack_bn=cfg.get("attack_bn", "train"), **kwargs)


def build_recipe(train_cfg, model: Classifier, train_data: ImageSet, seed: int = 0) -> Recipe:
    """The recipe named ``train_cfg.name`` for ``model`` (``train_data`` feeds fast AT's held batch and
    SimCLR's image size)."""
    name = train_cfg.get("name")
    if name not in RECIPES:
        raise ConfigError(f"unknown training recipe {name!r}: use one of {sorted(RECIPES)} (train=NAME)")
    return RECIPES[name](train_cfg, model, train_data, seed)


__all__ = [
    "GUARD_ACTIONS",
    "RECIPES",
    "RECIPE_DEFAULTS",
    "register_recipe",
    "AdversarialSimCLRRecipe",
    "CollapseGuard",
    "FastATRecipe",
    "MartRecipe",
    "PGDRecipe",
    "ProjectionHead",
    "Recipe",
    "SimCLRRecipe",
    "StandardRecipe",
    "TradesRecipe",
    "build_recipe",
    "classifier_head",
    "encoder_of",
    "held_batch",
    "linear_probe",
]
