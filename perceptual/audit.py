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

import contextlib
import hashlib
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from invert.rng import seeded_rng
from invert.validation import check_images
from training.attacks import ThreatModel, fgsm, pgd
from training.evaluate import gradient_masking_report
from training.io import atomic_write_json
from training.strong_attacks import Attack, apgd, square, straight_through, worst_case

from .cache import cache_key, cached_json, module_identity
from .statistics import SIGN_FLIP_MIN_N

log = logging.getLogger(__name__)

# Thresholds of the decision rule, in accuracy (fraction of the audited images).
GAP = 0.05  # a gradient-free or transfer attack beating the best white-box attack by more than this is masking
PGD_OVERESTIMATE = 0.10  # PGD above the worst case by more than this
UNBOUNDED_MAX = 0.05  # accuracy left by an attack that may reach any image
LOW_ALIGNMENT = 0.5  # alignment below halfway from the standard to the robust reference model
CHANCE_ALPHA = 0.01  # clean accuracy must beat the chance agreement of the defence's answers at this significance
MIN_CLASSES = 4  # APGD-T's targeted DLR loss: the true class, the target and two more

DECISION_RULE = f"""\
Verdict rule (thresholds in accuracy points of the audited images):
0. The defence must classify: its clean accuracy must be above the chance agreement of its answers with the labels
   (Cohen's: sum over classes of P(answer c) P(label c), what answers with the same class frequencies but independent
   of the images score; one-sided binomial test, p < {CHANCE_ALPHA}). A constant or broken classifier (wrong weights, input
   range or class order) has nothing for an attack to lower, so `audit` stops before any attack. Audited anyway
   (allow_chance_accuracy=true), the verdict is "no verdict: the defence does not classify" and the defence is flagged.
1. Masking checks (each pass / fail / n.a.):
   - black_box_not_stronger: Square (gradient-free) and transfer accuracy are not below the best white-box
     gradient attack (min of PGD, APGD-CE, APGD-T) by more than {GAP:.0%}.
   - smoothed_gradient_not_stronger: APGD-CE on the Gaussian-smoothed loss, its gradient estimated from queries
     alone (finite differences over random directions, Tramer et al. 2020's attack on k-WTA), is not below the
     best white-box gradient attack by more than {GAP:.0%} (else the gradients are shattered: the gradient at a
     point misses the jumps of the loss around it).
   - pgd_not_overestimating: PGD accuracy exceeds the per-sample worst case over all attacks by at most {PGD_OVERESTIMATE:.0%}
     (on a randomised defence, plus the prediction noise: clean accuracy minus the noise floor).
   - multi_step_beats_single_step: FGSM accuracy is not below PGD accuracy by more than {GAP:.0%}.
   - unbounded_attack_succeeds / accuracy_falls_with_eps / loss_rises_with_eps / robust_below_clean:
     training.evaluate.gradient_masking_report (unbounded accuracy at most {UNBOUNDED_MAX:.0%}).
   - randomness_handled: a stochastic forward pass (two passes differ) is attacked with EOT (eot_samples > 1).
2. "suspected gradient masking" if any masking check fails; otherwise "not robust" if the worst-case
   accuracy is at most {UNBOUNDED_MAX:.0%}; otherwise "no sign of gradient masking".
3. Alignment (the defence and both reference models measured as `measure` does: 2AFC, clustering, hard
   clustering, panel means): position = where the defence lies on the line from the standard (0) to the
   robust (1) reference, projected over the measures together: sum (d - s)(r - s) / sum (r - s)^2 (for one
   measure (d - s) / (r - s); a measure the references barely differ on counts for little). Below
   {LOW_ALIGNMENT} the defence is "at the standard model's level", otherwise "near the robust model's level". Where the
   robust reference is not the more aligned (sum (r - s) <= 0) there is no position: the audit warns instead.
   That is stated as supporting evidence next to a masking verdict, or as a warning (low alignment predicts
   later breaks, Nanda et al. Fig. 4) next to a clean one. It never flips the verdict alone.
4. Controversial stimuli of the defence against the robust reference (Table 2 score): which model the
   observers favour is reported next to the verdict as evidence; it never flips the verdict either.
5. The audit FLAGS the defence (audit.json "flagged") when the verdict is "suspected gradient masking", or
   when it is "no sign of gradient masking" but the alignment is at the standard model's level (the
   defence's robustness is not backed by aligned invariances, the pattern of the defences later broken), or
   when the defence does not classify (rule 0).
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
    """Every number of the attack part of an audit. ``sweep`` maps each swept eps (as text) to the accuracy per
    attack at that eps; ``warnings`` are stated in the report (e.g. a randomised defence attacked without EOT)."""

    norm: str
    eps: float
    n: int
    accuracy: dict[str, float]
    randomised: bool
    eot_samples: int
    masking: dict
    checks: list[Check] = field(default_factory=list)
    sweep: dict[str, dict[str, float]] = field(default_factory=dict)
    bpda: Optional[str] = None
    warnings: list[str] = field(default_factory=list)
    noise_floor: Optional[float] = None  # randomised defences: the worst case of as many evaluations with no attack
    chance_agreement: Optional[float] = None  # the clean answers' chance agreement with the labels (rule 0)
    above_chance: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def is_randomised(model: nn.Module, x: Tensor) -> bool:
    """Whether two forward passes on the same images differ (a stochastic defence) by more than the rounding of
    kernels that are not bitwise deterministic (atomic adds on a GPU): a relative 1e-4, or 4 ulps of a half-precision
    output. Exact equality called such a deterministic network randomised, and with eot=1 flagged it."""
    with torch.no_grad():
        first, second = model(x), model(x)
    if first.dtype.is_floating_point:
        tolerance = max(1e-4, 4 * torch.finfo(first.dtype).eps)
        scale = float(first.detach().abs().max()) if first.numel() else 0.0
        return not torch.allclose(first, second, rtol=tolerance, atol=tolerance * scale)
    return not torch.equal(first, second)


def check_classifier(model: nn.Module, x: Tensor, n_classes: int | None = None) -> None:
    """Fail early with a clear message if ``model`` is not a classifier returning (N, classes) logits."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"the defence must be a torch.nn.Module, got {type(model).__name__}: return the model from your factory")
    try:
        with torch.no_grad():
            out = model(x[:2])
    except Exception as err:  # any failure of the user's forward pass, named before the long work
        raise ValueError(f"the defence failed on a batch of {tuple(x[:2].shape)} [0, 1] images: {type(err).__name__}: {err}") from err
    if not isinstance(out, Tensor) or out.ndim != 2 or out.shape[0] != min(2, x.shape[0]):
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(f"the defence must map (N, C, H, W) images to (N, classes) logits, got {shape}")
    if n_classes is not None and out.shape[1] != n_classes:
        raise ValueError(f"the defence outputs {out.shape[1]} scores but the data set has {n_classes} classes: return one logit per class "
                         "(is it a feature extractor rather than a classifier?)")
    if out.shape[1] < MIN_CLASSES:
        raise ValueError(f"the defence outputs {out.shape[1]} class scores; the audit's APGD-T (targeted DLR loss) needs at least "
                         f"{MIN_CLASSES} classes")
    if not torch.isfinite(out).all():
        raise ValueError("the defence returned non-finite outputs")
    out = out.detach().float().cpu()  # a CUDA defence's rows are compared with ones made here
    if (out >= 0).all() and torch.allclose(out.sum(1), torch.ones(out.shape[0]), atol=1e-4):
        raise ValueError("the defence returns probabilities (rows sum to 1); return logits (before softmax) so the losses are right")
    if (out <= 0).all() and torch.allclose(out.exp().sum(1), torch.ones(out.shape[0]), atol=1e-4):
        raise ValueError("the defence returns log-probabilities (log_softmax); return logits (before softmax) so the DLR and margin losses are right")


