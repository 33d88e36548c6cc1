"""``python -m perceptual reproduce experiment=<preset> scale=<cpu|paper>``: one of Nanda et al.'s results end to end.

A preset (``conf/experiment/<name>.yaml``) names the models a result needs as architectures of the scale
(``conf/scale/<name>.yaml``) crossed with entries of the training catalogue (``trainings`` in
``conf/reproduce.yaml``), plus explicit pairs. The command

1. expands and checks every model's training config before anything trains (a misspelt key costs seconds);
2. trains each with the toolkit's recipes in ``runs_dir/<data>-<model>-<recipe>-<hash of its config>`` (resumed,
   so a model one preset trained is reused by the next: Table 1's ResNet pair is Fig. 4's first two points);
3. measures them all with :func:`perceptual.measure.measure_models` (report in ``<out>/measure``; each model's
   inversions and judgements in ``runs_dir/measurements/``, keyed by its weights folder and the measurement
   settings, so they too are computed once for all presets);
4. writes the result with its statistics (:mod:`perceptual.experiments`): ``<out>/result.md``, ``result.json`` and
   the figures, and prints the table.

``scale=cpu`` runs each preset on this kind of 2-core machine in minutes (narrow architectures, digits or the
CIFAR-10 subset); ``scale=paper`` is the paper's models and budgets, for a GPU or a Slurm sweep
(``-m hydra/launcher=slurm_gpu experiment=table1,fig4``).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

import hydra
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from invert.config import load_preset
from training.config import concise_errors, expand_path_options, flat_items, resolve_device, resolved_path_text
from training.io import atomic_write_json, atomic_write_text
from training.recipes import RECIPES
from training.sweeps import groups_in_template, job_path
from training.trainer import run_identity

from ..cache import cache_key
from ..experiments import RESULTS, Variant, comparison_pairs, experiment_result
from ..measure import ModelSpec, make_panel, measure_models, threat_from_config, validate_inputs
from ..statistics import check_n_boot
from .measure import check_convergence
from .training_runs import train_models, training_config

PAPER_DATA = ("cifar10", "cifar100")  # the recipes train on in-memory sets; ImageNet models come as checkpoints (measure)


def _names(selection, available: dict, what: str, preset: str, sets: dict | None = None) -> list[str]:
    """A list of names, or (a string) one of the scale's named sets of architectures."""
    if isinstance(selection, str):
        if selection not in (sets or {}):
            raise ValueError(f"experiment {preset}: {what}={selection!r} is not a set of this scale; sets: {sorted(sets or {})}")
        selection = sets[selection]
    names = list(selection)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(f"experiment {preset}: unknown {what} {unknown}; available: {sorted(available)}")
    return names


def expand_variants(cfg: DictConfig) -> list[Variant]:
    """The preset's models: its architectures x trainings, then its explicit ``variants``, without repeats."""
    experiment, scale = cfg.experiment, cfg.scale
    architectures = OmegaConf.to_container(scale.architectures, resolve=True)
    trainings = OmegaConf.to_container(cfg.trainings, resolve=True)
    sets = OmegaConf.to_container(scale.architecture_sets, resolve=True)
    pairs = [(a, t) for a in _names(experiment.architectures, architectures, "architectures", experiment.name, sets)
             for t in _names(experiment.trainings, trainings, "trainings", experiment.name)]
    for entry in experiment.get("variants") or []:
        if set(entry) != {"architecture", "training"}:
            raise ValueError(f"experiment {experiment.name}: a variant is {{architecture, training}}, got {dict(entry)}")
        _names([entry.architecture], architectures, "architectures", experiment.name)
        _names([entry.training], trainings, "trainings", experiment.name)
        pairs.append((entry.architecture, entry.training))
    variants = []
    for arch, training in dict.fromkeys(pairs):
        spec, entry = architectures[arch], trainings[training]
        unknown = set(entry) - {"recipe", "adversarial", "overrides"}
        if unknown:
            raise ValueError(f"trainings.{training}: unknown keys {sorted(unknown)} (use recipe, adversarial, overrides)")
        variants.append(Variant(arch, training, spec["model"], dict(spec.get("kwargs") or {}), entry["recipe"], bool(entry.get("adversarial")),
                                dict(entry.get("overrides") or {})))
    if not variants:
        raise ValueError(f"experiment {experiment.name} names no model")
    return variants


