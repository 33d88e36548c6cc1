"""``python -m perceptual measure``: how well do models' invariances align with a simulated observer?

For each model (Nanda et al., AAAI 2023, Table 1): build or reuse its inversion set (targets from the
test split × seed types through the engine), compute clean and robust accuracy (PGD), let every
observer of the panel answer 2AFC, clustering and hard-clustering trials built from the set, and
write a report directory:

    report.json        every number (per observer, per seed type, per target; panel mean ± std)
    report.md / .html  the paper's Table 1 (observer 2AFC, clustering, hard clustering, accuracies)
    grid.png           target / seed / result for each model
    scatter_*.png      observer accuracy against robust accuracy (paper Figure 4)
    models/<label>/    the model's stimulus set, accuracy.json and judged trials (cached: a rerun
                       reuses everything whose inputs did not change, so interrupted runs resume);
                       a factory model's folder is models/<label>-<its identity>, since a factory's
                       settings (a quantisation level) need not show in the weights a set is keyed by

One batch per job: by default (``chunk_size=None``) each stimulus set is one engine call, so the engine gets all
of a model's work at once (every target × seed type; the controversial set's both directions and all restarts)
and cuts it into micro-batches from the GPU's measured memory. An int ``chunk_size`` cuts the sets into resumable
parts of that many items instead, for long CPU runs that should survive an interruption mid-set.

Optionally, controversial stimuli for a model pair (both directions) scored by the mean pairwise
perceptual distance among the results of each origin (paper Table 2).

Judgements use the 8-bit images (what people see) unless ``judge_8bit=false``. Hard triplets are
chosen with the panel's first observer, so every observer answers the same trials.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

import stimuli
from invert import NOISE_KINDS, Engine, check_push_weight, resolve_engine, stream_seed
from stimuli.survey import LABEL_RULE, is_plain_label
from training import build_model
from training.attacks import ThreatModel
from training.config import as_list, check_whole_number, dataset_from_config, expand_path, resolve_device, resolved_path_text
from training.data import IN_MEMORY, NUM_CLASSES, ImageSet, folder_to_imageset
from training.evaluate import clean_accuracy, robust_accuracy
from training.io import atomic_write_json, atomic_write_text
from training.models.defences import build_from_factory

from . import report
from .cache import cache_key, cached_json, module_identity
from .class_controversial import class_controversial_score, class_controversial_sentence, class_exemplars
from .convergence import (
    DEFAULT_THRESHOLD,
    MIN_CONVERGED_FRACTION,
    check_threshold,
    convergence_figure,
    convergence_sentence,
    convergence_summary,
    is_converged,
    result_distances,
)
from .decisions import observer_slug
from .observers import Panel, default_panel, make_observer, offline_variants, quantize_8bit
from .statistics import SIGN_FLIP_MIN_N, measurement_statistics, percentile_interval, sign_flip_p_value
from .tasks import controversial_spread, judge_2afc, judge_clustering, panel_summary, summarize

log = logging.getLogger(__name__)
TASKS = stimuli.TASKS  # the trial kinds of stimuli.trials
# The pipeline's sets are caches of a measurement: one made with other settings (or by older code) is moved aside
# to <set>.replaced-<k> and the set is made afresh, so a rerun after an update measures instead of stopping.
SETS_OUT_OF_DATE = "archive"
FOLDER_ACCURACY_IMAGES = 1000  # accuracy subset of a folder data set when accuracy_limit is not set


@dataclass
class ModelSpec:
    """A model to measure: zoo ``name`` (+ ``checkpoint``) or a ``factory`` (``module:function`` from the
    user's own code, called with ``kwargs``; + ``checkpoint``), and the label it gets in the report."""

    name: str | None = None
    checkpoint: str | None = None
    label: str | None = None
    layer: str | None = None
    fake_relu: bool | None = None
    trust_pickle: bool = False
    pretrained: bool = False
    kwargs: dict = field(default_factory=dict)
    factory: str | None = None
    module: torch.nn.Module | None = field(default=None, repr=False, compare=False)  # already built (e.g. the audited defence)
    KEYS: ClassVar[tuple[str, ...]] = ("name", "factory", "checkpoint", "label", "layer", "fake_relu", "trust_pickle", "pretrained", "kwargs")

    def __post_init__(self) -> None:
        if self.layer is not None and not isinstance(self.layer, str):  # layer=4 (an nn.Sequential's index) reads as a number
            self.layer = str(self.layer)
        if bool(self.name) == bool(self.factory):
            raise ValueError(f"a model needs exactly one of name (a zoo model) or factory (module:function), got name={self.name!r}, "
                             f"factory={self.factory!r}")
        if self.checkpoint:  # '$RUNS/x.safetensors' inside quotes and YAML, as data.root and lpips_weights
            self.checkpoint = str(expand_path(self.checkpoint))
        if not self.label:
            self.label = Path(self.checkpoint).stem if self.checkpoint else (self.name or str(self.factory).rpartition(":")[2])
        if not is_plain_label(self.label):
            raise ValueError(f"model label {self.label!r} must be a plain name: it becomes a folder, a cell of the reports' tables and a "
                             f"figure label, so {LABEL_RULE} (set label=...)")

    def build(self, dataset: str) -> torch.nn.Module:
        """The classifier: ``module`` when given, else from the zoo for ``dataset`` or the factory (which knows its own data set)."""
        if self.module is not None:
            return self.module
        if self.factory:
            return build_from_factory(self.factory, self.kwargs, checkpoint=self.checkpoint, trust_pickle=self.trust_pickle)
        return build_model(self.name, dataset, checkpoint=self.checkpoint, trust_pickle=self.trust_pickle, pretrained=self.pretrained, **self.kwargs)

    @staticmethod
    def check_unique(specs: Sequence["ModelSpec"]) -> None:
        """Labels name report rows and folders: two models with one label would overwrite each other."""
        labels = [s.label for s in specs]
        if len(set(labels)) != len(labels):
            raise ValueError(f"model labels must be unique, got {labels}: give each entry a label")

    @classmethod
    def parse(cls, entry: Any) -> "ModelSpec":
        if isinstance(entry, str):
            return cls(name=entry)
        values = OmegaConf.to_container(entry, resolve=True) if isinstance(entry, DictConfig) else dict(entry)
        unknown = set(values) - set(cls.KEYS)
        if unknown or not (values.get("name") or values.get("factory")):
            raise ValueError(
                "a model entry needs 'name' (or 'factory') and may have checkpoint, label, layer, fake_relu, trust_pickle, pretrained, kwargs; "
                f"got {sorted(values)}"
            )
        values["kwargs"] = dict(values.get("kwargs") or {})
        return cls(**values)


def make_panel(observers: str | Sequence[str], net: str = "alex", weights_path: str | None = None, device=None) -> Panel:
    """``auto`` = :func:`default_panel` (LPIPS when its weights are there, else the labelled offline
    variants, plus SSIM, MS-SSIM and pixel L2); or a list of observer names."""
    if observers in ("auto", None):
        return default_panel(net, weights_path, device=device)
    return Panel([make_observer(name, net, weights_path, device=device) for name in as_list(observers, "observers")])


def model_accuracy(model, test, threat: ThreatModel | None, out: Path, key: str, limit: int | None, restarts: int = 1) -> dict:
    """Clean and robust accuracy, cached in ``out/accuracy.json`` under ``key``."""
    path = out / "accuracy.json"
    cached = cached_json(path, key)
    if cached is not None:
        return cached
    if isinstance(test, ImageSet):
        data = test.subset(torch.arange(min(limit, len(test)))) if limit else test
    else:  # a folder data set (ImageNet): a fixed random subset, read once
        picks = torch.randperm(len(test), generator=torch.Generator().manual_seed(0))[: limit or FOLDER_ACCURACY_IMAGES]
        data = folder_to_imageset(test, picks.tolist())
    result = {"key": key, "clean_accuracy": clean_accuracy(model, data), "n": len(data)}
    if threat is not None:
        result["robust_accuracy"] = robust_accuracy(model, data, threat, restarts=restarts)
        result["threat"] = {"norm": threat.norm, "eps": threat.eps, "steps": threat.steps, "restarts": restarts}
    atomic_write_json(path, result)
    return result


def observe_set(
    stimulus_set: stimuli.StimulusSet,
    panel: Panel,
    out: Path,
    *,
    tasks: Sequence[str] = TASKS,
    seed: int = 0,
    attention_rate: float = 0.0,
    judge_8bit: bool = True,
    interval: str = "bootstrap",
    only_results: Sequence[str] | None = None,
) -> dict:
    """Every observer of ``panel`` answers every task on an inversion set; cached per (observer, task).

    With ``only_results`` (result ids, e.g. the converged ones) each entry also holds ``"restricted"``: the same
    summary over the trials whose query is one of those results (a clustering row is one result)."""
    images = quantize_8bit(stimulus_set.images) if judge_8bit else stimulus_set.images
    pixels = stimuli.sets.tensor_sha256(images)
    id_to_row = {image_id: i for i, image_id in enumerate(stimulus_set.manifest["id"])}
    hard_distance = None
    results: dict[str, dict] = {}
    fingerprints = {observer.name: observer.fingerprint() for observer in panel}  # name, settings and weights
    for task in tasks:
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}: use one of {TASKS}")
        if task == "clustering_hard" and hard_distance is None:
            first = panel.observers[0]
            hard_distance = lambda x, o=first: o.matrix(quantize_8bit(x) if judge_8bit else x)  # noqa: E731
        # the pixels judged, not only the settings that made them: a set made again (deleted, or on other hardware) keeps its fingerprint
        trial_key = cache_key(stimulus_set.fingerprint, pixels, task, seed, attention_rate,
                              fingerprints[panel.observers[0].name] if task == "clustering_hard" else None,
                              *(["checks-v2"] if attention_rate else []),  # v2: a rate that rounds to no check gives one
                              *(["distinct-triplets"] if task == "clustering_hard" else []))  # no hard triplet twice while another is free
        trials = stimuli.set_trials(stimulus_set, task, seed=seed, attention_rate=attention_rate, distance=hard_distance or "pixel_l2")
        judge = judge_2afc if task == "2afc" else judge_clustering
        for observer in panel:
            key = cache_key(trial_key, fingerprints[observer.name], judge_8bit, interval, "summary-v3")  # v3: per-target trial counts
            slug = observer_slug(observer.name)
            path, csv_path = (out / "observers" / f"{slug}-{task}{suffix}" for suffix in (".json", ".csv"))
            cached = cached_json(path, key)
            if cached is not None and only_results is not None and cached.get("csv_sha256") != _file_sha256(csv_path):
                cached = None  # the answers are another run's (one interrupted between the two writes): judged again
            if cached is None:
                judged = judge(trials, images, id_to_row, observer)
                text = judged.to_csv(index=False)
                atomic_write_text(csv_path, text)
                cached = {"key": key, "observer": observer.name, "task": task, "csv_sha256": hashlib.sha256(text.encode()).hexdigest(),
                          **summarize(judged, interval=interval, seed=seed)}
                atomic_write_json(path, cached)
            if only_results is not None:
                judged = pd.read_csv(csv_path)
                kept = judged[judged["query_id"].isin(set(only_results))]
                cached = {**cached, "restricted": summarize(kept, interval=interval, seed=seed) if len(kept) else None}
            results.setdefault(task, {})[observer.name] = cached
    return results


