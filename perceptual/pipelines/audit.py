"""``python -m perceptual audit``: an automated audit of an adversarial defence (issue 16; Nanda et al., AAAI 2023,
Sec. 3.2 and Fig. 4: poorly aligned defences such as k-WTA were later broken by stronger attacks).

Stages, each cached in ``out`` so that an interrupted audit resumes and a repeated one recomputes nothing:

1. Checks before any long work: the defence builds (zoo name or ``module:function`` factory), maps [0, 1]
   images to logits of the data set's classes (not probabilities), classifies the audited images above chance
   (rule 0 of the decision rule; ``allow_chance_accuracy=true`` goes on anyway), its representation layer can be traced
   (for the alignment), the ``bpda`` submodule exists; a randomised forward pass without ``eot`` is a warning
   stated in the report.
2. Reference models: ``reference.standard`` and ``reference.robust`` as given, or a standard and a PGD model
   trained here with the toolkit's recipes (``references``), cached in ``reference_dir`` (default
   ``<out>/../references/<data>-<model>-<hash>``) for the audits of other defences.
3. Attacks (:func:`perceptual.audit.audit_robustness`): FGSM, PGD, APGD-CE, APGD-T, Square, the transfer attack from
   the robust reference; the per-sample worst case; the eps sweep; the masking checks (``out/cache/defence``).
   The references are attacked the same way for their robust accuracy (``out/cache/<label>``).
4. Alignment (:func:`perceptual.measure.measure_models` in ``out/alignment``): 2AFC, clustering and hard clustering
   for the defence and both references, controversial stimuli of the defence against the robust reference.
5. The verdict (:data:`perceptual.audit.DECISION_RULE`) and the report: ``audit.json`` (every number), ``audit.md`` and
   ``audit.html`` (verdict first), ``accuracy_vs_eps.png``, ``alignment_vs_robust_*.png``, ``masking_checks.png``,
   ``accuracy_per_attack.png``.
"""
from __future__ import annotations

import logging
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from training import Representation
from training.attacks import ThreatModel, config_number
from training.config import as_list, concise_errors, dataset_from_config, expand_path, expand_path_options, resolve_device
from training.data import NUM_CLASSES
from training.io import atomic_write_json, atomic_write_text
from training.models.defences import load_factory  # noqa: F401  (re-exported: the factory loader the audit documents)
from training.sweeps import job_path

from ..audit import (
    alignment_position,
    audit_robustness,
    chance_message,
    check_budgets,
    check_classifier,
    check_eps_values,
    check_smoothing,
    clean_predictions,
    controversial_summary,
    is_above_chance,
    is_flagged,
    is_randomised,
    randomness_warning,
    reference_accuracy,
    references_ordered,
    verdict,
)
from ..audit_report import accuracy_bars_figure, accuracy_vs_eps_figure, alignment_figures, audit_html, audit_markdown, masking_checks_figure
from ..cache import cache_key, module_identity
from ..measure import ModelSpec, controversial_scores, make_panel, measure_models, validate_inputs
from ..report import plain
from ._references import pair_configs, pair_key, train_pair

log = logging.getLogger(__name__)

ALIGNMENT_TASKS = ("2afc", "clustering", "clustering_hard")


def model_spec(node: DictConfig, label: str, what: str) -> ModelSpec:
    """A ModelSpec from a ``{name | factory, checkpoint, kwargs, layer, trust_pickle, fake_relu, pretrained}`` config
    node, with errors that name the node: an unknown key (``+defence.trust_pikle=true``) is refused, not ignored."""
    values = {key: value for key, value in OmegaConf.to_container(node, resolve=True).items() if value is not None}
    unknown = sorted(set(values) - set(ModelSpec.KEYS))
    if unknown:
        raise ValueError(f"{what} has unknown keys {unknown}: it takes {', '.join(ModelSpec.KEYS)}")
    if bool(values.get("name")) == bool(values.get("factory")):
        raise ValueError(f"give exactly one of {what}.name (a zoo model) or {what}.factory (module:function)")
    if values.setdefault("label", label) != label:
        raise ValueError(f"{what}.label={values['label']!r}: this command labels it {label!r}; leave {what}.label out")
    checkpoint = values.get("checkpoint")
    path = expand_path(checkpoint)  # '$RUNS/x.safetensors' as ModelSpec and measure read it
    if checkpoint and not path.is_file():
        raise FileNotFoundError(f"{what}.checkpoint not found: {checkpoint} ({path})")
    try:
        return ModelSpec(**{**values, "kwargs": dict(values.get("kwargs") or {})})
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from err