def train_overrides(variant: Variant, scale: DictConfig) -> dict:
    """The scale's schedule, then the recipe's own schedule at this scale, the scale's attack for an adversarial
    recipe, then the catalogue entry's overrides (which win); as dotted keys of ``conf/train/<recipe>.yaml``."""
    recipe_schedules = OmegaConf.to_container(scale.recipe_schedule, resolve=True) or {}
    misspelt = sorted(set(recipe_schedules) - set(RECIPES))
    if misspelt:  # its schedule would reach no model: the recipe's models would train on the scale's schedule unnoticed
        raise ValueError(f"scale.recipe_schedule names no recipe: {misspelt}; the recipes are {sorted(RECIPES)}")
    overrides = flat_items(scale.schedule)
    overrides.update(flat_items(recipe_schedules.get(variant.recipe) or {}))
    if variant.adversarial:
        overrides.update(flat_items(scale.attack, "attack."))
    overrides.update(flat_items(variant.overrides))
    return overrides


def _digest(*parts) -> str:
    """Eight hex digits of :func:`perceptual.cache.cache_key`: a folder-name suffix."""
    return cache_key(*parts)[:8]


def _trained_on(folder: Path) -> str | None:
    """The resolved data root a run folder's saved config names (None where it saved none)."""
    saved = folder / "config.yaml"
    if not saved.is_file():
        return None
    try:
        return resolved_path_text(OmegaConf.select(OmegaConf.load(saved), "data.root", default=None))
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException):  # an unreadable config is no evidence of the data
        return None


def run_dir(cfg: DictConfig, variant: Variant, overrides: dict, config: DictConfig) -> Path:
    """One folder per trained model (:func:`training.trainer.run_identity` of its resolved ``config``): it is trained
    once and reused by every preset that needs it, however the preset spells its settings (at scale=paper, whose
    standard recipe augments, ``standard`` and ``standard_aug`` are one model). A folder named by the former digest of
    the ``overrides`` holds the same model and is used where it exists.

    The identity leaves the data root out (a moved data folder resumes a run), but cifar-10-mini and CIFAR-10 share the
    name cifar10: a data set read from a folder adds its resolved root to the folder's digest, and a folder named without
    it (made before the root counted) is reused only where its saved config names the same root."""
    prefix = Path(cfg.runs_dir) / f"{cfg.data.name}-{variant.model}-{variant.recipe}"
    identity = run_identity(config)
    folder = prefix.with_name(f"{prefix.name}-{_digest(identity)}")
    legacy = prefix.with_name(f"{prefix.name}-{_digest(variant.model, variant.kwargs, variant.recipe, overrides, cfg.seed)}")
    root = resolved_path_text(OmegaConf.select(config, "data.root", default=None))
    if not root:  # an embedded data set: the identity says it all
        return legacy if legacy.is_dir() and not folder.is_dir() else folder
    rooted = prefix.with_name(f"{prefix.name}-{_digest(identity, root)}")
    if rooted.is_dir():
        return rooted
    return next((old for old in (folder, legacy) if old.is_dir() and _trained_on(old) == root), rooted)


def training_configs(cfg: DictConfig, variants: Sequence[Variant]) -> dict[str, DictConfig]:
    """label -> the checked ``python -m training`` config of each variant, in its :func:`run_dir`."""
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
    configs = {}
    for v in variants:
        overrides = train_overrides(v, cfg.scale)
        config = training_config(model=v.model, model_kwargs=v.kwargs, data=data_cfg, recipe=v.recipe, run_dir="pending",
                                 seed=cfg.seed, device=cfg.device, progress=cfg.progress, train_overrides=overrides)
        config.run_dir = str(run_dir(cfg, v, overrides, config))
        configs[v.label] = config
    return configs


