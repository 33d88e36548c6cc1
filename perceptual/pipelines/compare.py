"""``python -m perceptual compare``: models and a panel of simulated observers on model-vs-human's distortion
conditions, scored by the metric suite; plus an unknown-detection report.

Given models (zoo names and checkpoints), a data set and conditions, every model and every simulated subject
(observer network × seed, :mod:`perceptual.decisions`) classifies the same ``n_images`` test images in every
condition (:mod:`stimuli.distortions`). From their answers, per condition and averaged over conditions:

* accuracy; observed consistency and error consistency (Geirhos et al., NeurIPS 2020); misclassification
  agreement, class-level error similarity (CLES), softmax-output similarity over all images (SOC) and over the
  joint errors (SOCE) (Xu et al., "Measuring Error Alignment"); linear CKA of penultimate features (Kornblith
  et al., ICML 2019; models only: the observers have no feature space of that kind);
* pairwise matrices over all systems (models and subjects) with heatmaps; the condition average is, as in
  model-vs-human, the mean over each generator's conditions (an experiment of the benchmark) and then over
  generators, skipping undefined (NaN) values: a generator with 8 levels weighs as much as one with 2;
* model-vs-observer values in model-vs-human's nesting (:func:`perceptual.metrics.aggregate_trials`, the
  subjects playing the humans, each generator an experiment) and the models' mean rank over accuracy difference
  (lower is better), observed consistency and error consistency (model-vs-human's benchmark ranking), and over
  all metrics. With ``metrics.benchmark_exclusions`` (the default) the averages and the ranking leave out the
  conditions the benchmark's table leaves out (:data:`BENCHMARK_EXCLUDED_PARAMETERS`: the controls and the levels
  where its humans score under 20 %); the per-condition numbers keep every condition;
* the Spearman correlation between metrics over the distinct system pairs (Xu et al.'s analysis), and its global vs
  average form with the conditions as families and per-condition z-scores (:mod:`perceptual.error_alignment`).

Diagonals of the pairwise matrices (a system against itself): observed consistency, error consistency, MA,
SOC, SOCE and CKA are 1 where defined. Undefined (NaN): error consistency for a system that is right on
every image or wrong on every image of a condition; MA and SOCE for a system without errors, and MA when all
its errors carry one and the same wrong label; CKA for subjects. CLES with the reference's ``paper`` variant
is below 1 on the diagonal (its pooled smoothing, see :func:`perceptual.metrics.class_level_error_divergence`);
``metrics.cles_variant=jsd`` gives 1.

The ``unknown`` report: in-distribution = the clean test images, out-of-distribution = noise images and/or
distortion conditions (``unknown.ood``); for every model and score function (:mod:`perceptual.scores`, fit on
``unknown.n_fit`` training images) and for the deep ensemble of all models: AURC and E-AURC
(misclassification detection), the unified unknown-detection AURC (every OOD image counts as an error),
AUROC and FPR at 95 % TPR per OOD set, and, where the score has a predictive distribution, ECE, NLL and
Brier score on the ID images. A score that does not apply to a model (MC dropout without dropout layers,
ReAct where the logits are not one linear layer of the features) is reported with the reason.

Output directory (``out``)::

    conditions/<condition>/    one stimulus set per condition (stimuli's format; reused when unchanged)
    cache/                     model outputs, observer distances and unknown results, keyed by what made them
    trials.csv                 every trial: subject, dataset (the generator: the benchmark's experiment), condition,
                               image_id, category, response, correct
    metrics.json               every number above, and where each model came from (model_sources: checkpoint, weights
                               hash); unknown.json: the unknown report
    error_alignment.json       global, z-scored global and average Spearman between metrics; error_alignment_pairs.csv
    figures/*.png              heatmaps (aggregated; per condition with metrics.per_condition_figures=true),
                               accuracy per generator, Spearman between metrics, unknown AUROC
    summary.md                 the tables and the figures

Real human trials (``humans=PATH``): the model-vs-human benchmark's trial CSVs (a file, an experiment folder or its
``raw-data`` root) become the human rows of every metric above (:mod:`perceptual.human_compare`; rows
``human:subject-01`` and ``model:<name>``), written to ``out/humans/``. The models must decide on the same images,
matched by source image: either their decisions in the benchmark's CSV format (``model_trials=[PATH, ...]``, e.g. from
the benchmark's own ``raw-data`` model files or :func:`perceptual.human_trials.write_trials`), or the benchmark's image
folders (``humans_images=PATH``: ``<experiment>/dnn/session-1/*.png`` or ``<experiment>/<class>/*.png``) through which
the ImageNet ``models`` decide via the 16-class mapping (their decisions are written to ``out/humans/decisions/`` in
the benchmark's format). Alone
(default) no simulated observer runs; with ``humans_with_panel=true`` the panel run above
is done as well and its report sits next to the human one (the panel classifies the data set's images, the humans the
benchmark's: the two reference groups share no images, so each ranks the models on its own). The ranking leaves out
the conditions the benchmark's table excludes (``humans_benchmark_exclusions=false`` keeps them).

A rerun skips every finished part (condition sets, model outputs, observer distances, unknown results) and
recomputes only the metrics and reports, which are cheap. All files are written atomically.
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

import hydra
import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

import stimuli
from invert.rng import noise_images
from stimuli.distortions import Distortion, in_grid_order, make_condition_set, parse_conditions
from stimuli.sets import tensor_sha256
from training.checkpoints import weights_hash
from training.config import as_list, check_whole_number, concise_errors, dataset_from_config, expand_path, expand_path_options, resolve_device
from training.io import atomic_write_json, atomic_write_text
from training.sweeps import job_path

from ..cache import cache_key, cached_json, cached_tensors, module_identity
from ..compare_report import _fmt, heatmap, unknown_metrics, write_outputs
from ..decisions import ObserverDecisions, check_decision_rule, model_trials, observer_slug, stable_key, whole_or_as_is
from ..error_alignment import error_alignment, write_error_alignment
from ..human_compare import compare_on_trials, labelled_trials
from ..human_compare import summary_markdown as human_summary_markdown
from ..human_trials import classify_image_folder, has_image_folder, read_trials, write_trials
from ..measure import ModelSpec, check_model_serves, make_panel
from ..metrics import mvh_exclusions
from ..observers import observer_names
from ..pair_metrics import PAIR_METRIC_REGISTRY, Responses, metric_correlations, nanmean_matrices, pairwise_matrices, rankings
from ..report import plain
from ..scores import DeepEnsemble, ModelOutputs, check_score_settings, make_score, model_outputs

log = logging.getLogger(__name__)
NOISE_SETS = ("noise:gaussian", "noise:uniform")


# model-vs-human's excluded conditions (perceptual.metrics.MVH_EXCLUDED_CONDITIONS) on this toolkit's grids
# (stimuli.distortions.GRIDS): generator -> parameters. Its colour "cr", contrast "c100", power-equalisation "0" and
# false-colour "True" are the undistorted controls, here colour, 1.0, original and true.
BENCHMARK_EXCLUDED_PARAMETERS: Mapping[str, tuple] = MappingProxyType({
    "colour": ("colour",),
    "contrast": (1.0, 0.03, 0.01),
    "high_pass": (math.inf, 0.55, 0.45, 0.4),
    "low_pass": (0.0, 15.0, 40.0),
    "phase_noise": (0.0, 150.0, 180.0),
    "power_equalisation": ("original",),
    "opponent_colour": ("true",),
    "rotation": (0.0,),
    "uniform_noise": (0.0, 0.6, 0.9),
})


def benchmark_excluded(conditions: Sequence[Distortion]) -> dict[str, list[str]]:
    """``{generator: [condition name, ...]}`` of the ``conditions`` that model-vs-human's table leaves out."""
    excluded: dict[str, list[str]] = {}
    for condition in conditions:
        if condition.parameter in BENCHMARK_EXCLUDED_PARAMETERS.get(condition.generator, ()):
            excluded.setdefault(condition.generator, []).append(condition.name)
    return excluded