def _prepare_model(spec: ModelSpec, dataset: str, probe: torch.Tensor, n_classes: int, device: torch.device, out: Path,
                   model_dirs: Mapping[str, str | Path] | None) -> tuple[torch.nn.Module, stimuli.ModelRef, dict, Path]:
    """(classifier, its ModelRef, the settings its sets are keyed by, its folder), after checking that it maps ``probe``
    (two test images) to one logit per class (:func:`check_model_serves`) and that its representation runs on them."""
    classifier = spec.build(dataset).to(device)
    check_model_serves(spec.label, classifier, probe, dataset, n_classes)
    default_dir = out / "models" / spec.label
    settings = dict(spec.kwargs)  # a zoo model's kwargs (e.g. a k-WTA ratio) change what it computes, not its weights
    if spec.factory or spec.module is not None:  # nor need a factory's settings, or a built module's, show in its weights
        identity = module_identity(classifier, {"factory": spec.factory, "kwargs": dict(spec.kwargs), "checkpoint": spec.checkpoint})
        default_dir = out / "models" / f"{spec.label}-{identity[:10]}"
        settings = {"identity": identity}
    model_dir = Path((model_dirs or {}).get(spec.label) or default_dir)
    try:
        ref = stimuli.ModelRef.from_classifier(classifier, name=spec.label, checkpoint=spec.checkpoint, layer=spec.layer, fake_relu=spec.fake_relu,
                                               settings=settings)
        with torch.no_grad():
            ref.representation(probe)
    except Exception as err:  # a user's model that cannot be traced or cut at the layer asked for: named with the model
        raise ValueError(f"model {spec.label!r}: its representation{f' at layer {spec.layer!r}' if spec.layer else ''} does not run: "
                         f"{type(err).__name__}: {err}") from err
    return classifier, ref, settings, model_dir


def check_model_serves(label: str, model: torch.nn.Module, x: torch.Tensor, dataset: str, n_classes: int) -> None:
    """Refuse, naming ``label``, a model that fails on the data's images ``x`` or does not return one logit per class:
    exactly the number of classes of an in-memory data set (:data:`training.data.NUM_CLASSES`; the top of 100 outputs
    on 10-class digits was measured as its accuracy), at least the ``n_classes`` a folder data set's subfolders hold."""
    try:
        with torch.no_grad():
            logits = model(x)
    except Exception as err:
        raise ValueError(f"model {label!r} fails on the {dataset} images, of shape {tuple(x.shape[1:])}: {type(err).__name__}: {err}") from err
    expected = NUM_CLASSES.get(dataset) if dataset in IN_MEMORY else None  # a folder's classes are its subfolders
    outputs = logits.shape[-1] if isinstance(logits, torch.Tensor) and logits.ndim == 2 else None
    if outputs is None:
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"model {label!r} must map (N, C, H, W) images to (N, classes) logits, got {got}")
    if expected is not None and outputs != expected:
        raise ValueError(f"model {label!r} has {outputs} outputs but {dataset} has {expected} classes: give a model trained on {dataset}")
    if expected is None and outputs < n_classes:
        raise ValueError(f"model {label!r} has {outputs} outputs but the data has {n_classes} classes: give a model with one output per class")


