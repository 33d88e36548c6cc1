"""Automated audit of an adversarial defence: strong attacks, the masking checks, and a written verdict.

Nanda et al. (AAAI 2023, Section 3.2, Fig. 4) observe that defences whose invariances align poorly with
human perception (k-WTA among them) were later broken by stronger attacks. This module runs the attacks
of :mod:`training.strong_attacks` next to PGD and FGSM, takes the per-sample worst case as the robust
accuracy (as AutoAttack reports it), extends :func:`training.evaluate.gradient_masking_report` with the
checks of Carlini et al., "On Evaluating Adversarial Robustness" (2019) and Athalye et al. (ICML 2018),
each ``pass`` / ``fail`` / ``n.a.`` with its numbers, and combines them with the alignment scores into a
verdict by :data:`DECISION_RULE` (also in the README).
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from training.attacks import ThreatModel, fgsm, pgd
from training.evaluate import gradient_masking_report
from training.strong_attacks import apgd, square_linf, worst_case

log = logging.getLogger(__name__)

# Thresholds of the decision rule, in accuracy (fraction of the audited images).
GAP = 0.05  # a gradient-free or transfer attack beating the best white-box attack by more than this is masking
PGD_OVERESTIMATE = 0.10  # PGD above the worst case by more than this
UNBOUNDED_MAX = 0.05  # accuracy left by an attack that may reach any image
LOW_ALIGNMENT = 0.5  # alignment below halfway from the standard to the robust reference model

DECISION_RULE = f"""\
Verdict rule (thresholds in accuracy points of the audited images):
1. Masking checks (each pass / fail / n.a.):
   - black_box_not_stronger: Square (gradient-free) and transfer accuracy are not below the best white-box
     gradient attack (min of PGD, APGD-CE, APGD-T) by more than {GAP:.0%}.
   - pgd_not_overestimating: PGD accuracy exceeds the per-sample worst case over all attacks by at most {PGD_OVERESTIMATE:.0%}.
   - multi_step_beats_single_step: FGSM accuracy is not below PGD accuracy by more than {GAP:.0%}.
   - unbounded_attack_succeeds / accuracy_falls_with_eps / loss_rises_with_eps / robust_below_clean:
     training.evaluate.gradient_masking_report (unbounded accuracy at most {UNBOUNDED_MAX:.0%}).
   - randomness_handled: a stochastic forward pass (two passes differ) is attacked with EOT (eot_samples > 1).
2. "suspected gradient masking" if any masking check fails; otherwise "not robust" if the worst-case
   accuracy is at most {UNBOUNDED_MAX:.0%}; otherwise "no sign of gradient masking".
3. Alignment (when given with the standard and robust reference scores): position = (defence - standard) /
   (robust - standard), averaged over the alignment measures; below {LOW_ALIGNMENT} the defence is "at the
   standard model's level", and that is stated as supporting evidence next to a masking verdict, or as a
   warning (alignment predicts later breaks, Nanda et al. Fig. 4) next to a clean one. It never flips the verdict alone.
"""


@dataclass
class Check:
    name: str
    status: str  # "pass" | "fail" | "n.a."
    detail: str

    def __post_init__(self):
        if self.status not in ("pass", "fail", "n.a."):
            raise ValueError(f"check status must be pass, fail or n.a., got {self.status!r}")


@dataclass
class RobustnessAudit:
    """Every number of the attack part of an audit."""

    norm: str
    eps: float
    n: int
    accuracy: dict[str, float]
    randomised: bool
    eot_samples: int
    masking: dict
    checks: list[Check] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def is_randomised(model: nn.Module, x: Tensor) -> bool:
    """Whether two forward passes on the same images differ (a stochastic defence)."""
    with torch.no_grad():
        return not torch.equal(model(x), model(x))


def check_classifier(model: nn.Module, x: Tensor, n_classes: int | None = None) -> None:
    """Fail early with a clear message if ``model`` is not a classifier returning (N, classes) logits."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"the defence must be a torch.nn.Module, got {type(model).__name__}: return the model from your factory")
    with torch.no_grad():
        out = model(x[:2])
    if not isinstance(out, Tensor) or out.ndim != 2 or out.shape[0] != min(2, x.shape[0]):
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"the defence must map (N, C, H, W) images to (N, classes) logits, got {shape}")
    if n_classes is not None and out.shape[1] != n_classes:
        raise ValueError(f"the defence outputs {out.shape[1]} scores but the data set has {n_classes} classes")
    if not torch.isfinite(out).all():
        raise ValueError("the defence returned non-finite outputs")
    if (out >= 0).all() and torch.allclose(out.float().sum(1), torch.ones(out.shape[0]), atol=1e-4):
        raise ValueError("the defence returns probabilities (rows sum to 1); return logits (before softmax) so the losses are right")


