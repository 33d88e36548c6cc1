"""``python -m perceptual measure``: observer alignment of models (Nanda et al., AAAI 2023, Table 1), from a Hydra
config (``conf/measure.yaml``). The work is :func:`perceptual.measure.measure_models`; this module checks the
config, builds the panel and prints the table."""
from __future__ import annotations

import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from training.config import as_list, concise_errors, expand_path_options, resolve_device
from training.sweeps import job_path

from ..convergence import convergence_sentence
from ..measure import ModelSpec, headline, make_panel, measure_models, threat_from_config, validate_inputs


def run(cfg: DictConfig) -> dict:
    specs = [ModelSpec.parse(m) for m in as_list(cfg.models, "models") or []]  # models=foo is one entry, not three
    seed_types, tasks = as_list(cfg.seed_types, "seed_types"), as_list(cfg.tasks, "tasks")  # seed_types=noise is one
    container = OmegaConf.to_container(cfg, resolve=True)
    validate_inputs(specs, n_targets=cfg.n_targets, seed_types=seed_types, tasks=tasks, engine=container["invert"],
                    controversial=container.get("controversial"), noise_kind=cfg.noise_kind, chunk_size=cfg.chunk_size,
                    accuracy_limit=cfg.accuracy_limit, convergence_threshold=cfg.convergence_threshold, attention_rate=cfg.attention_rate,
                    gaussian_targets=container.get("gaussian_targets"), seed=cfg.seed)
    threat_from_config(container.get("threat"))
    panel = make_panel(cfg.observers, cfg.observer_net, cfg.lpips_weights, resolve_device(cfg.device))
    return measure_models(
        specs, container["data"], cfg.out, engine=container["invert"], n_targets=cfg.n_targets, seed_types=seed_types,
        noise_kind=cfg.noise_kind, seed=cfg.seed, panel=panel, tasks=tasks, attention_rate=cfg.attention_rate, judge_8bit=cfg.judge_8bit,
        threat=threat_from_config(container.get("threat")), accuracy_limit=cfg.accuracy_limit,
        controversial=container.get("controversial"), device=cfg.device, config=container,
        convergence_threshold=float(cfg.convergence_threshold), converged_only=bool(cfg.converged_only),
        gaussian_targets=container.get("gaussian_targets"), chunk_size=cfg.chunk_size,
    )


@hydra.main(config_path="pkg://conf", config_name="measure", version_base=None)
@concise_errors
def main(cfg: DictConfig) -> None:
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    cfg.out = str(job_path(cfg.out))  # a multirun's jobs report in folders of their own
    data = run(cfg)
    print(headline(data))
    print(f"report: {Path(cfg.out).resolve() / 'report.md'}")
    check_convergence(data, strict=bool(cfg.strict))


def check_convergence(data: dict, strict: bool = False) -> None:
    """Warn (or, with ``strict``, exit with an error) when a model's inversions did not converge."""
    if not data.get("not_converged"):
        return
    lines = [convergence_sentence(label, data["models"][label]["convergence"]) for label in data["not_converged"]]
    message = "inversions did not converge:\n  " + "\n  ".join(lines)
    if strict:
        raise SystemExit(f"error (strict=true): {message}")
    warnings.warn(message, stacklevel=2)


__all__ = ["check_convergence", "main", "run"]