# The keys of scale.measure reproduce passes on (conf/scale/*.yaml); another key is refused, not dropped.
MEASURE_KEYS = ("n_targets", "seed_types", "tasks", "invert", "threat", "accuracy_limit", "noise_kind", "attention_rate", "judge_8bit", "chunk_size")
# Those that make the stimulus sets: the measurement folder holds one set per kind, so it is keyed by them alone. The
# observers, the threat and the tasks are not: the judgements and accuracies are cached in it under their own keys.
SET_KEYS = ("n_targets", "seed_types", "invert", "noise_kind", "chunk_size")


def measurement_dir(cfg: DictConfig, weights_dir: Path, measure_cfg: dict, label: str) -> Path:
    """One folder per (model, label, stimulus-set settings): a model's inversions and judgements are reused across
    presets, and by a rerun with other observers or another threat. The label is part of the key because a stimulus
    set records the name it was made under (one model may be ``cnn-standard`` in one preset and
    ``cnn-standard_noaug`` in another)."""
    settings = {k: measure_cfg[k] for k in SET_KEYS if measure_cfg.get(k) is not None}
    return Path(cfg.runs_dir) / "measurements" / f"{label}-{weights_dir.name}-{_digest(settings, cfg.seed)}"


def engine_config(scale: DictConfig):
    settings = dict(OmegaConf.to_container(scale.measure.invert, resolve=True))
    return load_preset(settings.pop("preset", "fast"), **settings)


def check_config(cfg: DictConfig) -> None:
    if cfg.experiment.result not in RESULTS:
        raise ValueError(f"experiment {cfg.experiment.name}: result must be one of {RESULTS}, got {cfg.experiment.result!r}")
    if cfg.scale.name == "paper" and cfg.data.name not in PAPER_DATA:
        raise ValueError(f"scale=paper trains on the paper's data sets {PAPER_DATA}: add data=cifar10 data.root=PATH (got data={cfg.data.name}; "
                         "ImageNet models are measured from checkpoints with `python -m perceptual measure`)")
    check_n_boot(cfg.n_boot)
    unknown = sorted(set(cfg.scale.measure) - set(MEASURE_KEYS))
    if unknown:  # were dropped without a word, while they changed the measurement folder's name
        raise ValueError(f"scale.measure key(s) {unknown} are not used by reproduce: use {list(MEASURE_KEYS)}")
    # what the result needs from the measurement, before any model trains (at scale=paper: hours)
    if cfg.experiment.result == "scatter" and cfg.scale.measure.get("threat") is None:
        raise ValueError(f"experiment {cfg.experiment.name} plots alignment against robust accuracy: scale.measure.threat must not be null")
    if cfg.experiment.result == "gaussian" and not cfg.experiment.get("gaussian_targets"):
        raise ValueError(f"experiment {cfg.experiment.name} compares test-image with Gaussian targets: it needs experiment.gaussian_targets=true")