def nested_mean(values: Mapping[str, Any], generator_of: Mapping[str, str], mean: Callable[[list], Any]) -> Any:
    """``mean`` over generators of ``mean`` over each generator's conditions (``values``: condition name -> value)."""
    by_generator: dict[str, list] = {}
    for name, value in values.items():
        by_generator.setdefault(generator_of[name], []).append(value)
    return mean([mean(group) for group in by_generator.values()])


def _file_name(text: str) -> str:
    """A name safe on every file system (``noise:uniform`` → ``noise-uniform``)."""
    return "".join(ch if ch.isalnum() or ch in "-_.=" else "-" for ch in text)


def _with_defaults(group: str, defaults: Mapping, given: Mapping | None) -> dict:
    """``given`` over ``defaults``; a key the defaults lack is a typo (Hydra refuses it on the command line, Python did not)."""
    unknown = sorted(set(given or {}) - set(defaults))
    if unknown:
        raise ValueError(f"unknown {group} key(s) {unknown}: valid keys are {sorted(defaults)}")
    return {**defaults, **dict(given or {})}


class ComparePipeline:
    """The compare run in Python; :func:`run` builds it from a Hydra config. See the module docstring."""

    def __init__(self, specs: Sequence[ModelSpec], data_cfg: Mapping, out: str | Path, *, conditions: Any, n_images: int = 200,
                 seed: int = 0, device: Any = "auto", batch_size: int = 256, reference_size: int = 224, preview: bool = False,
                 observers: Any = "auto", observer_net: str = "alex", lpips_weights: str | None = None,
                 decisions: Mapping | None = None, metrics: Mapping | None = None, unknown: Mapping | None = None,
                 progress: bool = True, config: Mapping | None = None):
        self.specs = list(specs)
        if not self.specs:
            raise ValueError("no models given: pass models=[{name:small_cnn,checkpoint:PATH,label:mine}, ...]")
        ModelSpec.check_unique(self.specs)
        for spec in self.specs:
            if spec.label.startswith("subject-"):
                raise ValueError(f"model label {spec.label!r} must not start with 'subject-': that prefix marks simulated observers")
            if spec.layer is not None:
                raise ValueError(f"model {spec.label!r}: compare uses the penultimate layer (CKA, Mahalanobis, k-NN, ReAct); drop layer=")
        self.out = Path(out)
        self.device = resolve_device(device)
        self.data_cfg = dict(data_cfg)
        self.dataset = self.data_cfg["name"]
        check_whole_number(n_images, "n_images")  # 2.5 was cut to 2 without a word, 0 was refused as n_targets
        self.n_images, self.seed, self.batch_size, self.preview = int(n_images), int(seed), int(batch_size), bool(preview)
        self.conditions = in_grid_order(parse_conditions(conditions, reference_size))  # tables and figures from undistorted on
        self.reference_size = reference_size
        self.observer_spec = (observers, observer_net, lpips_weights)
        self.decision_cfg = _with_defaults("decisions", {"seeds": [0, 1, 2], "exemplars_per_class": 10, "k": 5, "lapse": 0.05, "noise": 0.5}, decisions)
        self.metric_cfg = _with_defaults("metrics", {"cles_variant": "paper", "on_undefined": "nan", "per_condition_figures": False,
                                                     "benchmark_exclusions": True}, metrics)
        self.unknown_cfg = _with_defaults("unknown", {"enabled": True, "scores": ["max_softmax", "negative_entropy", "energy", "odin", "mahalanobis",
                                                                          "knn", "react"],
                                                      "score_params": {}, "ood": ["noise:gaussian", "noise:uniform"], "n_fit": 2000, "ensemble": True},
                                          unknown)
        for key, choices in (("cles_variant", ("paper", "jsd")), ("on_undefined", ("nan", "one")), ("benchmark_exclusions", (True, False))):
            if self.metric_cfg[key] not in choices:
                raise ValueError(f"metrics.{key} must be one of {choices}, got {self.metric_cfg[key]!r}")
        self.excluded = benchmark_excluded(self.conditions) if self.metric_cfg["benchmark_exclusions"] else {}
        self.below_resolution: list[str] = []  # conditions of flat grey images at the data's size, set with the data
        if all(c.name in self.excluded.get(c.generator, ()) for c in self.conditions):
            raise ValueError(f"every condition ({[c.name for c in self.conditions]}) is one model-vs-human's table leaves out (a control, or "
                             "humans under 20 %): nothing is left to average or rank; add others, or set metrics.benchmark_exclusions=false")
        self._check_unknown_config()
        self._check_panel_config(observers)
        self.progress = bool(progress)
        self.config = dict(config or {})

    def _check_panel_config(self, observers: Any) -> None:
        """Refuse unknown observer names and a decision rule that cannot run before any work (with ``humans_with_panel``,
        before the human report is written); ``k`` against the exemplars drawn waits for the data's classes."""
        if observers not in ("auto", None):
            names = as_list(observers, "observers")
            unknown = [n for n in names if n not in observer_names()]
            if unknown or not names or len(set(names)) != len(names):
                raise ValueError(f"observers must be auto or distinct names from {observer_names()}, got {names}")
        d = self.decision_cfg
        try:
            rule = {"seeds": [whole_or_as_is(x) for x in d["seeds"]], "per_class": whole_or_as_is(d["exemplars_per_class"]), "k": whole_or_as_is(d["k"]),
                    "lapse": float(d["lapse"]), "noise": float(d["noise"])}
        except (TypeError, ValueError) as err:
            raise ValueError(f"decisions: seeds are ints, exemplars_per_class and k whole numbers, lapse and noise numbers ({err})") from None
        try:
            check_decision_rule(**rule)
        except ValueError as err:  # named as the config names them: decisions.exemplars_per_class, not per_class
            raise ValueError("decisions." + str(err).replace("per_class", "exemplars_per_class", 1)) from None
        self.decision_rule = rule  # ObserverDecisions' keywords, as read from decisions

    def _check_unknown_config(self) -> None:
        """Refuse bad score names, score parameters and OOD sets before any work is done."""
        cfg = self.unknown_cfg
        if not cfg.get("enabled", True):
            return
        n_fit = cfg["n_fit"]
        if n_fit is not None and (isinstance(n_fit, bool) or not isinstance(n_fit, int) or n_fit < 1):
            raise ValueError(f"unknown.n_fit must be a positive number of training images (or null for all), got {n_fit!r}")
        cfg["scores"], cfg["ood"] = as_list(cfg["scores"], "unknown.scores") or [], as_list(cfg["ood"], "unknown.ood") or []
        if "ensemble" in cfg["scores"]:
            raise ValueError("the deep ensemble is switched on by unknown.ensemble=true, not listed in unknown.scores")
        check_score_settings(cfg["scores"], cfg.get("score_params"), where="unknown.")
        if not cfg["ood"]:
            raise ValueError("unknown.ood is empty: name at least one OOD set (noise:gaussian, noise:uniform or a condition)")
        canonical: dict[str, str] = {}  # the condition's own name -> as given: uniform_noise=0.90 is uniform_noise=0.9
        for name in cfg["ood"]:
            if name not in NOISE_SETS:
                try:
                    found = parse_conditions([name], self.reference_size)
                except ValueError as err:
                    raise ValueError(f"unknown OOD set {name!r}: use {list(NOISE_SETS)} or a condition 'generator=value' ({err})") from None
                if len(found) != 1:  # a generator name is its whole grid
                    raise ValueError(f"OOD set {name!r} names {len(found)} conditions: give one, e.g. {found[-1].name!r}")
                name, given = found[0].name, name
            else:
                given = name
            if name in canonical:  # the unified AURC would pool its images twice
                raise ValueError(f"unknown.ood names {name!r} twice ({canonical[name]!r} and {given!r}): list each OOD set once")
            canonical[name] = given
        cfg["ood"] = list(canonical)

    # -------------------------------------------------------------------------------- inputs

    def _load_data(self) -> None:
        self.test = dataset_from_config(self.data_cfg, "test")
        self.train = dataset_from_config(self.data_cfg, "train")
        if not hasattr(self.test, "images"):
            raise ValueError(f"compare needs an in-memory data set (digits, cifar10, cifar100); {self.dataset} is a folder data set")
        self.targets = stimuli.select_targets(self.test, n=min(self.n_images, len(self.test)), seed=self.seed)
        self._leave_out_flat_conditions(self.targets.images.shape[-1])
        self.classes = list(self.test.classes)
        self.labels = self.targets.labels.numpy()
        self.image_ids = self.targets.source_index

    def _leave_out_flat_conditions(self, size: int) -> None:
        """Leave the conditions that turn every image of ``size`` px into one flat grey (high-pass below the resolution,
        :meth:`stimuli.distortions.Distortion.below_resolution`) out of the averages and the ranking, whatever
        ``benchmark_exclusions`` says: there every system answers one class for every image, so any two get an error
        consistency of 1 and the averages of every model pair rise with them."""
        self.below_resolution = [c.name for c in self.conditions if c.below_resolution(size)]
        if self.below_resolution:
            log.warning("left out of the averages and the ranking: %s (flat grey at %d px, below the images' resolution)",
                        ", ".join(self.below_resolution), size)
        left_out = {name for names in self._left_out().values() for name in names}
        if all(c.name in left_out for c in self.conditions):
            raise ValueError(f"every condition ({[c.name for c in self.conditions]}) is left out (model-vs-human's exclusions, or a flat grey "
                             f"image at {size} px): nothing is left to average or rank; add other conditions")

    def _left_out(self) -> dict[str, list[str]]:
        """{generator: [condition, ...]} that the averages and the ranking leave out: the benchmark's exclusions and the flat
        conditions."""
        left_out = {generator: list(names) for generator, names in self.excluded.items()}
        for c in self.conditions:
            if c.name in self.below_resolution and c.name not in left_out.get(c.generator, []):
                left_out.setdefault(c.generator, []).append(c.name)
        return left_out

    def _build_models(self) -> None:
        self.models: dict[str, torch.nn.Module] = {}
        self.weights: dict[str, str] = {}
        self.identities: dict[str, str] = {}  # what a model's cached outputs are keyed by: weights, repr and its entry
        for spec in self.specs:
            model = spec.build(self.dataset)  # zoo model (pretrained too) or factory, as measure builds them
            self.models[spec.label] = model.to(self.device).eval()
            # Refused by its label now, as measure does: met in the first condition, it stopped the run without a name.
            check_model_serves(spec.label, self.models[spec.label], self.targets.images[:2].to(self.device), self.dataset, len(self.classes))
            self.weights[spec.label] = weights_hash(model)
            entry = {"name": spec.name, "factory": spec.factory, "kwargs": dict(spec.kwargs), "checkpoint": spec.checkpoint,
                     "pretrained": spec.pretrained}
            self.identities[spec.label] = module_identity(model, entry)
        self.representations: dict[str, torch.nn.Module] = {}

    def _condition_set(self, distortion: Distortion) -> stimuli.StimulusSet:
        return make_condition_set(
            self.out / "conditions" / distortion.name, distortion, self.targets.images, self.targets.labels, self.image_ids.tolist(),
            classes=self.classes, dataset=self.dataset, split="test", seed=self.seed, batch_size=self.batch_size, device=self.device,
            preview=self.preview, config={"command": "perceptual compare", **self.config},
        )

    def _outputs(self, label: str, set_key: str, images: torch.Tensor, what: str) -> ModelOutputs:
        key = cache_key(self.identities[label], set_key, "penultimate")
        path = self.out / "cache" / "models" / label / f"{_file_name(what)}.safetensors"
        representation = self._representation(label)

        def compute() -> dict[str, torch.Tensor]:
            outputs = model_outputs(self.models[label], images, batch_size=self.batch_size, features=representation is not None,
                                    representation=representation)
            return {name: value for name, value in vars(outputs).items() if value is not None}

        tensors = cached_tensors(path, key, compute)
        return ModelOutputs(tensors["logits"], tensors.get("features"))

    def _representation(self, label: str) -> torch.nn.Module | None:
        """The model's penultimate-layer Representation, built (traced) once; None where the model names no penultimate
        layer (a factory's torchvision or Sequential network): its logits are still compared, CKA and the feature
        scores (Mahalanobis, k-NN, ReAct) do not apply to it."""
        if label not in self.representations:
            from training import Representation

            try:
                self.representations[label] = Representation(self.models[label])
            except ValueError as err:  # compare takes no layer=: the model names its penultimate layer itself
                reason = str(err).split(": pass layer=")[0]
                log.warning("model %r: %s (give it a `penultimate` attribute naming one of training.list_layers(model)); CKA and the unknown "
                            "report's feature scores leave it out", label, reason)
                self.representations[label] = None
        return self.representations[label]

    # -------------------------------------------------------------------------------- behaviour

    def _observe(self) -> tuple[pd.DataFrame, dict[str, dict[str, Responses]]]:
        panel = make_panel(self.observer_spec[0], self.observer_spec[1], self.observer_spec[2], self.device)
        self.decider = ObserverDecisions(panel, self.train.images, self.train.labels, self.train.classes, **self.decision_rule)
        self.panel = panel
        # An observer's distances are keyed by its fingerprint and its exemplars' pixels (not their indices: another
        # copy of a data set under the same name is other data), once per run.
        observer_keys = {o.name: cache_key(o.fingerprint(), tensor_sha256(self.train.images[torch.as_tensor(self.decider.pools[o.name])]))
                         for o in panel}
        tables, responses = [], {}
        bar = tqdm(self.conditions, desc="conditions", unit="condition", disable=not self.progress)
        for distortion in bar:
            bar.set_postfix_str(distortion.name)
            stimulus_set = self._condition_set(distortion)
            images = stimulus_set.images
            per_system: dict[str, Responses] = {}
            for label in self.models:
                outputs = self._outputs(label, stimulus_set.fingerprint, images, f"condition-{distortion.name}")
                # each generator is an experiment, as in the benchmark's trials (its "dataset" column): the ranking nests by it
                tables.append(model_trials(label, outputs.logits, self.labels, self.image_ids, self.classes, distortion.generator, distortion.name))
                features = outputs.features.double().numpy() if outputs.features is not None else None
                per_system[label] = Responses(outputs.logits.argmax(1).numpy(), outputs.logits.double().softmax(1).numpy(), features)
            distances = {}
            for observer in panel:
                key = cache_key(observer_keys[observer.name], getattr(observer, "seed", None), stimulus_set.fingerprint)
                path = self.out / "cache" / "observers" / observer_slug(observer.name) / f"{distortion.name}.safetensors"
                distances[observer.name] = cached_tensors(path, key, lambda o=observer, x=images: {"distances": self.decider.distances(x, o)})["distances"]
            table, probabilities = self.decider.decide(distances, self.image_ids, self.labels, dataset=distortion.generator, condition=distortion.name)
            tables.append(table)
            for subject in self.decider.subject_names:
                answers = table.loc[table["subject"] == subject, "response"].map({c: i for i, c in enumerate(self.classes)}).to_numpy()
                per_system[subject] = Responses(answers, probabilities[subject].double().numpy())
            responses[distortion.name] = per_system
        return pd.concat(tables, ignore_index=True), responses

    def _behaviour(self, trials: pd.DataFrame, responses: Mapping[str, Mapping[str, Responses]]) -> dict:
        models, subjects = list(self.models), self.decider.subject_names
        systems = models + subjects
        per_condition, accuracy = {}, {}
        for name, per_system in tqdm(responses.items(), desc="metrics", unit="condition", disable=not self.progress):
            ordered = {s: per_system[s] for s in systems}
            per_condition[name] = pairwise_matrices(ordered, self.labels, len(self.classes), cles_variant=self.metric_cfg["cles_variant"],
                                                    on_undefined=self.metric_cfg["on_undefined"])
            accuracy[name] = {s: float(np.mean(r.predictions == self.labels)) for s, r in ordered.items()}
        generator_of = {c.name: c.generator for c in self.conditions}
        left_out = self._left_out()
        excluded = {name for names in left_out.values() for name in names}
        ranked = [c for c in per_condition if c not in excluded]
        aggregated = {metric: nested_mean({c: per_condition[c][metric] for c in ranked}, generator_of, nanmean_matrices) for metric in PAIR_METRIC_REGISTRY}
        return {
            "systems": systems, "models": models, "subjects": subjects,
            "accuracy": accuracy,
            "accuracy_mean": {s: float(nested_mean({c: accuracy[c][s] for c in ranked}, generator_of, np.nanmean)) for s in systems},
            "per_condition": per_condition,
            "aggregated": aggregated,
            "excluded": self.excluded,
            "below_resolution": list(self.below_resolution),  # flat grey images: left out too
            "ranked_conditions": ranked,  # what the averages, the ranking and the error alignment take
            "diagonal": {name: metric.diagonal for name, metric in PAIR_METRIC_REGISTRY.items()},
            "ranking": rankings(trials, aggregated, systems, models, subjects, self.metric_cfg["on_undefined"], exclude=left_out),
            "spearman_between_metrics": metric_correlations(aggregated),
        }

    # -------------------------------------------------------------------------------- unknown

    def _ood_images(self, name: str) -> tuple[str, torch.Tensor]:
        """(cache key, [0, 1] images) of one OOD set: noise images or a distortion condition of the test images."""
        n = len(self.targets.images)
        if name in NOISE_SETS:
            kind = name.split(":", 1)[1]
            seed = stable_key("compare-ood", name, self.seed)
            return cache_key(name, seed, n, list(self.targets.images.shape[1:])), noise_images(n, self.targets.images.shape[1:], seed=seed, kind=kind)
        (distortion,) = parse_conditions([name], self.reference_size)  # checked in __init__
        stimulus_set = self._condition_set(distortion)
        return stimulus_set.fingerprint, stimulus_set.images

    def _unknown(self) -> dict:
        cfg = self.unknown_cfg
        ood_names = list(cfg["ood"])
        n_fit = len(self.train) if cfg["n_fit"] is None else min(int(cfg["n_fit"]), len(self.train))
        fit = stimuli.select_targets(self.train, n=n_fit, seed=self.seed + 1)
        # keyed by the pixels and labels: cifar-10-mini and CIFAR-10 share a name and indices
        fit_key = cache_key("fit", tensor_sha256(fit.images), tensor_sha256(fit.labels))
        id_key = cache_key("id", tensor_sha256(self.targets.images), tensor_sha256(self.targets.labels))
        ood = {name: self._ood_images(name) for name in ood_names}
        labels = self.labels
        results: dict[str, dict] = {}
        member_logits: dict[str, list[torch.Tensor]] = {"id": [], **{name: [] for name in ood_names}}
        for label, model in tqdm(self.models.items(), desc="unknown", unit="model", disable=not self.progress):
            fit_outputs = self._outputs(label, fit_key, fit.images, "fit")
            id_outputs = self._outputs(label, id_key, self.targets.images, "id")
            ood_outputs = {name: self._outputs(label, key, images, f"ood-{name}") for name, (key, images) in ood.items()}
            member_logits["id"].append(id_outputs.logits)
            for name in ood_names:
                member_logits[name].append(ood_outputs[name].logits)
            results[label] = {}
            for score_name in cfg["scores"]:
                params = dict((cfg.get("score_params") or {}).get(score_name) or {})
                key = cache_key(self.identities[label], score_name, params, fit_key, id_key, [k for k, _ in ood.values()],
                                *(["v2"] if score_name == "mc_dropout" else []))  # v2: a model's own dropout, none stacked on it
                path = self.out / "cache" / "unknown" / label / f"{score_name}.json"
                cached = cached_json(path, key)
                if cached is None:
                    cached = {"key": key, **self._score_one(score_name, params, model, fit, fit_outputs, id_outputs, ood, ood_outputs, labels)}
                    if not cached.pop("retry", False):  # a failure of this run (out of memory ...) is tried again next time
                        atomic_write_json(path, plain(cached))
                results[label][score_name] = {k: v for k, v in cached.items() if k != "key"}
        if cfg.get("ensemble", True) and len(self.models) >= 2:
            id_scores = DeepEnsemble.from_logits(member_logits["id"])
            ood_scores = {name: DeepEnsemble.from_logits(member_logits[name]).scores for name in ood_names}
            results[f"ensemble({'+'.join(self.models)})"] = {"ensemble": unknown_metrics(id_scores, None, ood_scores, labels)}
        return {"ood_sets": ood_names, "n_fit": n_fit, "n_id": len(labels), "systems": results}

    def _score_one(self, name, params, model, fit, fit_outputs, id_outputs, ood, ood_outputs, labels) -> dict:
        try:
            score = make_score(name, **params)
            score.fit(model, fit.images, fit.labels, batch_size=self.batch_size, outputs=fit_outputs)
            id_scores = score.score(model, self.targets.images, batch_size=self.batch_size, outputs=id_outputs)
            ood_scores = {n: score.score(model, images, batch_size=self.batch_size, outputs=ood_outputs[n]).scores for n, (_, images) in ood.items()}
        except ValueError as err:  # the score does not apply to this model (MC dropout without dropout ...): kept
            return {"error": str(err)}
        except RuntimeError as err:  # e.g. CUDA out of memory: reported now, not cached
            log.warning("unknown score %s failed on this run (not cached): %s", name, err)
            return {"error": str(err), "retry": True}
        return unknown_metrics(id_scores, id_outputs.logits, ood_scores, labels)

    # -------------------------------------------------------------------------------- run

    def run(self) -> dict:
        started = time.perf_counter()
        self._load_data()
        self._build_models()
        trials, responses = self._observe()
        atomic_write_text(self.out / "trials.csv", trials.to_csv(index=False))
        behaviour = self._behaviour(trials, responses)
        data = {
            "data": self.dataset, "n_images": len(self.labels), "seed": self.seed, "classes": self.classes,
            "conditions": [c.name for c in self.conditions],
            # under its own key: the behaviour's "models" (the list of labels, in system order) would overwrite it
            "model_sources": {s.label: {"name": s.name, "factory": s.factory, "checkpoint": s.checkpoint, "weights_sha256": self.weights[s.label]}
                              for s in self.specs},
            "observers": {o.name: getattr(o, "variant", "weight-free") for o in self.panel},
            "decisions": self.decider.describe(),
            "metric_settings": dict(self.metric_cfg),
            **behaviour,
        }
        ranked = {c: behaviour["per_condition"][c] for c in behaviour["ranked_conditions"]}  # as the averages: controls left out
        data["error_alignment"] = write_error_alignment(error_alignment(ranked, behaviour["systems"]), self.out)
        unknown = self._unknown() if self.unknown_cfg.get("enabled", True) else None
        data["seconds"] = round(time.perf_counter() - started, 1)
        write_outputs(data, unknown, self.out, self.conditions, per_condition_figures=bool(self.metric_cfg["per_condition_figures"]))
        data["unknown"] = unknown
        return data