def chance_agreement(predictions: Tensor, y: Tensor) -> float:
    """Cohen's chance agreement of ``predictions`` with the labels ``y``: sum over classes of P(answer c) P(label c), the
    accuracy expected of answers with the same class frequencies but drawn independently of the images. A constant
    classifier's accuracy equals it; a classifier guessing uniformly at random scores it on average."""
    if y.ndim != 1 or not len(y) or predictions.shape != y.shape:
        raise ValueError(f"one answer per label, both 1-d and non-empty: answers of shape {tuple(predictions.shape)}, labels {tuple(y.shape)}")
    if bool((y < 0).any()) or bool((predictions < 0).any()):
        raise ValueError("answers and labels must be class indices >= 0 (images without a class, such as Gaussian targets, have no "
                         "accuracy to test)")
    classes = int(max(predictions.max(), y.max())) + 1
    answered = torch.bincount(predictions.long().cpu(), minlength=classes).double() / len(y)
    labelled = torch.bincount(y.long().cpu(), minlength=classes).double() / len(y)
    return float((answered * labelled).sum())


def is_above_chance(predictions: Tensor, y: Tensor, alpha: float = CHANCE_ALPHA) -> bool:
    """Rule 0 of :data:`DECISION_RULE`: whether the accuracy of ``predictions`` is above their :func:`chance_agreement` with
    ``y``, by a one-sided exact binomial test at level ``alpha`` (``scipy.stats.binomtest``; the test treats the chance
    agreement as known, as Cohen's kappa does). A constant classifier never passes (its accuracy is its chance
    agreement); a weakly trained one does: 15 of 64 CIFAR images right with answers spread over the classes (chance
    agreement about 10 %) has p = 0.001, where a test against always answering the sample's most frequent class
    (11 of the 64) gave p = 0.12 and stopped it."""
    from scipy.stats import binomtest

    if not 0 < alpha < 1:
        raise ValueError(f"alpha (the test's significance level) must lie in (0, 1), e.g. 0.01; got {alpha!r}")
    chance = chance_agreement(predictions, y)
    correct = int((predictions.cpu() == y.cpu()).sum())
    if not 0 < chance < 1:  # one class answered and labelled throughout, or no answer is a labelled class (none right)
        return False
    return bool(binomtest(correct, len(y), chance, alternative="greater").pvalue < alpha)