def _file_sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _panel_scores(observed: Mapping[str, Mapping[str, dict]], restricted: bool = False) -> dict:
    def accuracy(result: Mapping) -> float:
        summary = result.get("restricted") if restricted else result
        return summary["overall"]["accuracy"] if summary else math.nan

    return {task: panel_summary({o: accuracy(r) for o, r in per_observer.items()}) for task, per_observer in observed.items()}


def panel_scores_by_seed_type(observed: Mapping[str, Mapping[str, dict]]) -> dict:
    """``{seed type: {task: panel mean ± std}}`` from each observer's per-seed-type accuracy (:func:`summarize`'s
    ``by_seed_type``). Nanda et al.'s Table 1 inverts from noise seeds only: its headline is this table's noise row,
    where the main table pools every seed type measured."""
    seed_types = sorted({s for per_observer in observed.values() for r in per_observer.values() for s in r.get("by_seed_type", {})})
    return {s: {task: panel_summary({o: r.get("by_seed_type", {}).get(s, {}).get("accuracy", math.nan) for o, r in per_observer.items()})
                for task, per_observer in observed.items()} for s in seed_types}


def measure_models(
    specs: Sequence[ModelSpec],
    data_cfg: Mapping,
    out: str | Path,
    *,
    engine: Any = "fast",
    n_targets: int = 100,
    seed_types: Sequence[str] = ("noise", "train"),
    noise_kind: str = "uniform",
    seed: int = 0,
    panel: Panel | None = None,
    tasks: Sequence[str] = TASKS,
    attention_rate: float = 0.0,
    judge_8bit: bool = True,
    threat: ThreatModel | None = None,
    accuracy_limit: int | None = None,
    controversial: Mapping | None = None,
    device: str | torch.device | None = "auto",
    config: Mapping | None = None,
    convergence_threshold: float = DEFAULT_THRESHOLD,
    converged_only: bool = False,
    gaussian_targets: Sequence[Mapping] | bool | None = None,
    model_dirs: Mapping[str, str | Path] | None = None,
    chunk_size: int | None = None,
) -> dict:
    """The measurement pipeline in Python (see the module docstring); returns the report dict.

    Every model's inversions are checked for convergence (:mod:`perceptual.convergence`: the fraction of items
    whose normalised distance reached ``convergence_threshold``); the report shows it beside the alignment
    numbers and marks models below half. ``converged_only`` adds the alignment over converged items only, beside
    the all-items numbers (``data["models"][label]["converged_only"]``). ``gaussian_targets`` (True for the
    authors' two Gaussians, or a list of ``{name, mean, std}``) also inverts out-of-distribution noise targets of
    the test images' shape and reports their scores beside the in-distribution ones (the paper's Table 3; sets in
    ``models/<label>/set-gaussian``, scores in ``data["models"][label]["gaussian"]``). ``model_dirs`` (label ->
    folder) puts a model's sets and caches elsewhere than ``out/models/<label>``, e.g. in a folder several reports
    share (``reproduce`` measures a model once for every preset that needs it). ``noise_kind`` is the noise seeds'
    distribution (:data:`invert.NOISE_KINDS`; ``super`` and ``light`` are the authors' seeds). ``chunk_size``: items
    per engine call and resumable part of every set (None: a whole set per call; see the module docstring). ``config``
    (the command's config) goes into every set's manifest and into report.json."""
    out = Path(out)
    device = resolve_device(device)
    engine = validate_inputs(specs, n_targets=n_targets, seed_types=seed_types, tasks=tasks, engine=engine, controversial=controversial,
                             noise_kind=noise_kind, chunk_size=chunk_size, accuracy_limit=accuracy_limit,
                             convergence_threshold=convergence_threshold, attention_rate=attention_rate, gaussian_targets=gaussian_targets,
                             seed=seed)
    dataset = data_cfg["name"]
    test = dataset_from_config(data_cfg, "test")
    if controversial:  # what the test split must hold for the controversial score, before any model is inverted
        check_controversial_data(controversial, test)
    train = dataset_from_config(data_cfg, "train") if "train" in seed_types else None
    panel = panel or make_panel("auto", device=device)
    targets = stimuli.select_targets(test, n=n_targets, seed=seed)
    started = time.perf_counter()
    results: dict[str, dict] = {}
    # Every model is built and run on the data's images before the first is inverted: a model that cannot serve (another
    # image size, another number of classes, a layer its representation lacks) is named in seconds, not after the others.
    probe = (test if isinstance(test, ImageSet) else folder_to_imageset(test, range(min(2, len(test))))).float_images(slice(0, 2), device=device)
    prepared = {spec.label: _prepare_model(spec, dataset, probe, len(test.classes), device, out, model_dirs) for spec in specs}
    classifiers: dict[str, stimuli.ModelRef] = {label: ref for label, (_, ref, _, _) in prepared.items()}
    for spec in tqdm(specs, desc="models", unit="model"):
        classifier, ref, settings, model_dir = prepared[spec.label]
        stimulus_set = stimuli.make_inversion_set(
            model_dir / "set", ref, targets, seed_types=seed_types, noise_kind=noise_kind, train_set=train, seed=seed, engine=engine,
            chunk_size=chunk_size, device=device, config=config, overwrite=SETS_OUT_OF_DATE,
        )
        accuracy_key = accuracy_cache_key(ref.provenance()["weights_sha256"], threat, accuracy_limit, data_cfg, settings=ref.settings)
        accuracy = model_accuracy(classifier, test, threat, model_dir, accuracy_key, accuracy_limit)
        convergence = convergence_summary(stimulus_set, convergence_threshold)
        observed = observe_set(stimulus_set, panel, model_dir, tasks=tasks, seed=seed, attention_rate=attention_rate, judge_8bit=judge_8bit,
                               only_results=convergence["converged_ids"] if converged_only else None)
        results[spec.label] = {
            "model": {"name": spec.name, **({"factory": spec.factory} if spec.factory else {}), "checkpoint": _absolute(spec.checkpoint), "layer": ref.layer,
                      "fake_relu": getattr(ref.representation, "fake_relu", None)},
            "set": str((model_dir / "set").resolve()),  # absolute: humans= and reports read it from any folder
            "set_fingerprint": stimulus_set.fingerprint,
            "median_final_distance": convergence["best_median"],
            "clean_accuracy": accuracy["clean_accuracy"],
            "robust_accuracy": accuracy.get("robust_accuracy"),
            **_panel_scores(observed),
            "by_seed_type": panel_scores_by_seed_type(observed),
            "convergence": convergence,
            "converged": is_converged(convergence),
            "per_observer": observed,
        }
        if converged_only:
            results[spec.label]["converged_only"] = _panel_scores(observed, restricted=True)
        if gaussian_targets:
            gaussians = stimuli.DEFAULT_GAUSSIANS if gaussian_targets is True else list(gaussian_targets)
            ood = stimuli.gaussian_targets(n_targets, tuple(targets.images.shape[1:]), gaussians, seed=seed)
            ood_set = stimuli.make_inversion_set(model_dir / "set-gaussian", ref, ood, seed_types=seed_types, noise_kind=noise_kind, train_set=train, seed=seed,
                                                 engine=engine, chunk_size=chunk_size, device=device, config=config, overwrite=SETS_OUT_OF_DATE)
            ood_observed = observe_set(ood_set, panel, model_dir / "gaussian", tasks=tasks, seed=seed, attention_rate=attention_rate,
                                       judge_8bit=judge_8bit)
            results[spec.label]["gaussian"] = {**_panel_scores(ood_observed), "set": str((model_dir / "set-gaussian").resolve()),
                                               "gaussians": [dict(g) for g in gaussians],
                                               "convergence": convergence_summary(ood_set, convergence_threshold), "per_observer": ood_observed}
    report_data = {
        "data": dataset,
        "observers": panel.names,
        "observer_variants": {o.name: getattr(o, "variant", "weight-free") for o in panel},
        "n_targets": n_targets,
        "seed_types": list(seed_types),
        "noise_kind": noise_kind,
        "threat": vars(threat) if threat else None,
        "judged_on": "8-bit images" if judge_8bit else "float images",
        "convergence_threshold": float(convergence_threshold),
        "converged_only": bool(converged_only),
        "not_converged": [label for label, r in results.items() if not r["converged"]],
        "models": results,
    }
    if config is not None:  # the command's whole config (engine, training schedule, ...), to rerun or compare reports
        report_data["config"] = dict(config)
    _keep_human_columns(report_data, out / "report.json")
    report_data["statistics"] = measurement_statistics(results, tasks, seed=seed)
    if controversial:
        report_data["controversial"] = measure_controversial(classifiers, test, panel, out, controversial, engine=engine, seed=seed, device=device,
                                                             judge_8bit=judge_8bit, config=config, alignment=results, chunk_size=chunk_size)
    report_data["seconds"] = round(time.perf_counter() - started, 1)
    write_report(report_data, out)
    return report_data