def scoring_model_spec(node: DictConfig, command: str) -> ModelSpec:
    """The ``model`` node of a command that scores with the penultimate layer (``visalign``, ``unknown``: Mahalanobis
    and k-NN on its features, ReAct through the final layer), so ``model.layer`` is refused rather than ignored."""
    spec = model_spec(node, "model", "model")
    if spec.layer:
        raise ValueError(f"model.layer={spec.layer!r}: {command} scores with the penultimate layer's features (Mahalanobis, k-NN, "
                         "ReAct applies the final layer to them); drop model.layer")
    return spec


def load_defence(spec: ModelSpec | DictConfig, dataset: str, what: str = "defence") -> torch.nn.Module:
    """Build a model from its spec (or a ``{name | factory, checkpoint, kwargs}`` config node), naming the config
    node in the error when the build fails. Also the model loader of ``visalign`` and ``unknown``."""
    if not isinstance(spec, ModelSpec):
        spec = model_spec(spec, what, what)
    try:
        return spec.build(dataset)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{what}: {err}") from err


def given_references(cfg: DictConfig) -> dict[str, ModelSpec] | None:
    """``reference.standard`` and ``reference.robust`` as specs, None when neither is given (then they are trained)."""
    nodes = {label: cfg.reference[label] for label in ("standard", "robust")}
    given = {label: bool(node.get("name") or node.get("factory")) for label, node in nodes.items()}
    if not any(given.values()):
        return None
    if not all(given.values()):
        missing = [label for label, ok in given.items() if not ok]
        raise ValueError(f"reference.{missing[0]} is not given: give both reference.standard and reference.robust, or neither (then both "
                         "are trained here from `references`)")
    return {label: model_spec(node, label, f"reference.{label}") for label, node in nodes.items()}


def reference_folder(cfg: DictConfig) -> Path:
    """Where references trained here live: ``reference_dir`` or ``<out>/../references``, one folder per setup."""
    base = Path(cfg.reference_dir) if cfg.get("reference_dir") else Path(cfg.out).parent / "references"
    return base / pair_key(_pair_setup(cfg))


def _pair_setup(cfg: DictConfig) -> DictConfig:
    return OmegaConf.create({**OmegaConf.to_container(cfg.references, resolve=True), "data": OmegaConf.to_container(cfg.data, resolve=True),
                             "device": str(cfg.device)})


def train_references(cfg: DictConfig) -> dict[str, ModelSpec]:
    """Train (or reuse) the standard and the PGD reference with the toolkit's recipes."""
    setup = _pair_setup(cfg)
    weights = train_pair(pair_configs(setup, reference_folder(cfg) / "runs"))
    kwargs = dict(setup.model_kwargs)
    return {label: ModelSpec(name=setup.model, checkpoint=str(path), label=label, kwargs=kwargs) for label, path in weights.items()}


def _build_settings(spec: ModelSpec) -> dict:
    """What builds a model: part of its cache keys beside its weights and repr."""
    return {"name": spec.name, "factory": spec.factory, "kwargs": spec.kwargs, "checkpoint": spec.checkpoint, "pretrained": spec.pretrained}