def _undecidable(y: Tensor, alpha: float = CHANCE_ALPHA) -> Optional[str]:
    """Why rule 0 cannot pass on labels ``y`` whatever the answers (None where a perfect classifier would pass): every
    label is one class, or too few images for the test even with every answer right."""
    from scipy.stats import binomtest

    labels = y.long().cpu()
    if torch.unique(labels).numel() < 2:
        return (f"the {len(labels)} audited images all have one label, so answering it always agrees with them by chance: "
                "audit images of several classes (a larger n_images)")
    perfect_chance = float(((torch.bincount(labels).double() / len(labels)) ** 2).sum())  # chance agreement of right answers
    if binomtest(len(labels), len(labels), perfect_chance, alternative="greater").pvalue >= alpha:
        return (f"{len(labels)} images are too few for the test: even all of them right would not be above chance at p < {alpha}; "
                "raise n_images (16 or more)")
    return None


def chance_message(predictions: Tensor, y: Tensor) -> str:
    """Why a defence that fails rule 0 cannot be audited, and what to check."""
    undecidable = _undecidable(y)
    if undecidable is not None:
        return f"rule 0 (is the defence a classifier?) cannot be decided: {undecidable}"
    accuracy = float((predictions.cpu() == y.cpu()).float().mean())
    answered = torch.unique(predictions).numel()
    return (f"the defence's clean accuracy ({accuracy:.1%} of {len(y)} images) is not above the chance agreement of its answers with the "
            f"labels ({chance_agreement(predictions, y):.1%}; it answered {answered} distinct class{'es' if answered != 1 else ''}; one-sided "
            f"binomial test at p < {CHANCE_ALPHA}): it does not classify these images, so no attack has anything to lower and the audit would "
            "measure nothing. Check the weights (defence.checkpoint, or what your factory loads), the input range (the defence takes "
            "[0, 1] images and normalises inside) and the order of the classes")


def clean_predictions(model: nn.Module, x: Tensor, eot_samples: int = 1, batch_size: int = 256, seed: int = 0) -> Tensor:
    """The answers on the unattacked images, a randomised defence's averaged over ``eot_samples`` passes (as the audit
    predicts it). Its random draws are seeded and forked off, so the attacks that follow draw as they would without it."""
    check_images(x, "audited images")
    check_budgets(eot=eot_samples, batch_size=batch_size)
    predict = _ensemble_predict(model, eot_samples)
    with seeded_rng(seed, x.device):
        return torch.cat([predict(x[i:i + batch_size]) for i in range(0, len(x), batch_size)])


def randomness_warning(randomised: bool, eot_samples: int) -> Optional[str]:
    """The warning the report states when a stochastic defence is attacked with single-sample gradients."""
    if randomised and eot_samples <= 1:
        return ("the defence is randomised (two forward passes on the same images differ) but eot=1: every gradient is a single "
                "sample, so the white-box attacks are weak against it; rerun with eot=8 (or more)")
    return None


def noise_floor(predict: Callable[[Tensor], Tensor], x: Tensor, y: Tensor, evaluations: int, seed: int = 0) -> float:
    """The accuracy of a randomised model's per-sample worst case over ``evaluations`` predictions of the clean
    images, no attack at all: the worst case of an audit ANDs that many random predictions (clean and one per
    attack), so prediction noise alone lowers it this far (Carlini et al. 2019: evaluate randomised models in
    expectation). Seeded, so a rerun states the same number."""
    check_budgets(evaluations=evaluations)
    if y.shape != x.shape[:1]:
        raise ValueError(f"one label per image: {x.shape[0]} images, labels of shape {tuple(y.shape)}")
    correct = torch.ones_like(y, dtype=torch.bool)
    with seeded_rng(seed, x.device):
        for _ in range(evaluations):
            correct &= predict(x) == y
    return float(correct.float().mean())


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