def _pipeline(container: Mapping) -> ComparePipeline:
    specs = [ModelSpec.parse(m) for m in container.get("models") or []]
    return ComparePipeline(
        specs, container["data"], container["out"], conditions=container["conditions"], n_images=container["n_images"],
        seed=container["seed"], device=container["device"], batch_size=container["batch_size"],
        reference_size=container["reference_size"], preview=container["preview"], observers=container["observers"],
        observer_net=container["observer_net"], lpips_weights=container["lpips_weights"], decisions=container["decisions"],
        metrics=container["metrics"], unknown=container["unknown"], progress=container.get("progress", True), config=container,
    )


def human_model_decisions(humans: pd.DataFrame, *, model_trials: Sequence[str] = (), images: str | None = None,
                          specs: Sequence[ModelSpec] = (), image_size: int | None = 224, batch_size: int = 64, device: Any = "cpu",
                          progress: bool = True) -> pd.DataFrame:
    """The models' trials on the human experiments: read from ``model_trials`` CSVs and/or made by the ImageNet ``specs``
    classifying the benchmark's image folders under ``images`` (every human experiment that has a folder there)."""
    if not model_trials and not images:
        raise ValueError("humans= needs the models' decisions on the same images: model_trials=[CSV file or folder, ...] (the benchmark's "
                         "format) or humans_images=PATH (the benchmark's <experiment>/dnn/session-1 or <experiment>/<class> folders) with models=[...]")
    if images and not specs:
        raise ValueError("humans_images= is set but models=[] is empty: name the ImageNet models that classify those images")
    tables = []
    if model_trials:
        tables.append(read_trials([expand_path(p) for p in model_trials])[0])
    if images:
        root = expand_path(images)
        experiments = [e for e in sorted(humans["dataset"].unique()) if has_image_folder(root, e)]
        if not experiments:
            raise FileNotFoundError(f"no image folder <experiment>/dnn/session-1 or <experiment>/<class> under {root} for any human "
                                    f"experiment ({sorted(humans['dataset'].unique())})")
        without_images = sorted(set(humans["dataset"]) - set(experiments))
        if without_images:
            log.warning("humans_images=%s has no image folder for the human experiment(s) %s: the models are compared on %s only",
                        root, without_images, experiments)
        device = resolve_device(device)
        for spec in specs:
            model = spec.build("imagenet").to(device).eval()  # a zoo name or a factory, as the panel run builds it
            for experiment in tqdm(experiments, desc=f"{spec.label}: image folders", unit="experiment", disable=not progress):
                tables.append(classify_image_folder(model, root, experiment, subject=spec.label, batch_size=batch_size, size=image_size,
                                                    device=device))
    return pd.concat(tables, ignore_index=True)


