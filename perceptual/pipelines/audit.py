"""``python -m perceptual audit``: attack a defence with FGSM, PGD, APGD-CE, APGD-T, Square and (with a
reference model) a transfer attack, run the masking checks and write ``audit.json``, ``audit.md`` and a
figure of the accuracy per attack into ``out`` (see :mod:`perceptual.audit` for the decision rule).

Not yet here (issue 16): reference models trained on the spot, the alignment measurement (pass the
position to :func:`perceptual.audit.verdict` from a ``measure`` run), audit.html, the eps sweep figure, resume.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from training import build_model, load_dataset
from training.attacks import config_number
from training.checkpoints import read_checkpoint
from training.io import atomic_write_json, atomic_write_text

from ..audit import audit_markdown, audit_robustness, verdict
from ..report import save_figure


def load_factory(path: str, what: str = "defence"):
    """``module:function`` -> the function, with a clear error when it does not import (``what``: the config node)."""
    module_name, sep, attr = str(path).partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what}.factory must be 'module:function', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{what}.factory {path!r}: module {module_name!r} does not import ({err}); is it on PYTHONPATH?") from err
    if not hasattr(module, attr):
        raise ValueError(f"{what}.factory {path!r}: {module_name} has no attribute {attr!r}")
    return getattr(module, attr)


def load_defence(spec: DictConfig, dataset: str, what: str = "defence") -> torch.nn.Module:
    """A model from a config node: a zoo ``name`` (+ ``checkpoint``) or a ``factory`` (``module:function``), with ``kwargs``."""
    if bool(spec.get("name")) == bool(spec.get("factory")):
        raise ValueError(f"give exactly one of {what}.name (a zoo model) or {what}.factory (module:function)")
    kwargs = OmegaConf.to_container(spec.kwargs, resolve=True) if spec.get("kwargs") else {}
    if spec.get("name"):
        return build_model(spec.name, dataset, checkpoint=spec.get("checkpoint"), **kwargs)
    model = load_factory(spec.factory, what)(**kwargs)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{what}.factory {spec.factory!r} returned {type(model).__name__}, not a torch.nn.Module")
    if spec.get("checkpoint"):
        state, _ = read_checkpoint(spec.checkpoint)
        model.load_state_dict(state)
    return model


def run(cfg: DictConfig) -> dict:
    dataset = cfg.data.name
    defence = load_defence(cfg.defence, dataset).to(cfg.device).eval()
    wanted = cfg.get("reference") and (cfg.reference.get("name") or cfg.reference.get("factory"))
    reference = load_defence(cfg.reference, dataset).to(cfg.device).eval() if wanted else None
    test = load_dataset(dataset, "test", root=cfg.data.get("root"))
    n = min(int(cfg.n_images), len(test))
    x, y = test.float_images(slice(0, n), device=cfg.device), test.labels[:n].to(cfg.device)
    audit = audit_robustness(defence, x, y, cfg.threat.norm, config_number(cfg.threat.eps, "threat.eps"), steps=int(cfg.threat.steps),
                             square_queries=int(cfg.square_queries), n_targets=int(cfg.n_targets), eot_samples=int(cfg.eot),
                             reference=reference, seed=int(cfg.seed))
    text = verdict(audit)
    out = Path(cfg.out)
    atomic_write_json(out / "audit.json", {"verdict": text, **audit.to_dict(), "config": OmegaConf.to_container(cfg, resolve=True)})
    atomic_write_text(out / "audit.md", audit_markdown(audit, text))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(audit.accuracy)
    ax.bar(names, [audit.accuracy[k] for k in names], color=["tab:gray"] + ["tab:blue"] * (len(names) - 2) + ["tab:red"])
    ax.set_ylabel("accuracy")
    ax.set_xlabel("attack")
    ax.set_ylim(0, 1)
    ax.set_title(f"accuracy per attack ({audit.norm} eps={audit.eps:.4g}, {audit.n} images)")
    save_figure(fig, out / "accuracy_per_attack.png")
    return {"verdict": text, "out": str(out)}


@hydra.main(config_path="pkg://conf", config_name="audit", version_base=None)
def main(cfg: DictConfig) -> None:
    result = run(cfg)
    print(f"verdict: {result['verdict']}\nreport: {result['out']}/audit.md")


if __name__ == "__main__":
    main()