# An attack whose computation changed, with its revision: its stored results are recomputed, the other attacks' kept.
ATTACK_REVISIONS = {"transfer": 2}  # 2: every image taken to its highest loss on the reference


class JsonAttackStore:
    """Each attack's per-sample correctness in ``folder/<attack>.json`` under ``key`` (the model's weights, the
    images and every attack setting; :data:`ATTACK_REVISIONS`): :func:`training.strong_attacks.worst_case` skips an
    attack found here, so an interrupted audit resumes and a repeated one recomputes nothing."""

    def __init__(self, folder: Path, key: str):
        self.folder, self.key = Path(folder), key

    def _key(self, name: str) -> str:
        return cache_key(self.key, name, ATTACK_REVISIONS[name]) if name in ATTACK_REVISIONS else self.key

    def load(self, name: str) -> Optional[Tensor]:
        cached = cached_json(self.folder / f"{name}.json", self._key(name))
        return None if cached is None else torch.tensor(cached["correct"], dtype=torch.bool)

    def save(self, name: str, correct: Tensor) -> None:
        # per image, clean mistakes included: the accuracy the audit reports counts only images right when clean
        atomic_write_json(self.folder / f"{name}.json", {"key": self._key(name), "attack": name, "correct": correct.cpu().tolist()})


def tensor_digest(*tensors: Tensor) -> str:
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def default_smoothing_sigma(norm: str, eps: float, image_shape: tuple[int, ...]) -> float:
    """The default noise of the smoothed-gradient attack: as large per pixel as the threat's perturbation,
    ``eps`` for Linf and ``eps / sqrt(C*H*W)`` for L2 (noise of that standard deviation has an L2 norm of
    about ``eps``)."""
    return eps if norm == "linf" else eps / math.sqrt(math.prod(image_shape))


def check_smoothing(samples: int, sigma: Optional[float]) -> None:
    """Refuse settings of the smoothed-gradient attack before any attack runs: ``samples`` 0 (off) or at least 2 (an
    antithetic pair), ``sigma`` None (:func:`default_smoothing_sigma`) or positive."""
    if samples == 1 or samples < 0 or (sigma is not None and not sigma > 0):
        raise ValueError(f"smoothing.samples must be 0 (off) or at least 2 and smoothing.sigma null or > 0, got {samples} and {sigma}")


def check_eps_values(norm: str, eps: float, **eps_lists: Sequence[float]) -> None:
    """Refuse a bad norm or eps, at ``eps`` and in every list (``sweep_eps``, ``masking_eps``), before the first attack:
    the lists run only after every attack at ``eps``."""
    ThreatModel(norm, eps)
    for name, values in eps_lists.items():
        for value in values:
            try:
                ThreatModel(norm, value)
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from None


def check_budgets(**budgets: int) -> None:
    """Refuse an attack budget below 1 (``eot=0`` audited a randomised defence with no pass at all, ``n_targets=0`` and
    ``square_queries=0`` failed only when their attacks started), naming the setting."""
    for name, value in budgets.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def attack_suite(model: nn.Module, norm: str, eps: float, *, steps: int = 50, square_queries: int = 1000, n_targets: int = 3,
                 eot_samples: int = 1, reference: Optional[nn.Module] = None, bpda: Optional[str] = None, seed: int = 0,
                 fgsm_included: bool = True, smoothing_samples: int = 0, smoothing_sigma: Optional[float] = None) -> dict[str, Attack]:
    """The audit's attacks at one eps: FGSM, PGD, APGD-CE, APGD-T (white-box; through ``bpda``'s straight-through
    gradient when set, averaged over ``eot_samples`` passes), with ``smoothing_samples`` > 0 APGD-CE on the
    Gaussian-smoothed loss (``apgd-smooth``: each gradient estimated from that many queries at noise of standard
    deviation ``smoothing_sigma``, default :func:`default_smoothing_sigma`;
    :func:`training.strong_attacks.smoothed_loss_grad`), Square (gradient-free, Linf or L2) and, with a
    ``reference`` model, the transfer attack (APGD-CE on the reference, every image taken to its highest loss there,
    evaluated on the defence)."""
    check_smoothing(smoothing_samples, smoothing_sigma)
    check_budgets(steps=steps, square_queries=square_queries, n_targets=n_targets, eot=eot_samples)
    target = _EOT(model, eot_samples) if eot_samples > 1 else model

    def gen(device: torch.device) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(seed)

    def white_box(attack: Attack) -> Attack:
        if not bpda:
            return attack

        def through(m, a, b):
            with straight_through(model, bpda):
                return attack(m, a, b)
        return through

    threat = ThreatModel(norm, eps, steps=steps)
    attacks: dict[str, Attack] = {}
    if fgsm_included:
        attacks["fgsm"] = white_box(lambda m, a, b: fgsm(target, a, b, eps, norm=norm, generator=gen(a.device)))
    attacks["pgd"] = white_box(lambda m, a, b: pgd(target, a, b, threat, generator=gen(a.device)))
    attacks["apgd-ce"] = white_box(lambda m, a, b: apgd(target, a, b, threat, loss="ce", generator=gen(a.device)))
    attacks["apgd-t"] = white_box(lambda m, a, b: apgd(target, a, b, threat, loss="dlr-targeted", n_targets=n_targets, generator=gen(a.device)))
    if smoothing_samples > 0:
        def smoothed(m, a, b):
            sigma = default_smoothing_sigma(norm, eps, tuple(a.shape[1:])) if smoothing_sigma is None else smoothing_sigma
            return apgd(target, a, b, threat, loss="ce", smoothing_sigma=sigma, smoothing_samples=smoothing_samples, generator=gen(a.device))
        attacks["apgd-smooth"] = smoothed  # queries only: BPDA does not apply
    attacks["square"] = lambda m, a, b: square(target, a, b, norm, eps, queries=square_queries, generator=gen(a.device))
    if reference is not None:
        reference.eval()
        # every image to its highest loss on the reference: one the reference misclassifies clean was left unperturbed
        attacks["transfer"] = lambda m, a, b: apgd(reference, a, b, threat, loss="ce", every_image=True, generator=gen(a.device))
    return attacks