def _ensemble_predict(model: nn.Module, samples: int) -> Callable[[Tensor], Tensor]:
    def predict(x: Tensor) -> Tensor:
        with torch.no_grad():
            return torch.stack([model(x).softmax(1) for _ in range(samples)]).mean(0).argmax(1)
    return predict


class _EOT(nn.Module):
    """Averages the logits of ``samples`` passes so PGD/FGSM/Square see the expectation over the randomness."""

    def __init__(self, model: nn.Module, samples: int):
        super().__init__()
        self.model, self.samples = model, samples

    def forward(self, x: Tensor) -> Tensor:
        return torch.stack([self.model(x) for _ in range(self.samples)]).mean(0)


def audit_robustness(model: nn.Module, x: Tensor, y: Tensor, norm: str, eps: float, *, steps: int = 50, square_queries: int = 1000,
                     n_targets: int = 3, eot_samples: int = 1, reference: Optional[nn.Module] = None, seed: int = 0,
                     masking_eps: Optional[list[float]] = None, unbounded_steps: int = 50) -> RobustnessAudit:
    """Attack ``model`` with FGSM, PGD, APGD-CE, APGD-T, Square (Linf only) and, if ``reference`` is given, a
    transfer attack (APGD-CE on the reference, evaluated on the defence); then run the masking checks."""
    model.eval()
    check_classifier(model, x)
    randomised = is_randomised(model, x[:8])
    if randomised and eot_samples == 1:
        log.warning("the defence is randomised (two forward passes differ) but eot_samples=1: gradients are single samples")
    target = _EOT(model, eot_samples) if eot_samples > 1 else model

    def gen() -> torch.Generator:
        return torch.Generator(device=x.device).manual_seed(seed)

    threat = ThreatModel(norm, eps, steps=steps)
    attacks = {
        "fgsm": lambda m, a, b: fgsm(target, a, b, eps, norm=norm, generator=gen()),
        "pgd": lambda m, a, b: pgd(target, a, b, threat, generator=gen()),
        "apgd-ce": lambda m, a, b: apgd(target, a, b, threat, loss="ce", generator=gen()),
        "apgd-t": lambda m, a, b: apgd(target, a, b, threat, loss="dlr-targeted", n_targets=n_targets, generator=gen()),
    }
    if norm == "linf":
        attacks["square"] = lambda m, a, b: square_linf(target, a, b, eps, queries=square_queries, generator=gen())
    if reference is not None:
        reference.eval()
        attacks["transfer"] = lambda m, a, b: apgd(reference, a, b, threat, loss="ce", generator=gen())
    predict = _ensemble_predict(model, eot_samples) if randomised else None
    result = worst_case(model, x, y, attacks, predict=predict)
    accuracy = result.accuracies()
    masking = gradient_masking_report(target, (x, y), norm, masking_eps, steps=min(steps, 20), unbounded_steps=unbounded_steps, limit=None, seed=seed,
                                      max_unbounded_accuracy=UNBOUNDED_MAX)
    audit = RobustnessAudit(norm, eps, len(y), accuracy, randomised, eot_samples, masking.to_dict())
    audit.checks = masking_checks(accuracy, masking.checks, masking.unbounded_accuracy, randomised, eot_samples)
    return audit