CONTROVERSIAL_KEYS = ("model_a", "model_b", "lambda_", "n_origins", "restarts", "steps", "objective", "exemplars_per_class", "k")
MIN_TARGETS = {"2afc": 1, "clustering": 3, "clustering_hard": 3}  # a clustering trial shows three targets


def accuracy_cache_key(weights_sha256: str, threat: ThreatModel | None, accuracy_limit: int | None, data_cfg: Mapping,
                       settings: Mapping | None = None) -> str:
    """What a model's cached accuracies are keyed by: its weights and the settings its weights do not show
    (:attr:`stimuli.ModelRef.settings`), the threat, the image limit and the data config with its root resolved
    (cifar-10-mini and CIFAR-10 share the name cifar10; ``~/data`` and its expansion are one root)."""
    root = data_cfg.get("root")
    data = {**dict(data_cfg), "root": resolved_path_text(root)}
    # Without settings the key is the one accuracies were cached under before settings were recorded.
    return cache_key(weights_sha256, threat and vars(threat), accuracy_limit, data, *([dict(settings)] if settings else []))


def _keep_human_columns(report_data: dict, previous: Path) -> None:
    """A rerun rewrites the report: the Human columns a ``humans`` import added to the previous one stay (for the
    models still measured), with the package they came from, unless the model's set was made anew: people answered
    about other stimuli than the observers now did (the import records each set's fingerprint)."""
    try:
        old = json.loads(previous.read_text()) if previous.is_file() else {}
    except ValueError:
        return
    if "humans" not in old:
        return
    seen = old["humans"].get("sets") or {}
    for label, result in report_data["models"].items():
        answers = (old.get("models") or {}).get(label, {}).get("humans")
        if answers and seen.get(label) not in (None, result.get("set_fingerprint")):
            log.warning("model %s: its stimulus set was made anew, so the human answers of package %s (about the old set) are left out of "
                        "the report; survey the new set and import the answers again", label, old["humans"].get("package"))
        elif answers:
            result["humans"] = answers
    report_data["humans"] = old["humans"]


def validate_inputs(specs: Sequence[ModelSpec], *, n_targets: int, seed_types: Sequence[str], tasks: Sequence[str], engine: Any,
                    controversial: Mapping | None, noise_kind: str = "uniform", chunk_size: int | None = None,
                    accuracy_limit: int | None = None, convergence_threshold: float = DEFAULT_THRESHOLD, attention_rate: float = 0.0,
                    gaussian_targets: Sequence[Mapping] | bool | None = None, seed: int = 0) -> Engine:
    """Check everything a measurement needs before the first model is built, so that a bad value costs
    seconds rather than a run: returns the engine (a bad engine key is refused with the valid keys)."""
    if not specs:
        raise ValueError("no models given: pass models=[{name:resnet18,checkpoint:PATH,label:robust}, ...]")
    check_whole_number(seed, "seed", least=0)  # -1 and 0.5 failed in the trial draws, after every model was inverted
    ModelSpec.check_unique(specs)
    for spec in specs:
        if spec.checkpoint and not Path(spec.checkpoint).is_file():
            raise FileNotFoundError(f"model {spec.label!r}: checkpoint not found: {spec.checkpoint}")
    unknown_tasks = [t for t in tasks if t not in TASKS]
    if unknown_tasks or not tasks:  # none ran every inversion for a report without alignment numbers
        raise ValueError(f"unknown task(s) {unknown_tasks}: use any of {list(TASKS)}" if unknown_tasks
                         else f"tasks is empty: name at least one of {list(TASKS)}")
    unknown_seeds = [t for t in seed_types if t not in stimuli.SEED_TYPES]
    if unknown_seeds or not seed_types:
        raise ValueError(f"seed_types must be a non-empty list of {list(stimuli.SEED_TYPES)}, got {list(seed_types)}")
    if noise_kind not in NOISE_KINDS:
        raise ValueError(f"unknown noise_kind {noise_kind!r}: use one of {sorted(NOISE_KINDS)}")
    stimuli.check_chunk_size(chunk_size)
    if accuracy_limit is not None and (isinstance(accuracy_limit, bool) or not isinstance(accuracy_limit, int) or accuracy_limit < 1):
        raise ValueError(f"accuracy_limit must be a positive number of test images (or null for all), got {accuracy_limit!r}")
    needed = max((MIN_TARGETS[t] for t in tasks), default=1)
    if int(n_targets) < needed:
        raise ValueError(f"n_targets={n_targets} is too few: {', '.join(t for t in tasks if MIN_TARGETS[t] > n_targets)} needs at least {needed} targets")
    check_threshold(convergence_threshold)
    stimuli.check_attention_rate(attention_rate)
    if gaussian_targets and gaussian_targets is not True:
        stimuli.check_gaussians(gaussian_targets)
    resolved = resolve_engine(engine)
    if controversial:
        unknown = sorted(set(controversial) - set(CONTROVERSIAL_KEYS))
        if unknown:
            raise ValueError(f"unknown controversial key(s) {unknown}: valid keys are {list(CONTROVERSIAL_KEYS)}")
        labels = [s.label for s in specs]
        for role in ("model_a", "model_b"):
            label = controversial.get(role)
            if label not in labels:
                raise ValueError(f"controversial {role}={label!r} is not among the measured models {labels}: use one of their labels")
        if controversial["model_a"] == controversial["model_b"]:
            raise ValueError("controversial model_a and model_b must be two different models")
        if int(controversial.get("restarts", 3)) < 2:
            raise ValueError("controversial restarts must be at least 2: the score compares the results of one origin")
        if int(controversial.get("n_origins", 10)) < 1:
            raise ValueError("controversial n_origins must be at least 1")
        check_push_weight(controversial.get("lambda_", 0.1))
        for key, least in (("steps", 0), ("k", 1), ("exemplars_per_class", 1)):
            if controversial.get(key) is not None:
                check_whole_number(controversial[key], f"controversial {key}", least, " (or null)" if key == "steps" else "")
        objective = controversial.get("objective") or "controversial"
        if objective not in stimuli.CONTROVERSIAL_OBJECTIVES:
            raise ValueError(f"controversial objective={objective!r}: use one of {list(stimuli.CONTROVERSIAL_OBJECTIVES)}")
    return resolved