def audit_robustness(model: nn.Module, x: Tensor, y: Tensor, norm: str, eps: float, *, steps: int = 50, square_queries: int = 1000,
                     n_targets: int = 3, eot_samples: int = 1, reference: Optional[nn.Module] = None, seed: int = 0,
                     masking_eps: Optional[list[float]] = None, unbounded_steps: int = 50, bpda: Optional[str] = None,
                     sweep_eps: Optional[list[float]] = None, cache_dir: Optional[Path] = None, smoothing_samples: int = 64,
                     smoothing_sigma: Optional[float] = None, identity=None, reference_identity=None) -> RobustnessAudit:
    """Attack ``model`` with :func:`attack_suite` at ``eps`` (and at every ``sweep_eps``, for the accuracy-vs-eps
    figure), take the per-sample worst case, then run the masking checks. With ``cache_dir`` every attack's result
    and the masking report are stored there and reused by a rerun with the same model (:func:`module_identity` with
    ``identity``), the same transfer ``reference`` (with ``reference_identity``), images and settings.
    ``smoothing_samples`` = 0 leaves out the smoothed-gradient attack (and its check)."""
    model.eval()
    check_budgets(steps=steps, square_queries=square_queries, n_targets=n_targets, eot=eot_samples, unbounded_steps=unbounded_steps)
    check_eps_values(norm, eps, sweep_eps=sweep_eps or [], masking_eps=masking_eps or [])
    check_classifier(model, x)
    randomised = is_randomised(model, x[:8])
    warnings = [w for w in [randomness_warning(randomised, eot_samples)] if w]
    for warning in warnings:
        log.warning("%s", warning)
    settings = dict(steps=steps, square_queries=square_queries, n_targets=n_targets, eot_samples=eot_samples, reference=reference, bpda=bpda, seed=seed,
                    smoothing_samples=smoothing_samples, smoothing_sigma=smoothing_sigma)
    transfer_from = reference is not None and module_identity(reference, reference_identity)
    key = cache_key(module_identity(model, identity), transfer_from, tensor_digest(x, y), norm, steps, square_queries, n_targets, eot_samples, seed,
                    bpda, "audit-v2", *([smoothing_samples, smoothing_sigma] if smoothing_samples else []))
    predict = _ensemble_predict(model, eot_samples) if randomised else None
    answers = clean_predictions(model, x, eot_samples if randomised else 1, seed=seed)
    above = is_above_chance(answers, y)  # rule 0: said before the attacks start, and first in the report
    if not above:
        warnings.insert(0, chance_message(answers, y))
        log.warning("%s", warnings[0])

    def run_at(value: float) -> dict[str, float]:
        store = JsonAttackStore(Path(cache_dir) / "attacks" / f"{norm}-eps{value:.6g}", cache_key(key, value)) if cache_dir else None
        result = worst_case(model, x, y, attack_suite(model, norm, value, **settings), predict=predict, store=store)
        return result.accuracies()

    with tqdm(total=len({*(sweep_eps or []), eps}), desc="audit: attacks per eps", unit="eps") as progress:
        accuracy = run_at(eps)
        progress.update()
        sweep = {}
        for value in sorted({*(sweep_eps or []), eps}):
            sweep[f"{value:.6g}"] = accuracy if value == eps else run_at(value)
            progress.update(value != eps)
    masking = _masking_report(model, x, y, norm, masking_eps, steps, unbounded_steps, seed, eot_samples, bpda, cache_dir, key)
    floor = None
    if randomised:
        floor = noise_floor(predict, x, y, evaluations=len(accuracy) - 1, seed=seed)  # clean and one per attack, as the worst case
        warnings.append(f"with no attack, the worst case of the same {len(accuracy) - 1} random predictions is {floor:.1%} "
                        f"(clean {accuracy['clean']:.1%}): on this randomised defence, differences between attacks up to "
                        f"{accuracy['clean'] - floor:.1%} can be prediction noise; a larger eot narrows it")
    audit = RobustnessAudit(norm, eps, len(y), accuracy, randomised, eot_samples, masking, sweep=sweep, bpda=bpda, warnings=warnings,
                            noise_floor=floor, chance_agreement=chance_agreement(answers, y), above_chance=above)
    audit.checks = masking_checks(accuracy, masking["checks"], masking["unbounded_accuracy"], randomised, eot_samples, masking, floor)
    return audit