def _check_alignment_inputs(cfg: DictConfig, specs: list[ModelSpec], defence: torch.nn.Module) -> dict:
    controversial = {"model_a": specs[0].label, "model_b": "robust", **OmegaConf.to_container(cfg.alignment.controversial, resolve=True)}
    validate_inputs(specs, n_targets=int(cfg.alignment.n_targets), seed_types=as_list(cfg.alignment.seed_types, "alignment.seed_types"), tasks=ALIGNMENT_TASKS,
                    engine=OmegaConf.to_container(cfg.invert, resolve=True), controversial=controversial, seed=cfg.seed)
    try:
        Representation(defence, layer=specs[0].layer)
    except Exception as err:
        raise ValueError(f"the alignment needs the defence's representation: {err}. Set defence.layer to one of its layers "
                         "(training.list_layers(model)), or alignment.enabled=false for an attack-only audit") from err
    return controversial


# eps_sweep=null: these multiples of threat.eps, for any norm (8/255 gives the 2/255, 4/255, 16/255 of Nanda et al.'s figure)
SWEEP_FACTORS = (0.25, 0.5, 2.0)


def sweep_eps(given, eps: float) -> list[float]:
    """The extra eps every attack also runs at: ``given`` (``[]``: none), or :data:`SWEEP_FACTORS` times ``eps`` where it
    is null, so that an L2 audit does not run three suites at Linf-sized radii far below its eps."""
    if given is None:
        return [factor * eps for factor in SWEEP_FACTORS]
    return [config_number(e, "eps_sweep") for e in given]