def run(cfg: DictConfig) -> dict:
    started = time.perf_counter()
    check_config(cfg)  # before the variants: scale=paper on the digits is refused first
    out, scale, experiment = Path(cfg.out), cfg.scale, cfg.experiment
    variants = expand_variants(cfg)
    comparisons = OmegaConf.to_container(experiment.comparisons) if experiment.get("comparisons") is not None else None
    comparison_pairs(variants, comparisons)  # a misnamed comparison is refused before any model trains
    measure_cfg = OmegaConf.to_container(scale.measure, resolve=True)
    tasks = list(measure_cfg["tasks"])
    engine = engine_config(scale)
    specs = [ModelSpec(v.model, None, v.label, kwargs=v.kwargs) for v in variants]
    options = {k: measure_cfg[k] for k in ("noise_kind", "attention_rate", "judge_8bit", "chunk_size") if measure_cfg.get(k) is not None}
    validate_inputs(specs, n_targets=measure_cfg["n_targets"], seed_types=measure_cfg["seed_types"], tasks=tasks, engine=engine, controversial=None,
                    accuracy_limit=measure_cfg.get("accuracy_limit"), convergence_threshold=cfg.convergence_threshold, seed=cfg.seed,
                    **{k: v for k, v in options.items() if k != "judge_8bit"})
    threat = threat_from_config(measure_cfg.get("threat"))
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
    configs = training_configs(cfg, variants)  # every config checked before the first model trains
    model_dirs = {label: measurement_dir(cfg, Path(config.run_dir), measure_cfg, label) for label, config in configs.items()}
    panel = make_panel(cfg.observers, cfg.observer_net, device=resolve_device(cfg.device))  # where measure_models will run
    print(f"{experiment.title}: {len(variants)} models at scale={scale.name} on {cfg.data.name}")
    weights = train_models(configs)
    specs = [ModelSpec(v.model, str(weights[v.label]), v.label, kwargs=v.kwargs) for v in variants]
    container = OmegaConf.to_container(cfg, resolve=True)
    data = measure_models(specs, data_cfg, out / "measure", engine=engine, n_targets=measure_cfg["n_targets"], seed_types=measure_cfg["seed_types"],
                          seed=cfg.seed, panel=panel, tasks=tasks, threat=threat, accuracy_limit=measure_cfg.get("accuracy_limit"),
                          device=cfg.device, config=container, convergence_threshold=float(cfg.convergence_threshold),
                          gaussian_targets=bool(experiment.gaussian_targets), model_dirs=model_dirs, **options)
    result = experiment_result(experiment.result, data, variants, tasks, experiment.title, out, n_boot=int(cfg.n_boot), seed=int(cfg.seed),
                               comparisons=comparisons)
    seconds = round(time.perf_counter() - started, 1)
    command = f"python -m perceptual reproduce experiment={experiment.name} scale={scale.name} data={cfg.data.name}" + (
        f" data.root={cfg.data.root}" if cfg.data.get("root") else "")
    markdown = (f"# {experiment.title}\n\n{result['markdown']}\n"
                + "".join(f"![{name}]({name})\n" for name in result["figures"])
                + f"\nMeasured by `{command}` in {seconds:.0f} s; the full measurement report is `measure/report.md`.\n")
    atomic_write_text(out / "result.md", markdown)
    atomic_write_json(out / "result.json", {"experiment": experiment.name, "scale": scale.name, "data": cfg.data.name, "seconds": seconds,
                                            "command": command, **{k: v for k, v in result.items() if k != "markdown"},
                                            "models": {label: {k: m.get(k) for k in ("clean_accuracy", "robust_accuracy", *tasks, "converged")}
                                                       for label, m in data["models"].items()},
                                            "config": container})
    print()
    print(result["markdown"])
    print(f"result: {(out / 'result.md').resolve()}  ({seconds:.0f} s)")
    check_convergence(data)
    return {"result": result, "data": data, "out": str(out)}


def groups_in_out(cfg: DictConfig) -> tuple[str, ...]:
    """The config groups the ``out`` template names (``reports/experiments/${experiment.name}-...``):
    :func:`training.sweeps.groups_in_template`."""
    return groups_in_template(cfg, "out", ("experiment", "scale", "data"))


@hydra.main(config_path="pkg://conf", config_name="reproduce", version_base=None)
@concise_errors
def main(cfg: DictConfig) -> None:
    groups = groups_in_out(cfg)  # read from the template, which expanding the path replaces by its value
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    cfg.out = str(job_path(cfg.out, groups=groups))
    run(cfg)


if __name__ == "__main__":
    main()