def reference_accuracy(model: nn.Module, x: Tensor, y: Tensor, norm: str, eps: float, *, cache_dir: Optional[Path] = None, steps: int = 50,
                       square_queries: int = 1000, n_targets: int = 3, seed: int = 0, smoothing_samples: int = 64,
                       smoothing_sigma: Optional[float] = None, identity=None) -> dict[str, float]:
    """A reference model's accuracy per attack and worst case under the audit's attacks (no FGSM, no transfer),
    cached like :func:`audit_robustness`: the robust accuracy of the alignment-vs-robustness figure."""
    model.eval()
    key = cache_key(module_identity(model, identity), tensor_digest(x, y), norm, eps, steps, square_queries, n_targets, seed, "reference-v2",
                    *([smoothing_samples, smoothing_sigma] if smoothing_samples else []))
    store = JsonAttackStore(Path(cache_dir) / "attacks" / f"{norm}-eps{eps:.6g}", key) if cache_dir else None
    attacks = attack_suite(model, norm, eps, steps=steps, square_queries=square_queries, n_targets=n_targets, seed=seed, fgsm_included=False,
                           smoothing_samples=smoothing_samples, smoothing_sigma=smoothing_sigma)
    return worst_case(model, x, y, attacks, store=store).accuracies()


def _masking_report(model, x, y, norm, masking_eps, steps, unbounded_steps, seed, eot_samples, bpda, cache_dir, key) -> dict:
    """:func:`training.evaluate.gradient_masking_report` on the audited images (through EOT and BPDA), cached."""
    path = Path(cache_dir) / "masking.json" if cache_dir else None
    report_key = cache_key(key, masking_eps, unbounded_steps)
    cached = cached_json(path, report_key) if path else None
    if cached is not None:
        return cached["report"]
    target = _EOT(model, eot_samples) if eot_samples > 1 else model
    with straight_through(model, bpda) if bpda else contextlib.nullcontext():
        report = gradient_masking_report(target, (x, y), norm, masking_eps, steps=min(steps, 20), unbounded_steps=unbounded_steps, limit=None,
                                         seed=seed, max_unbounded_accuracy=UNBOUNDED_MAX).to_dict()
    if path:
        atomic_write_json(path, {"key": report_key, "report": report})
    return report


def _sweep_detail(name: str, masking: Optional[Mapping]) -> str:
    """The numbers behind one of gradient_masking_report's eps-sweep checks."""
    if not masking:
        return "eps sweep of training.evaluate.gradient_masking_report"
    eps = ", ".join(f"{e:.3g}" for e in masking["eps"])
    if name == "loss_rises_with_eps":
        return f"PGD loss {masking['clean_loss']:.3f} (clean) -> " + " -> ".join(f"{v:.3f}" for v in masking["loss"]) + f" at eps {eps}"
    if name == "accuracy_falls_with_eps":
        return f"PGD accuracy {masking['clean_accuracy']:.0%} (clean) -> " + " -> ".join(f"{v:.0%}" for v in masking["accuracy"]) + f" at eps {eps}"
    highest = max(range(len(masking["accuracy"])), key=lambda i: masking["accuracy"][i])  # the first eps where it peaks
    return (f"clean {masking['clean_accuracy']:.1%}, highest PGD accuracy {masking['accuracy'][highest]:.1%} at eps "
            f"{masking['eps'][highest]:.3g} (swept: {eps})")


