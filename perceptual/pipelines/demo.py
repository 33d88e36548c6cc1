"""``python -m perceptual demo`` (``make demo``): the main job end to end, offline, on the embedded digits.

1. Train a small standard CNN and a small L2-PGD-robust CNN on scikit-learn's digits with the same
   schedule (``training``; run directories under ``<out>/runs``, resumed when they exist).
2. Measure both (``perceptual.measure``): inversion sets from noise and training-image seeds,
   clean and robust accuracy, the observer panel on 2AFC, clustering and hard clustering.
3. Controversial stimuli for the pair, in both directions, scored by perceptual spread.
4. Write the report (``<out>/report``) and print the headline table and where it is.

Without the LPIPS AlexNet weights in the torch hub cache the panel says so and uses the labelled
offline LPIPS variants plus the weight-free observers; with them it uses LPIPS AlexNet.
Every stage is cached, so a second run only rewrites the report.
"""
from __future__ import annotations

import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from training.config import as_list, concise_errors, expand_path_options, resolve_device
from training.sweeps import job_path

from ..convergence import convergence_sentence
from ..measure import TASKS, ModelSpec, controversial_scores, headline, make_panel, measure_models, threat_from_config, validate_inputs
from ..observers import lpips_weights_available
from ..report import format_number
from ._references import pair_configs, train_pair
from .measure import check_convergence


def run(cfg: DictConfig) -> dict:
    started = time.perf_counter()
    out = Path(cfg.out)
    container = OmegaConf.to_container(cfg, resolve=True)
    # Everything is checked before the first model trains: a misspelt key costs seconds, not minutes.
    controversial = {"model_a": "standard", "model_b": "robust", **container["controversial"]}
    validate_inputs([ModelSpec(cfg.model, None, label) for label in ("standard", "robust")], n_targets=cfg.n_targets,
                    seed_types=as_list(cfg.seed_types, "seed_types"), tasks=TASKS, engine=container["invert"], controversial=controversial,
                    noise_kind=cfg.noise_kind, accuracy_limit=cfg.accuracy_limit, convergence_threshold=cfg.convergence_threshold, seed=cfg.seed)
    threat = threat_from_config(container["threat"])
    configs = pair_configs(cfg, out / "runs")
    panel = make_panel("auto", cfg.observer_net, device=resolve_device(cfg.device))  # where measure_models will run
    if not lpips_weights_available(cfg.observer_net):
        print(
            "LPIPS AlexNet weights are not in the torch hub cache: the panel uses the labelled offline variants "
            "(random backbone with real heads; no heads) and the weight-free observers (SSIM, MS-SSIM, pixel L2)."
        )
    weights = train_pair(configs)
    specs = [ModelSpec(cfg.model, str(path), label, kwargs=dict(cfg.model_kwargs)) for label, path in weights.items()]
    data = measure_models(
        specs,
        container["data"],
        out / "report",
        engine=container["invert"],
        n_targets=cfg.n_targets,
        seed_types=as_list(cfg.seed_types, "seed_types"),
        noise_kind=cfg.noise_kind,
        seed=cfg.seed,
        panel=panel,
        threat=threat,
        accuracy_limit=cfg.accuracy_limit,
        controversial=controversial,
        device=cfg.device,
        config=container,
        convergence_threshold=float(cfg.convergence_threshold),
        converged_only=bool(cfg.converged_only),
    )
    print()
    print(headline(data))
    for line in controversial_lines(data.get("controversial") or {}):
        print(line)
    for label, result in data["models"].items():
        print(convergence_sentence(label, result["convergence"]))
    print(f"\nreport: {(out / 'report' / 'report.md').resolve()}  ({time.perf_counter() - started:.0f} s)")
    check_convergence(data, strict=bool(cfg.strict))
    return data


def controversial_lines(c: dict) -> list[str]:
    """The demo's lines on its controversial stimuli: the Table 2 score per direction and the verdict, or for
    class-controversial stimuli which model's decisions each observer shares."""
    if "per_observer" in c:
        lines = []
        for direction, scores in controversial_scores(c).items():
            spreads = ", ".join(f"{o} {format_number(v)}" for o, v in scores.items())
            lines.append(f"controversial (Table 2 score), {c['directions'][direction]}: {spreads}")
        return lines + [f"controversial: {c['verdict']}"]
    return [f"class-controversial:\n{c['verdict']}"] if c.get("verdict") else []


@hydra.main(config_path="pkg://conf", config_name="demo", version_base=None)
@concise_errors
def main(cfg: DictConfig) -> None:
    expand_path_options(cfg)  # out='~/x', $VARS: before any path is used
    cfg.out = str(job_path(cfg.out))  # a multirun's jobs report in folders of their own
    run(cfg)