def run(cfg: DictConfig) -> dict:
    out = Path(cfg.out)
    device = resolve_device(cfg.device)
    dataset = cfg.data.name
    norm, eps = cfg.threat.norm, config_number(cfg.threat.eps, "threat.eps")
    ThreatModel(norm, eps, steps=int(cfg.threat.steps))  # a bad norm or eps is named now
    sweep = sweep_eps(cfg.get("eps_sweep"), eps)
    masking_eps = [config_number(e, "masking_eps") for e in cfg.masking_eps] if cfg.get("masking_eps") else None
    check_eps_values(norm, eps, eps_sweep=sweep, masking_eps=masking_eps or [])
    smoothing_sigma = config_number(cfg.smoothing.sigma, "smoothing.sigma")
    check_smoothing(int(cfg.smoothing.samples), smoothing_sigma)
    check_budgets(eot=cfg.eot, n_targets=cfg.n_targets, square_queries=cfg.square_queries, **{"threat.steps": cfg.threat.steps},
                  unbounded_steps=cfg.unbounded_steps, n_images=cfg.n_images)

    # 1. Everything that can be wrong is checked before the first model trains or the first attack runs.
    defence_spec = model_spec(cfg.defence, cfg.defence.get("label") or "defence", "defence")
    if defence_spec.label in ("standard", "robust"):
        raise ValueError(f"defence.label={defence_spec.label!r} is a reference's label: choose another")
    references = given_references(cfg)
    test = dataset_from_config(cfg.data, "test")
    n = min(int(cfg.n_images), len(test))
    x, y = test.float_images(slice(0, n), device=device), test.labels[:n].to(device)
    torch.manual_seed(int(cfg.seed))  # a factory that initialises weights randomly builds the same model on a rerun
    defence = load_defence(defence_spec, dataset).to(device).eval()
    defence_spec.module = defence  # the alignment measures this very object, not a second build of the factory
    check_classifier(defence, x[:8], NUM_CLASSES.get(dataset))
    randomised = is_randomised(defence, x[:8])
    answers = clean_predictions(defence, x, int(cfg.eot) if randomised else 1, seed=int(cfg.seed))  # as audit_robustness predicts
    if not is_above_chance(answers, y) and not cfg.allow_chance_accuracy:  # rule 0: before references train and attacks run
        raise ValueError(f"{chance_message(answers, y)}. allow_chance_accuracy=true audits it anyway (verdict: no verdict, flagged)")
    warnings = [w for w in [randomness_warning(randomised, int(cfg.eot))] if w]  # audit_robustness logs them
    if cfg.bpda and cfg.bpda not in dict(defence.named_modules()):
        names = [name for name, _ in defence.named_modules() if name][:12]
        raise ValueError(f"bpda={cfg.bpda!r} is not a submodule of the defence; its submodules include {names}")
    alignment_on = bool(cfg.alignment.enabled)
    if alignment_on:
        placeholder = [ModelSpec(name="small_cnn", label=label) for label in ("standard", "robust")]
        controversial = _check_alignment_inputs(cfg, [defence_spec, *(references.values() if references else placeholder)], defence)
        # a misspelt observer or a missing weights file is named now
        panel = make_panel(cfg.alignment.observers, cfg.alignment.observer_net, cfg.alignment.get("lpips_weights"), device=device)

    # 2. Reference models (trained here and cached when not given).
    if references is None:
        references = train_references(cfg)
        sources = {label: f"trained here with the {recipe} recipe ({spec.name}, {spec.checkpoint})"
                   for (label, spec), recipe in zip(references.items(), ("standard", "pgd"))}
    else:
        sources = {label: f"given: {spec.name or spec.factory} ({spec.checkpoint or 'no checkpoint'})" for label, spec in references.items()}
    reference_models = {label: load_defence(spec, dataset, f"reference.{label}").to(device).eval() for label, spec in references.items()}
    for label, model in reference_models.items():
        references[label].module = model
    for model in reference_models.values():
        check_classifier(model, x[:8], NUM_CLASSES.get(dataset))

    # 3. Attacks.
    settings = dict(steps=int(cfg.threat.steps), square_queries=int(cfg.square_queries), n_targets=int(cfg.n_targets), seed=int(cfg.seed),
                    smoothing_samples=int(cfg.smoothing.samples),
                    smoothing_sigma=smoothing_sigma)
    # Each model's build settings are part of its cache keys: a factory's kwargs need not show in its weights or its repr
    # (a reference's too: one rebuilt with other kwargs kept its old attack results).
    defence_identity = module_identity(defence, OmegaConf.to_container(cfg.defence, resolve=True))
    reference_identities = {label: module_identity(model, _build_settings(references[label])) for label, model in reference_models.items()}
    audit = audit_robustness(defence, x, y, norm, eps, eot_samples=int(cfg.eot), reference=reference_models["robust"], bpda=cfg.bpda or None,
                             sweep_eps=sweep, masking_eps=masking_eps, unbounded_steps=int(cfg.unbounded_steps), cache_dir=out / "cache" / "defence",
                             identity=defence_identity, reference_identity=reference_identities["robust"], **settings)
    log.info("%s: worst-case accuracy %.1f%% (%s eps %.4g, %d images)", defence_spec.label, 100 * audit.accuracy["worst_case"], norm, eps, n)
    reference_robust = {label: reference_accuracy(model, x, y, norm, eps, cache_dir=out / "cache" / label, identity=reference_identities[label],
                                                  **settings)
                        for label, model in reference_models.items()}

    # 4. Alignment.
    alignment: dict = {"note": "not measured (alignment.enabled=false)"}
    position = controversial_text = None
    if alignment_on:
        specs = [defence_spec, references["standard"], references["robust"]]
        engine = OmegaConf.to_container(cfg.invert, resolve=True)
        # One folder per alignment setting: a rerun with other settings measures afresh instead of refusing the old sets. In it,
        # the references' sets are shared; the defence's sets and the report (its controversial sets too) sit in a folder per
        # defence identity, since a set's fingerprint holds weights only and a changed factory setting must not reuse them.
        alignment_dir = out / "alignment" / cache_key(OmegaConf.to_container(cfg.alignment, resolve=True), engine, int(cfg.seed))[:10]
        report_dir = alignment_dir / f"{defence_spec.label}-{defence_identity[:10]}"
        data = measure_models(specs, OmegaConf.to_container(cfg.data, resolve=True), report_dir, engine=engine,
                              n_targets=int(cfg.alignment.n_targets), seed_types=as_list(cfg.alignment.seed_types, "alignment.seed_types"), seed=int(cfg.seed),
                              panel=panel, threat=None, accuracy_limit=n,
                              controversial=controversial, device=device, config={"alignment": OmegaConf.to_container(cfg.alignment, resolve=True)},
                              model_dirs={label: alignment_dir / "models" / label for label in ("standard", "robust")})
        robust_of = {defence_spec.label: audit.accuracy["worst_case"], **{label: r["worst_case"] for label, r in reference_robust.items()}}
        models = {label: {**{t: result.get(t) for t in ALIGNMENT_TASKS}, "clean_accuracy": result["clean_accuracy"], "robust_accuracy": robust_of[label],
                          "converged": result["converged"]} for label, result in data["models"].items()}
        means = {label: {t: models[label][t]["mean"] for t in ALIGNMENT_TASKS if models[label].get(t)} for label in models}
        position = alignment_position(means[defence_spec.label], means["standard"], means["robust"])
        if not references_ordered(means["standard"], means["robust"]):
            warnings.append("the robust reference is not more aligned than the standard one (" + ", ".join(
                f"{t} {means['robust'][t]:.2f} vs {means['standard'][t]:.2f}" for t in means["standard"] if t in means["robust"])
                + "): the alignment gives no position and cannot flag the defence; train the references longer "
                "(references.schedule.epochs) or give your own (reference.standard, reference.robust)")
        alignment = {"models": models, "position": position, "report": str((report_dir / "report.md").resolve()),
                     "converged": {label: bool(m["converged"]) for label, m in models.items()}}
        if "controversial" in data:
            c = data["controversial"]
            controversial_text = controversial_summary(c)
            class_level = c.get("objective") == "class_controversial"
            evidence = ({key: c.get(key) for key in ("observers", "n_controversial")} if class_level
                        else {"directions": c["directions"], "scores": controversial_scores(c), "favoured_by_observer": c["favoured_by_observer"]})
            alignment["controversial"] = {"objective": c.get("objective", "controversial"), "model_a": c["model_a"], "model_b": c["model_b"],
                                          **evidence, "verdict": c["verdict"], "summary": controversial_text}

    # 5. Verdict and report.
    text = verdict(audit, position, controversial_text)
    evidence = audit.to_dict()
    report = {
        "verdict": text,
        "flagged": is_flagged(text),
        "defence_name": defence_spec.name or defence_spec.factory,
        "warnings": warnings + [w for w in audit.warnings if w not in warnings],
        "robustness": evidence,
        "references": {label: {"source": sources[label], "robustness": reference_robust[label]} for label in references},
        "alignment": alignment,
        "figures": [],
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    atomic_write_json(out / "audit.json", plain(report))  # first: a figure that fails to draw loses no number
    figures = [accuracy_vs_eps_figure(evidence, out / "accuracy_vs_eps.png"), masking_checks_figure(evidence["checks"], out / "masking_checks.png"),
               accuracy_bars_figure(evidence, out / "accuracy_per_attack.png")]
    if alignment_on:
        figures += alignment_figures(alignment["models"], out)
    for stale in out.glob("alignment_vs_robust_*.png"):  # an earlier audit's, where this one draws none
        if stale not in figures:
            stale.unlink()
    report["figures"] = [f.name for f in figures]
    atomic_write_json(out / "audit.json", plain(report))  # NaN (one observer's std) as null: strict JSON readers refuse NaN
    atomic_write_text(out / "audit.md", audit_markdown(report))
    atomic_write_text(out / "audit.html", audit_html(report))
    return {"verdict": text, "flagged": report["flagged"], "out": str(out)}


@hydra.main(config_path="pkg://conf", config_name="audit", version_base=None)
@concise_errors
def main(cfg: DictConfig) -> None:
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    if not cfg.get("reference_dir"):  # a multirun's jobs share the references trained beside the sweep's out
        cfg.reference_dir = str(Path(cfg.out).parent / "references")
    cfg.out = str(job_path(cfg.out))  # and report in folders of their own
    result = run(cfg)
    print(f"verdict: {result['verdict']}\nreport: {result['out']}/audit.md (and audit.html)")


if __name__ == "__main__":
    main()