def masking_checks(accuracy: dict[str, float], report_checks: dict[str, bool], unbounded_accuracy: float, randomised: bool,
                   eot_samples: int, masking: Optional[Mapping] = None, noise_floor: Optional[float] = None) -> list[Check]:
    """The checks of :data:`DECISION_RULE` from the attack accuracies and the masking report (``masking``:
    :meth:`training.evaluate.MaskingReport.to_dict`, for the numbers of its eps-sweep checks). ``noise_floor``
    (randomised defences, :func:`noise_floor`) widens pgd_not_overestimating's limit by clean − floor: PGD's accuracy
    is one random prediction per image, the worst case ANDs one per attack, so that much of the gap is noise."""
    white_box = min(accuracy[k] for k in ("pgd", "apgd-ce", "apgd-t") if k in accuracy)
    checks = []
    black = {k: accuracy[k] for k in ("square", "transfer") if k in accuracy}
    if black:
        strongest = min(black, key=black.get)
        gap = white_box - black[strongest]
        checks.append(Check("black_box_not_stronger", "fail" if gap > GAP else "pass",
                            f"best white-box {white_box:.1%}, {strongest} {black[strongest]:.1%} (gap {gap:+.1%}, limit {GAP:.0%})"))
    else:
        checks.append(Check("black_box_not_stronger", "n.a.", "neither Square nor a transfer attack was run"))
    if "apgd-smooth" in accuracy:
        gap = white_box - accuracy["apgd-smooth"]
        checks.append(Check("smoothed_gradient_not_stronger", "fail" if gap > GAP else "pass",
                            f"best white-box {white_box:.1%}, smoothed-gradient APGD {accuracy['apgd-smooth']:.1%} (gap {gap:+.1%}, limit {GAP:.0%})"))
    else:
        checks.append(Check("smoothed_gradient_not_stronger", "n.a.", "the smoothed-gradient attack was not run (smoothing_samples=0)"))
    over = accuracy["pgd"] - accuracy["worst_case"]
    noise = max(0.0, accuracy["clean"] - noise_floor) if noise_floor is not None else 0.0
    limit = f"limit {PGD_OVERESTIMATE:.0%}" + (f" + {noise:.1%} prediction noise" if noise_floor is not None else "")
    checks.append(Check("pgd_not_overestimating", "fail" if over > PGD_OVERESTIMATE + noise else "pass",
                        f"PGD {accuracy['pgd']:.1%}, worst case {accuracy['worst_case']:.1%} (over by {over:.1%}, {limit})"))
    single = accuracy["pgd"] - accuracy["fgsm"]
    checks.append(Check("multi_step_beats_single_step", "fail" if single > GAP else "pass",
                        f"FGSM {accuracy['fgsm']:.1%}, PGD {accuracy['pgd']:.1%}"))
    for name, ok in report_checks.items():
        detail = (f"unbounded accuracy {unbounded_accuracy:.1%} (limit {UNBOUNDED_MAX:.0%})" if name == "unbounded_attack_succeeds"
                  else _sweep_detail(name, masking))
        checks.append(Check(name, "pass" if ok else "fail", detail))
    if not randomised:
        checks.append(Check("randomness_handled", "n.a.", "deterministic: two forward passes agree"))
    else:
        checks.append(Check("randomness_handled", "pass" if eot_samples > 1 else "fail",
                            f"two forward passes differ; eot_samples={eot_samples}" + ("" if eot_samples > 1 else ": set eot to average the gradient")))
    return checks


def references_ordered(standard: dict[str, float], robust: dict[str, float], measures: Optional[Sequence[str]] = None) -> bool:
    """Whether the robust reference is the more aligned over ``measures`` (default: those both have finite): sum (r - s) > 0."""
    measures = [k for k in standard if k in robust] if measures is None else list(measures)
    gaps = [robust[k] - standard[k] for k in measures if math.isfinite(robust[k]) and math.isfinite(standard[k])]
    return sum(gaps) > 0


def alignment_position(defence: dict[str, float], standard: dict[str, float], robust: dict[str, float]) -> Optional[float]:
    """Where the defence's alignment lies on the line from the standard (0) to the robust (1) reference: the least-squares
    projection over the measures all three share with a finite value, sum (d - s)(r - s) / sum (r - s)^2; None where
    the references do not differ on any of them (a NaN measure, e.g. a task without trials, is left out, not spread).

    With one measure this is (d - s) / (r - s). It is not the mean of the per-measure ratios: a measure on which the
    references barely differ makes its ratio huge and would decide the mean alone (in the README's digits audit on its
    first machine the references' hard-clustering scores differed by 1.3 points, the wrong way round, and the mean put a
    k-WTA network at +3.7, near the robust reference, where the projection gives -0.25). The projection weighs each
    measure by its reference gap, so such a measure counts for little, and a measure on which the robust reference is
    the less aligned one still counts with the right sign.

    None too where the references are not ordered: the robust reference is not the more aligned over the shared
    measures (sum (r - s) <= 0, small or under-trained references). The line then runs from the more aligned model to
    the less aligned one, "at the standard model's level" would mean the more aligned end, and rule 5 would flag the
    best-aligned defence and pass the worst.
    """
    shared = [k for k in defence if k in standard and k in robust and all(math.isfinite(m[k]) for m in (defence, standard, robust))]
    gaps = {k: robust[k] - standard[k] for k in shared}
    scale = sum(gap * gap for gap in gaps.values())
    if scale < 1e-12 or not references_ordered(standard, robust, shared):
        return None
    return sum((defence[k] - standard[k]) * gap for k, gap in gaps.items()) / scale