def check_controversial_data(cfg: Mapping, test) -> None:
    """Refuse a controversial setting the test split cannot serve: more origins than it has images, or the
    class-controversial score on a folder data set (its exemplars come from an in-memory labelled set)."""
    n_origins = int(cfg.get("n_origins", 10))
    if n_origins > len(test):
        raise ValueError(f"controversial.n_origins={n_origins} exceeds the {len(test)} test images: use at most {len(test)}")
    if (cfg.get("objective") or "controversial") == "class_controversial" and not hasattr(test, "float_images"):
        raise ValueError("the class-controversial score needs an in-memory labelled test set (cifar10, cifar100, digits) for its exemplars")


def measure_controversial(classifiers, test, panel: Panel, out: Path, cfg: Mapping, *, engine, seed, device, judge_8bit, config,
                          alignment: Mapping[str, Mapping] | None = None, chunk_size: int | None = None) -> dict:
    """Controversial stimuli for one model pair in both directions, scored as Nanda et al.'s Table 2
    (:func:`perceptual.tasks.controversial_spread`); per observer, the model they favour (with a bootstrap interval
    over origins) and whether that is the model the observer's clustering scores rank higher (``alignment``: the
    measured models' results)."""
    a, b = cfg["model_a"], cfg["model_b"]
    for label in (a, b):
        if label not in classifiers:
            raise ValueError(f"controversial model {label!r} is not among the measured models {sorted(classifiers)}")
    origins = stimuli.select_targets(test, n=int(cfg.get("n_origins", 10)), seed=seed + 1)
    if cfg.get("steps") is not None:  # the controversial stimuli's own step count (default: the inversions')
        engine = Engine(resolve_engine(engine).config, steps=int(cfg["steps"]))
    objective = cfg.get("objective") or "controversial"
    if objective == "class_controversial":
        return measure_class_controversial(classifiers, test, origins, panel, out, cfg, engine=engine, seed=seed, device=device,
                                           judge_8bit=judge_8bit, config=config, chunk_size=chunk_size)
    stimulus_set = stimuli.make_controversial_set(
        out / "controversial" / f"{a}-vs-{b}", classifiers[a], classifiers[b], origins,
        lam=float(cfg.get("lambda_", 0.1)), restarts=int(cfg.get("restarts", 3)), seed=seed, engine=engine, chunk_size=chunk_size, device=device,
        config=config, overwrite=SETS_OUT_OF_DATE,
    )
    images = quantize_8bit(stimulus_set.images) if judge_8bit else stimulus_set.images
    id_to_row = {image_id: i for i, image_id in enumerate(stimulus_set.manifest["id"])}
    per_observer = {o.name: controversial_spread(stimulus_set.manifest, images, id_to_row, o) for o in panel}
    directions = sorted({d for spread in per_observer.values() for d in spread})
    names = {"AB": f"{a} keeps, {b} pushed", "BA": f"{b} keeps, {a} pushed"}
    favoured = controversial_favoured(per_observer, {"AB": a, "BA": b})
    return {
        "model_a": a,
        "model_b": b,
        "lambda": float(cfg.get("lambda_", 0.1)),
        "set": str((out / "controversial" / f"{a}-vs-{b}").resolve()),  # absolute, as the models' sets
        "directions": {d: names.get(d, d) for d in directions},
        "per_observer": per_observer,
        "favoured_by_observer": favoured,
        "agrees_with_alignment": _agreement(favoured, alignment or {}, a, b),
        "verdict": controversial_verdict(favoured),
    }


def measure_class_controversial(classifiers, test, origins, panel: Panel, out: Path, cfg: Mapping, *, engine, seed, device, judge_8bit,
                                config, chunk_size: int | None = None) -> dict:
    """Class-controversial stimuli (Golan et al. 2020) for the pair, both directions, scored by
    :func:`perceptual.class_controversial.class_controversial_score`: how often each model's decision is the one the
    observer makes by its nearest class exemplars (test images other than the origins)."""
    a, b = cfg["model_a"], cfg["model_b"]
    if not hasattr(test, "float_images"):
        raise ValueError("the class-controversial score needs an in-memory labelled test set (cifar10, cifar100, digits) for its exemplars")
    stimulus_set = stimuli.make_controversial_set(
        out / "class-controversial" / f"{a}-vs-{b}", classifiers[a], classifiers[b], origins, objective="class_controversial",
        restarts=int(cfg.get("restarts", 3)), seed=seed, engine=engine, chunk_size=chunk_size, device=device, config=config,
        overwrite=SETS_OUT_OF_DATE,
    )
    results = (stimulus_set.manifest["role"] == "result").to_numpy().copy()  # writable: torch warns on a read-only view
    images = stimulus_set.images[torch.from_numpy(results)]
    origin_of = stimulus_set.manifest.loc[results, "origin_id"].tolist()  # the interval resamples origins, not restarts
    images = quantize_8bit(images) if judge_8bit else images
    keep = torch.ones(len(test), dtype=torch.bool)
    keep[origins.source_index] = False  # an origin is not an exemplar of its own class
    pool = torch.nonzero(keep).flatten()
    exemplars, labels = class_exemplars(test.float_images(pool), test.labels[pool], int(cfg.get("exemplars_per_class", 20)), seed=seed)
    models = {label: classifiers[label].module("classifier") for label in (a, b)}
    score = class_controversial_score(images, models, list(panel), exemplars, labels, k=int(cfg.get("k", 5)), origins=origin_of, seed=seed)
    return {"objective": "class_controversial", "model_a": a, "model_b": b, "set": str((out / "class-controversial" / f"{a}-vs-{b}").resolve()),
            **score, "verdict": class_controversial_sentence(score)}