def run_with_humans(container: Mapping) -> dict:
    """``compare humans=PATH``: the models against the benchmark's human trials (module docstring), written to ``out/humans``."""
    from ..mvh_analysis import accuracy_per_subject
    from ..mvh_figures import accuracy_figure

    started = time.perf_counter()
    metric_cfg = {"cles_variant": "paper", "on_undefined": "nan", **dict(container.get("metrics") or {})}
    specs = [ModelSpec.parse(m) for m in container.get("models") or []]
    ModelSpec.check_unique(specs)  # checkpoints are all model.safetensors: unlabelled, two would classify into one subject
    with_panel = bool(container.get("humans_with_panel", False))
    if specs and not container.get("humans_images") and not with_panel:
        raise ValueError("models= are given but neither humans_images=PATH (to classify the benchmark's images) nor humans_with_panel=true "
                         "(to run them on the simulated panel): say what they are for")
    panel = _pipeline(container) if with_panel else None  # checks the panel's settings before any work
    humans, report = read_trials(expand_path(container["humans"]), experiments=container.get("humans_experiments"))
    models = human_model_decisions(
        humans, model_trials=list(container.get("model_trials") or []), images=container.get("humans_images"),
        specs=specs if container.get("humans_images") else (), image_size=container.get("humans_image_size", 224),
        batch_size=container["batch_size"], device=container["device"], progress=container.get("progress", True))
    out = Path(container["out"]) / "humans"
    if container.get("humans_images"):  # the decisions made here, in the benchmark's format: for model_trials= or its own code
        for (experiment, model), table in models.groupby(["dataset", "subject"]):
            write_trials(table, out / "decisions" / experiment / f"{experiment}_{model}_session_1.csv")
    trials = labelled_trials(humans, models)
    exclude = mvh_exclusions(zip(trials["dataset"], trials["condition"])) if container.get("humans_benchmark_exclusions", True) else None
    data = compare_on_trials(trials, cles_variant=metric_cfg["cles_variant"], on_undefined=metric_cfg["on_undefined"], exclude=exclude)
    data["reader"] = report.as_dict()
    ranked = {cell: data["per_condition"][cell] for cell in data["ranked_conditions"]}  # as the ranking: exclusions left out
    data["error_alignment"] = write_error_alignment(error_alignment(ranked, data["systems"]), out)
    atomic_write_text(out / "trials.csv", trials.to_csv(index=False))
    figures_dir, figures = out / "figures", []
    ranges = {name: metric.value_range for name, metric in PAIR_METRIC_REGISTRY.items()}
    for metric, matrix in data["aggregated"].items():
        lo, hi = ranges[metric]
        figures.append(heatmap(matrix, data["systems"], figures_dir / f"heatmap_{metric}.png", f"{metric}: humans and models (mean over conditions)",
                               vmin=lo, vmax=hi))
    spearman = data["spearman_between_metrics"]
    figures.append(heatmap(spearman["rho"], spearman["metrics"], figures_dir / "spearman_between_metrics.png",
                           "Spearman's rho between metrics over system pairs (humans and models)", vmin=-1, vmax=1, cmap="coolwarm",
                           axis_label="metric"))
    figures.append(accuracy_figure(accuracy_per_subject(trials, humans=data["subjects"]), figures_dir / "accuracy.png",
                                   "Accuracy against condition (humans: band; models: lines)"))
    data["figures"] = [f.relative_to(out).as_posix() for f in figures]
    data["seconds"] = round(time.perf_counter() - started, 1)
    atomic_write_json(out / "metrics.json", plain(data))
    atomic_write_text(out / "summary.md", human_summary_markdown(data, data["figures"]))
    result = {"humans": data, "panel": None}
    if panel is not None:
        result["panel"] = panel.run()
        summary = Path(container["out"]) / "summary.md"
        atomic_write_text(summary, summary.read_text() + "\n## Real human trials\n\nThe same report with the model-vs-human benchmark's human "
                          "trials as the humans (rows `human:subject-NN`): [humans/summary.md](humans/summary.md).\n")
    return result