def controversial_summary(result: Mapping) -> str:
    """Which model the observers favour on the controversial stimuli (``perceptual.measure.measure_controversial``'s
    result), in words: e.g. "of 5 observers, 3 favour robust, 0 defence, 2 undecided". For class-controversial
    stimuli an observer favours the model whose decisions it shares (``perceptual.class_controversial``)."""
    if result.get("objective") == "class_controversial":
        favoured = [o.get("favours") for o in result.get("observers", {}).values()]
        n_origins = result.get("n_origins")
    else:
        favoured = [f.get("favours") for f in result.get("favoured_by_observer", {}).values()]
        n_origins = max((f["n_origins"] for f in result.get("favoured_by_observer", {}).values() if "n_origins" in f), default=None)
    a, b = result["model_a"], result["model_b"]
    undecided = len(favoured) - favoured.count(a) - favoured.count(b)
    few = (f" ({n_origins} origin{'s' if n_origins != 1 else ''}: a verdict needs at least {SIGN_FLIP_MIN_N})"
           if n_origins is not None and n_origins < SIGN_FLIP_MIN_N else "")
    return f"of {len(favoured)} observers, {favoured.count(b)} favour {b}, {favoured.count(a)} {a}, {undecided} undecided{few}"


def verdict(audit: RobustnessAudit, alignment: Optional[float] = None, controversial: Optional[str] = None) -> str:
    """The one-line verdict of :data:`DECISION_RULE`; ``alignment`` is :func:`alignment_position`, ``controversial``
    :func:`controversial_summary` (both evidence only)."""
    failed = [c for c in audit.checks if c.status == "fail"]
    acc = audit.accuracy
    white = {k: acc[k] for k in ("pgd", "apgd-ce", "apgd-t", "apgd-smooth", "square", "transfer") if k in acc}
    numbers = ", ".join(f"{v:.0%} under {k}" for k, v in white.items())
    text = f"robust accuracy {acc['worst_case']:.0%} worst case ({numbers}; clean {acc['clean']:.0%})"
    if alignment is not None:
        level = "at the standard model's level" if alignment < LOW_ALIGNMENT else "near the robust model's level"
        text += f"; alignment {level} (position {alignment:.2f})"
    if controversial:
        text += f"; controversial stimuli against the robust reference: {controversial}"
    if not audit.above_chance:
        return (f"{text}: {NOT_A_CLASSIFIER} (clean accuracy not above the chance agreement of its answers, "
                f"{audit.chance_agreement:.0%}; check its weights, input range and class order)")
    if failed:
        return f"{text}: suspected gradient masking (failed: {', '.join(c.name for c in failed)})"
    if acc["worst_case"] <= UNBOUNDED_MAX:
        return f"{text}: not robust"
    if alignment is not None and alignment < LOW_ALIGNMENT:
        return f"{text}: no sign of gradient masking, but {LOW_ALIGNMENT_WARNING}"
    return f"{text}: no sign of gradient masking"


LOW_ALIGNMENT_WARNING = "low alignment predicts stronger attacks may break it"
NOT_A_CLASSIFIER = "no verdict: the defence does not classify"


def is_flagged(text: str) -> bool:
    """Rule 5 of :data:`DECISION_RULE`: suspected gradient masking, robustness without alignment, or no classifier."""
    return "suspected gradient masking" in text or LOW_ALIGNMENT_WARNING in text or NOT_A_CLASSIFIER in text


__all__ = ["Check", "DECISION_RULE", "JsonAttackStore", "RobustnessAudit", "alignment_position", "attack_suite", "audit_robustness",
           "chance_agreement", "chance_message", "check_budgets", "check_classifier", "check_eps_values",
           "check_smoothing", "clean_predictions", "controversial_summary",
           "is_above_chance", "is_flagged", "is_randomised", "masking_checks", "noise_floor", "randomness_warning", "reference_accuracy",
           "references_ordered", "verdict"]