def masking_checks(accuracy: dict[str, float], report_checks: dict[str, bool], unbounded_accuracy: float, randomised: bool,
                   eot_samples: int) -> list[Check]:
    """The checks of :data:`DECISION_RULE` from the attack accuracies and the masking report."""
    white_box = min(accuracy[k] for k in ("pgd", "apgd-ce", "apgd-t") if k in accuracy)
    checks = []
    black = {k: accuracy[k] for k in ("square", "transfer") if k in accuracy}
    if black:
        strongest = min(black, key=black.get)
        gap = white_box - black[strongest]
        checks.append(Check("black_box_not_stronger", "fail" if gap > GAP else "pass",
                            f"best white-box {white_box:.1%}, {strongest} {black[strongest]:.1%} (gap {gap:+.1%}, limit {GAP:.0%})"))
    else:
        checks.append(Check("black_box_not_stronger", "n.a.", "no Square (L2 threat) and no reference model for a transfer attack"))
    over = accuracy["pgd"] - accuracy["worst_case"]
    checks.append(Check("pgd_not_overestimating", "fail" if over > PGD_OVERESTIMATE else "pass",
                        f"PGD {accuracy['pgd']:.1%}, worst case {accuracy['worst_case']:.1%} (over by {over:.1%}, limit {PGD_OVERESTIMATE:.0%})"))
    single = accuracy["pgd"] - accuracy["fgsm"]
    checks.append(Check("multi_step_beats_single_step", "fail" if single > GAP else "pass",
                        f"FGSM {accuracy['fgsm']:.1%}, PGD {accuracy['pgd']:.1%}"))
    for name, ok in report_checks.items():
        detail = f"unbounded accuracy {unbounded_accuracy:.1%} (limit {UNBOUNDED_MAX:.0%})" if name == "unbounded_attack_succeeds" else "eps sweep, see masking"
        checks.append(Check(name, "pass" if ok else "fail", detail))
    if not randomised:
        checks.append(Check("randomness_handled", "n.a.", "deterministic: two forward passes agree"))
    else:
        checks.append(Check("randomness_handled", "pass" if eot_samples > 1 else "fail",
                            f"two forward passes differ; eot_samples={eot_samples}" + ("" if eot_samples > 1 else ": set eot to average the gradient")))
    return checks


def alignment_position(defence: dict[str, float], standard: dict[str, float], robust: dict[str, float]) -> Optional[float]:
    """Mean over the shared measures of (defence - standard) / (robust - standard); None if none is usable."""
    positions = [(defence[k] - standard[k]) / (robust[k] - standard[k]) for k in defence
                 if k in standard and k in robust and abs(robust[k] - standard[k]) > 1e-9]
    return sum(positions) / len(positions) if positions else None


def verdict(audit: RobustnessAudit, alignment: Optional[float] = None) -> str:
    """The one-line verdict of :data:`DECISION_RULE`; ``alignment`` is :func:`alignment_position`."""
    failed = [c for c in audit.checks if c.status == "fail"]
    acc = audit.accuracy
    white = {k: acc[k] for k in ("pgd", "apgd-ce", "apgd-t", "square", "transfer") if k in acc}
    numbers = ", ".join(f"{v:.0%} under {k}" for k, v in white.items())
    text = f"robust accuracy {acc['worst_case']:.0%} worst case ({numbers}; clean {acc['clean']:.0%})"
    if alignment is not None:
        level = "at the standard model's level" if alignment < LOW_ALIGNMENT else "near the robust model's level"
        text += f"; alignment {level} (position {alignment:.2f})"
    if failed:
        return f"{text}: suspected gradient masking (failed: {', '.join(c.name for c in failed)})"
    if acc["worst_case"] <= UNBOUNDED_MAX:
        return f"{text}: not robust"
    if alignment is not None and alignment < LOW_ALIGNMENT:
        return f"{text}: no sign of gradient masking, but low alignment predicts stronger attacks may break it"
    return f"{text}: no sign of gradient masking"


def is_flagged(text: str) -> bool:
    return "suspected gradient masking" in text


def audit_markdown(audit: RobustnessAudit, verdict_text: str) -> str:
    """A one-screen verdict first, then the evidence."""
    lines = ["# Defence audit", "", f"**Verdict:** {verdict_text}", "", f"Threat: {audit.norm} eps={audit.eps:.4g}, {audit.n} images;"
             f" randomised: {audit.randomised} (eot_samples={audit.eot_samples})", "", "## Accuracy per attack", "",
             "| attack | accuracy |", "|---|---|"]
    lines += [f"| {k} | {v:.1%} |" for k, v in audit.accuracy.items()]
    lines += ["", "## Masking checks", "", "| check | status | numbers |", "|---|---|---|"]
    lines += [f"| {c.name} | {c.status} | {c.detail} |" for c in audit.checks]
    lines += ["", "## Decision rule", "", "```", DECISION_RULE.rstrip(), "```", ""]
    return "\n".join(lines)


__all__ = ["Check", "DECISION_RULE", "RobustnessAudit", "alignment_position", "audit_markdown", "audit_robustness", "check_classifier",
           "is_flagged", "is_randomised", "masking_checks", "verdict"]