def controversial_scores(controversial: Mapping) -> dict[str, dict[str, float]]:
    """Per direction, each observer's Table 2 score. Observers measure on different scales (an LPIPS distance, 1 - SSIM,
    a pixel L2), so the scores are never averaged over the panel."""
    return {d: {o: spread[d]["mean"] for o, spread in controversial["per_observer"].items() if d in spread} for d in controversial["directions"]}


def _agreement(favoured: Mapping[str, dict], alignment: Mapping[str, Mapping], a: str, b: str) -> dict[str, bool | None]:
    """Per observer: does the favoured model have the higher clustering accuracy for that observer? None: undecided."""
    out: dict[str, bool | None] = {}
    for observer, f in favoured.items():
        scores = {m: alignment.get(m, {}).get("per_observer", {}).get("clustering", {}).get(observer, {}).get("overall", {}).get("accuracy")
                  for m in (a, b)}
        if f["favours"] is None or None in scores.values() or scores[a] == scores[b]:
            out[observer] = None
        else:
            out[observer] = f["favours"] == max(scores, key=scores.get)
    return out


def controversial_favoured(per_observer: Mapping[str, Mapping[str, dict]], keeper: Mapping[str, str], n_boot: int = 2000,
                           seed: int = 0) -> dict[str, dict]:
    """Per observer, the model whose "keeps" direction gives the lower controversial score (the more aligned one
    by Table 2): the score difference (first direction minus second, paired by origin) with a percentile-bootstrap
    95 % interval over origins, for its size, and the sign-flip test's p-value over origins
    (:func:`perceptual.statistics.sign_flip_p_value`), for the verdict. ``favours`` is None when p >= 0.05 (the
    origins do not separate the directions; fewer than :data:`perceptual.statistics.SIGN_FLIP_MIN_N` origins never
    do: the bootstrap interval alone called 2 origins that agree in sign a verdict) or when a direction is missing. Each
    observer resamples with a generator of its own, so its interval does not depend on which observers come before it."""
    directions = list(keeper)
    out: dict[str, dict] = {}
    for observer, spread in per_observer.items():
        rng = np.random.default_rng(stream_seed("repalign.controversial", seed, observer))  # one observer's interval, whatever the panel
        if not all(d in spread for d in directions) or len(directions) != 2:
            out[observer] = {"favours": None, "difference": math.nan, "ci": [math.nan, math.nan], "p_value": math.nan, "n_origins": 0}
            continue
        first, second = (spread[d].get("per_origin") or {} for d in directions)
        origins = sorted(set(first) & set(second))
        if origins:
            diff = np.array([first[o] - second[o] for o in origins])
        else:  # summaries without per-origin values: the means alone, no interval
            diff = np.array([spread[directions[0]]["mean"] - spread[directions[1]]["mean"]])
        mean = float(diff.mean())
        if len(diff) > 1:
            boots = diff[rng.integers(0, len(diff), size=(n_boot, len(diff)))].mean(1)
            low, high = percentile_interval(boots, 0.95)
        else:
            low = high = math.nan
        p_value = sign_flip_p_value(diff, seed=seed) if origins else math.nan  # means alone: no test, no verdict
        favours = (keeper[directions[0]] if mean < 0 else keeper[directions[1]]) if p_value < 0.05 else None
        out[observer] = {"favours": favours, "difference": mean, "ci": [low, high], "p_value": p_value, "n_origins": len(origins)}
    return out


def controversial_verdict(favoured: Mapping[str, Mapping | str | None]) -> str:
    """Plain words for the controversial result: the observers agree on a model, or they do not (some favour
    another model or neither; then the result says nothing about alignment at this scale, and the report shows every
    observer's column)."""
    favoured = {o: (f["favours"] if isinstance(f, Mapping) else f) for o, f in favoured.items()}
    choices = sorted({m for m in favoured.values() if m is not None})
    if not choices:
        return (f"no observer separates the two directions (no sign-flip test over origins reaches p < 0.05; fewer than {SIGN_FLIP_MIN_N} "
                "origins never do): the controversial stimuli favour neither model")
    undecided = [o for o, m in favoured.items() if m is None]
    if len(choices) == 1 and not undecided:
        return f"every observer favours {choices[0]}: its controversial stimuli stay perceptually closer together"
    groups = [f"{', '.join(o for o, m in favoured.items() if m == model)} favour {model}" for model in choices]
    groups += [f"{', '.join(undecided)} favour neither"] if undecided else []
    return (f"the observers {'disagree' if len(choices) > 1 else 'do not agree'} ({'; '.join(groups)}): at this scale the controversial "
            "stimuli do not rank the models; read the alignment table instead, or use more origins and steps")


def _favoured_cell(favoured: Mapping) -> str:
    """``robust (p 0.031) [-0.012, -0.004]``; a report saved before the test has no p, fewer than 2 origins no interval."""
    p_value = favoured.get("p_value")
    p_text = f" (p {p_value:.3f})" if report.is_number(p_value) else ""
    low, high = favoured.get("ci") or (None, None)
    interval = f" [{low:+.3f}, {high:+.3f}]" if report.is_number(low) and report.is_number(high) else " (no interval: fewer than 2 origins)"
    return f"{favoured['favours'] or 'neither'}{p_text}{interval}"


def seed_names(data: Mapping) -> str:
    """The seed types for the report's first line, naming the noise's distribution when it is not uniform."""
    kind = data.get("noise_kind", "uniform")
    return ", ".join(f"{t} ({kind})" if t == "noise" and kind != "uniform" else t for t in data["seed_types"])


def _task_cells(scores: Mapping) -> list[str]:
    """The three alignment tasks' panel mean ± std, as the report's tables print them."""
    return [report.format_score((scores.get(t) or {}).get("mean"), (scores.get(t) or {}).get("std")) for t in ("2afc", "clustering", "clustering_hard")]


def write_report(data: dict, out: Path) -> None:
    """report.json, report.md, report.html, grid.png and the scatter plots: the JSON first, so that a figure that fails to
    draw loses no number; figures of an earlier report that this one does not draw are removed."""
    atomic_write_json(out / "report.json", report.plain(data))  # undefined numbers as null: strict JSON readers refuse NaN
    models_data = data["models"]
    with_convergence = {label: m for label, m in models_data.items() if "convergence" in m}
    marked = {(f"{label} †" if not m.get("converged", True) else label): m for label, m in models_data.items()}
    notes = _report_notes(data, with_convergence)
    figures = _report_figures(data, out, marked, with_convergence)
    caption = (
        f"Data set {data['data']}, {data['n_targets']} targets × seeds {seed_names(data)}; observers "
        f"(panel mean ± std): {', '.join(data['observers'])}; judged on {data['judged_on']}."
    )
    markdown = ["# Alignment report", "", report.markdown_table(marked, caption)]
    markdown += _convergence_section(data, with_convergence)
    markdown += _seed_type_section(models_data)
    markdown += _gaussian_section(models_data)
    markdown += _statistics_sections(data.get("statistics") or {})
    if data.get("converged_only"):
        restricted = {label: {**m, **m["converged_only"]} for label, m in models_data.items() if "converged_only" in m}
        markdown += ["## Converged items only", "", report.markdown_table(restricted, "The same scores over the converged inversions only."), ""]
    controversial, note = _controversial_section(data)
    markdown += controversial
    notes += [note] if note else []
    markdown += [f"- {n}" for n in notes] + [f"- ![{f}]({f})" for f in figures]
    text = "\n".join(markdown) + "\n"
    report.write_text(out / "report.md", text)
    report.write_text(out / "report.html", report.markdown_page(text, "repalign alignment report"))