def run(cfg: DictConfig | Mapping) -> dict:
    """The compare pipeline from a composed ``conf/compare.yaml``: the panel run, or with ``humans=`` :func:`run_with_humans`."""
    container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    if container.get("humans"):
        return run_with_humans(container)
    for key in ("model_trials", "humans_images"):
        if container.get(key):
            raise ValueError(f"{key}= is only used with humans=PATH (the benchmark's human trials); set humans= or drop {key}=")
    return _pipeline(container).run()


def _print_models(data: Mapping, against: str) -> None:
    ranking = data["ranking"]
    for model in data["models"]:
        values = ranking["values"][model]
        print(f"{model:>20}: accuracy {data['accuracy_mean'][model]:.3f}, error consistency with the {against} "
              f"{_fmt(values['error_consistency'])}, mean rank {_fmt(ranking['mean_rank_mvh'][model], 2)}")


@hydra.main(config_path="pkg://conf", config_name="compare", version_base=None)
@concise_errors
def main(cfg: DictConfig) -> None:
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    cfg.out = str(job_path(cfg.out))  # a multirun's jobs report in folders of their own
    data = run(cfg)
    if cfg.get("humans"):
        humans = data["humans"]
        ids = humans["subjects"]
        print(f"against the benchmark's human trials ({len(humans['experiments'])} experiments, subject ids {ids[0]}..{ids[-1]}):")
        _print_models(humans, "humans")
        among = humans["ranking"]["observers_among_themselves"]["error_consistency"]
        print(f"{'humans (pairs)':>20}: error consistency {_fmt(among)}")
        print(f"report: {(Path(cfg.out) / 'humans' / 'summary.md').resolve()}  ({humans['seconds']:.0f} s)")
        if data["panel"] is None:
            return
        data = data["panel"]
        print("against the simulated observer panel:")
    _print_models(data, "observers")
    print(f"report: {(Path(cfg.out) / 'summary.md').resolve()}  ({data['seconds']:.0f} s)")


__all__ = ["ComparePipeline", "NOISE_SETS", "human_model_decisions", "main", "run", "run_with_humans"]