def _report_notes(data: Mapping, with_convergence: Mapping) -> list[str]:
    """The report's closing notes: the LPIPS variants, each model's convergence, what † and the offline variants mean."""
    variants = sorted(set(data["observer_variants"].values()) - {"weight-free"})
    notes = [f"LPIPS variant(s) used: {'; '.join(variants) or 'none'}."]
    if with_convergence:
        notes += [convergence_sentence(label, m["convergence"]) + "." for label, m in with_convergence.items()]
        if data.get("not_converged"):
            notes.append(f"† in the table: fewer than {MIN_CONVERGED_FRACTION:.0%} of the model's inversions converged.")
    if offline_variants(variants):
        notes.append("The LPIPS AlexNet weights were not available: the LPIPS rows use the labelled offline variants.")
    return notes


def _report_figures(data: Mapping, out: Path, marked: Mapping, with_convergence: Mapping) -> list[str]:
    """Draw the report's figures (the grid, the scatter plots, convergence), remove an earlier report's that this one
    does not draw, and return the names of those it shows."""
    models_data = data["models"]
    figures = []
    sets = [m.get("set") for m in models_data.values()]
    if sets and all(sets) and all(Path(p).is_dir() for p in sets):
        figures.append(_grid(models_data, out / "grid.png").name)
    elif sets and all(sets) and (out / "grid.png").is_file():  # a report of relative set paths rewritten from another folder
        log.warning("the sets %s are not found from %s: grid.png is kept as it was", sets, Path.cwd())
        figures.append("grid.png")
    for task in ("2afc", "clustering"):
        if report.scatter_points(models_data, task):  # none without robust accuracy (threat=null)
            figures.append(report.alignment_scatter(marked, out / f"scatter_{task}.png", task).name)
    if with_convergence:
        figures.append(convergence_figure({k: m["convergence"] for k, m in with_convergence.items()}, out / "convergence.png").name)
    for stale in ("grid.png", "scatter_2afc.png", "scatter_clustering.png", "convergence.png"):
        if stale not in figures:  # an earlier report's figure, no longer this report's
            (out / stale).unlink(missing_ok=True)
    return figures


def _convergence_section(data: Mapping, with_convergence: Mapping) -> list[str]:
    if not with_convergence:
        return []
    threshold = data.get("convergence_threshold", DEFAULT_THRESHOLD)
    lines = [
        f"## Convergence (normalised representation distance; converged: <= {threshold:g})", "",
        "| Model | best distance: median | best distance: 90th pct. | last iterate's loss: median | converged |", "|---|---|---|---|---|",
    ]
    lines += [
        f"| {label} | {report.format_number(c['best_median'])} | {report.format_number(c['best_p90'])} | {report.format_number(c['last_median'])} | "
        f"{report.format_number(c['converged_fraction'], '.0%')} |"
        for label, c in ((label, m["convergence"]) for label, m in with_convergence.items())
    ]
    with_priors = [label for label, m in with_convergence.items() if m["convergence"].get("curve_includes_priors")]
    lines += ["", "The best distance is the inversion distance alone at the image each item keeps, in float32. The last iterate's loss "
              "is the engine's objective where the item stopped, in the run's precision (bf16 on a GPU): beside the best it says "
              "whether items were still moving, not how far they got"
              + (f"; for {', '.join(with_priors)} it includes the priors (tv_weight, lp_weight, transform_robust), so it is not "
                 "a distance." if with_priors else "."), ""]
    return lines


def _seed_type_section(models_data: Mapping) -> list[str]:
    with_seed_types = {label: m for label, m in models_data.items() if len(m.get("by_seed_type") or {}) > 1}
    if not with_seed_types:
        return []
    lines = ["## By seed type", "",
             "The table above pools the seed types; Nanda et al.'s Table 1 inverts from noise seeds only, so its headline "
             "compares with the noise rows (`seed_types=[noise]` measures those alone). Panel mean ± std.", "",
             "| Model | Seeds | 2AFC (%) | Clustering (%) | Hard clustering (%) | converged |", "|---|---|---|---|---|---|"]
    for label, m in with_seed_types.items():
        for seed_type, scores in m["by_seed_type"].items():
            cells = _task_cells(scores)
            conv = (m.get("convergence") or {}).get("by_seed_type", {}).get(seed_type, {}).get("converged_fraction")
            lines.append(f"| {label} | {seed_type} | " + " | ".join(cells) + f" | {report.format_number(conv, '.0%')} |")
    return lines + [""]


def _gaussian_section(models_data: Mapping) -> list[str]:
    with_gaussian = [m for m in models_data.values() if "gaussian" in m]
    if not with_gaussian:
        return []
    described = ", ".join(f"N({g['mean']}, {g['std']}²) ({g['name']})" for g in with_gaussian[0]["gaussian"]["gaussians"])
    lines = ["## In-distribution vs Gaussian targets (Nanda et al. Table 3)", "",
             f"The same models inverted towards test images and towards noise images drawn from {described}, clamped to "
             "[0, 1]; panel mean ± std.", "",
             "| Model | Targets | 2AFC (%) | Clustering (%) | Hard clustering (%) | converged |", "|---|---|---|---|---|---|"]
    for label, m in models_data.items():
        for kind, entry in (("test images", m), ("Gaussian", m.get("gaussian"))):
            if entry is None:
                continue
            cells = _task_cells(entry)
            conv = entry.get("convergence", {}).get("converged_fraction")
            lines.append(f"| {label} | {kind} | " + " | ".join(cells) + f" | {report.format_number(conv, '.0%')} |")
    return lines + [""]


def _statistics_sections(stats: Mapping) -> list[str]:
    """The paired differences between models and whether their ranking holds (:func:`measurement_statistics`)."""
    lines: list[str] = []
    if stats.get("paired_differences"):
        lines += ["## Paired differences between models", "",
                  "Mean difference of the scores on the same targets, with a 95 % paired bootstrap interval over targets and the "
                  "panel's observers; * where the interval excludes 0.", "", "| Task | Models | Difference (points) | 95 % interval |",
                  "|---|---|---|---|"]
        for task, pairs in stats["paired_differences"].items():
            for pair, r in pairs.items():
                star = " *" if r["separated"] else ""
                lines.append(f"| {task} | {pair} | {_points(r['difference'])}{star} | [{_points(r['ci_low'])}, {_points(r['ci_high'])}] |")
        lines.append("")
    if stats.get("ranking_agreement"):
        lines += ["## Does the model ranking hold? (Kendall's tau, 95 % bootstrap interval over targets)", "",
                  "| Rankings compared | tau | interval |", "|---|---|---|"]
        lines += [f"| {name} | {_tau_cell(r['tau'])} | {_interval_cell(r['ci_low'], r['ci_high'])} |" for name, r in stats["ranking_agreement"].items()]
        lines += ["", "With two models tau is +1 (same order) or -1 (reversed); the interval says how often resampled targets keep it. "
                  "A ranking that ties the models (equal scores) has no tau.", ""]
    return lines


def _controversial_section(data: Mapping) -> tuple[list[str], str | None]:
    """The controversial (or class-controversial) stimuli's section and the note that sums up its verdict."""
    c = data.get("controversial")
    if c is None:
        return [], None
    if c.get("objective") == "class_controversial":
        lines = [f"## Class-controversial stimuli ({c['model_a']} vs {c['model_b']})", "",
                 "Golan et al. (2020): images the two models classify differently. Each observer chooses between the two models' "
                 "classes by its nearest class exemplars; the rate is how often that choice is the model's decision, "
                 + (f"each origin's rate counted once (95% {c.get('interval')}; the verdict a sign-flip test over the "
                    f"{c.get('n_origins')} origins)" if c.get("n_origins") is not None else f"with a 95% {c.get('interval', 'interval')}")
                 + f", over the {c['n_controversial']} of {c['n_stimuli']} stimuli the models disagree on.", ""]
        if c.get("observers"):
            names = c["models"]
            lines += ["| Observer | " + " | ".join(names) + " | sides with |", "|---|" + "---|" * (len(names) + 1)]
            lines += [f"| {o} | " + " | ".join(_rate_cell(r["per_model"][m]) for m in names) + f" | {r['favours'] or 'neither'} |"
                      for o, r in c["observers"].items()]
        else:
            lines.append(c.get("note", ""))
        return lines + [""], "Class-controversial stimuli: " + c["verdict"].replace("\n", "; ")
    # Observers measure on different scales: one column each, not a panel average.
    observers = list(c["per_observer"])
    lines = [
        f"## Controversial stimuli ({c['model_a']} vs {c['model_b']}, lambda {c['lambda']})",
        "",
        "Nanda et al.'s Table 2 score: the mean pairwise perceptual distance among each origin x_0 and its results "
        "(lower: the stimuli that keep the first model's representation stay perceptually closer, i.e. that model is the more "
        "aligned); below it, the mean distance of the results to x_0.",
        "",
        "| Direction | " + " | ".join(observers) + " |",
        "|---|" + "---|" * len(observers),
    ]
    lines += [
        f"| {c['directions'][d]} | " + " | ".join(report.format_number(c['per_observer'][o][d]['mean']) for o in observers) + " |"
        for d in c["directions"]
    ]
    to_origin = [" / ".join(report.format_number(c["per_observer"][o][d]["to_origin"]["mean"]) for d in c["directions"]) for o in observers]
    lines.append("| distance to origin, " + " / ".join(c["directions"][d].split(",")[0] for d in c["directions"]) + " | "
                 + " | ".join(to_origin) + " |")
    lines.append("| favours (sign-flip p over origins; 95% CI of the difference) | " + " | ".join(
        _favoured_cell(c['favoured_by_observer'][o]) for o in observers) + " |")
    if c.get("agrees_with_alignment"):
        lines.append("| agrees with the clustering ranking | " + " | ".join(
            {True: "yes", False: "no", None: "–"}[c["agrees_with_alignment"].get(o)] for o in observers) + " |")
    lines += ["", f"**Reading:** {c['verdict']}.", ""]
    return lines, f"Controversial stimuli: {c['verdict']}."


def _absolute(path: str | None) -> str | None:
    """A checkpoint path as the report records it: absolute where the file exists (the report is read from other folders,
    as its sets' paths are), else as given (a hub name, or a path to name in an error)."""
    return str(Path(path).resolve()) if path and Path(path).exists() else path


def _rate_cell(entry: Mapping) -> str:
    """A class-controversial rate with its interval: ``62% [41%, 80%]``."""
    low, high = entry["ci"]
    return f"{report.format_number(entry['rate'], '.0%')} [{report.format_number(low, '.0%')}, {report.format_number(high, '.0%')}]"


def _points(fraction: float | None) -> str:
    """A difference of two accuracies in percentage points, signed; "–" where undefined."""
    return report.format_number(100 * fraction if report.is_number(fraction) else None, "+.1f")


def _tau_cell(tau: float | None) -> str:
    return f"{tau:+.2f}" if report.is_number(tau) else "undefined (tied scores)"


def _interval_cell(low: float | None, high: float | None) -> str:
    return f"[{low:+.2f}, {high:+.2f}]" if report.is_number(low) and report.is_number(high) else "–"


def _grid(models_data: Mapping[str, dict], path: Path, n_columns: int = 6) -> Path:
    """Rows: the targets, then each model's seed and result per seed type; columns: targets. Each result shows
    its normalised representation distance, and the right column the row's median over the shown items."""
    rows: dict[str, list[torch.Tensor]] = {}
    captions: dict[str, list[str]] = {}
    notes: dict[str, str] = {}
    first = True
    for label, result in models_data.items():
        stimulus_set = stimuli.load_set(result["set"])
        manifest = stimulus_set.manifest
        target_ids = list(manifest.loc[manifest["role"] == "target", "id"])[:n_columns]
        if first:
            rows["target"] = list(stimulus_set.get(target_ids))
            first = False
        results = manifest[manifest["role"] == "result"]
        distance = pd.Series(result_distances(stimulus_set, results), index=results["id"].to_numpy())
        for seed_type in sorted(results["seed_type"].unique()):
            chosen = results[(results["seed_type"] == seed_type) & results["target_id"].isin(target_ids)].set_index("target_id").loc[target_ids]
            rows[f"{seed_type} seed"] = list(stimulus_set.get(list(chosen["seed_id"])))
            name = f"{label}\n({seed_type})"
            rows[name] = list(stimulus_set.get(list(chosen["id"])))
            captions[name] = [f"d = {v:.3f}" for v in distance[chosen["id"]]]
            notes[name] = f"median {distance[results.loc[results['seed_type'] == seed_type, 'id']].median():.3f}\n(all items)"
    title = ("Targets, seeds and inversion results: where a model's invariances match perception, its results look like the "
             "targets above them, not like their seeds (d: normalised representation distance; lower = nearer the target's)")
    return report.image_grid(rows, [f"#{i + 1}" for i in range(n_columns)], path, "\n".join(textwrap.wrap(title, 110)),
                             captions=captions, row_notes=notes)


def threat_from_config(cfg) -> ThreatModel | None:
    """The robust-accuracy threat model from a ``threat`` node (``eps`` may be a fraction such as 8/255); None: no attack."""
    return None if cfg is None else ThreatModel.from_config(cfg)


def headline(data: dict) -> str:
    """Table 1 as the commands print it; † marks a model whose inversions did not converge (see the report)."""
    return report.markdown_table({(f"{label} †" if not m.get("converged", True) else label): m for label, m in data["models"].items()})


def load_report(path: str | Path) -> dict:
    return json.loads((Path(path) / "report.json").read_text())


__all__ = [
    "ModelSpec", "TASKS", "accuracy_cache_key", "controversial_favoured", "controversial_scores", "controversial_verdict", "headline", "load_report",
    "make_panel", "measure_models", "observe_set", "threat_from_config", "validate_inputs", "write_report",
]
