"""APGD-CE / APGD-T (L2, Linf), the Square attack and the per-sample worst case: the ball and the box,
exact losses on constructed logits, the step-size schedule, and agreement with ``torchattacks``."""
from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from training.attacks import AttackConfigError, ThreatModel, pgd
from training.models.defences import InputQuantised
from training.strong_attacks import (
    apgd,
    apgd_schedule,
    dlr_loss,
    dlr_targeted_loss,
    margin,
    square,
    square_l2,
    square_l2_patch,
    square_l2_proposal,
    square_linf,
    straight_through,
    worst_case,
)


@pytest.fixture(scope="module")
def digits_model(attack_test_cnn):
    """The shared digits CNN (tests/conftest.py) and the first 96 test images."""
    model, test = attack_test_cnn
    return model, test.float_images(slice(0, 96)), test.labels[:96]


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def test_dlr_losses_on_constructed_logits():
    logits = torch.tensor([[4.0, 3.0, 1.0, 0.0, -1.0], [1.0, 5.0, 2.0, 0.0, 0.0]])
    y = torch.tensor([0, 0])
    # sample 0: correct, runner-up 3, pi1 - pi3 = 4 - 1; sample 1: wrong, best other 5, pi1 - pi3 = 5 - 1
    assert torch.allclose(dlr_loss(logits, y), torch.tensor([-(4 - 3) / 3, -(1 - 5) / 4]))
    target = torch.tensor([1, 2])
    # denominators: pi1 - (pi3 + pi4) / 2 = 4 - 0.5 and 5 - 0.5
    assert torch.allclose(dlr_targeted_loss(logits, y, target), torch.tensor([-(4 - 3) / 3.5, -(1 - 2) / 4.5]))
    assert torch.equal(margin(logits, y), torch.tensor([1.0, -4.0]))
    with pytest.raises(AttackConfigError, match="at least 4 classes"):
        dlr_targeted_loss(logits[:, :3], y, target)


def test_apgd_schedule_matches_the_paper():
    assert apgd_schedule(100) == (22, 6, 3)
    assert apgd_schedule(5) == (1, 1, 1)


@pytest.mark.parametrize("norm,eps", [("l2", 0.5), ("linf", 4 / 255)])
@pytest.mark.parametrize("loss", ["ce", "dlr-targeted"])
def test_apgd_stays_in_the_ball_and_box_and_beats_pgd(digits_model, norm, eps, loss):
    model, x, y = digits_model
    threat = ThreatModel(norm, eps, steps=20)
    x_adv = apgd(model, x, y, threat, loss=loss, n_targets=3, generator=torch.Generator().manual_seed(0))
    p = 2 if norm == "l2" else math.inf
    assert (torch.linalg.vector_norm((x_adv - x).flatten(1), ord=p, dim=1) <= eps * (1 + 1e-5)).all()
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    pgd_acc = accuracy(model, pgd(model, x, y, threat, generator=torch.Generator().manual_seed(0)), y)
    apgd_acc = accuracy(model, x_adv, y)
    assert apgd_acc < accuracy(model, x, y)
    assert apgd_acc <= pgd_acc + 2 / len(y)  # at least as strong as PGD-20, up to two samples


def test_apgd_rejects_bad_settings(digits_model):
    model, x, y = digits_model
    with pytest.raises(AttackConfigError, match="unknown APGD loss"):
        apgd(model, x, y, ThreatModel("linf", 0.01), loss="hinge")
    with pytest.raises(AttackConfigError, match="at least 1"):
        apgd(model, x, y, ThreatModel("linf", 0.01), restarts=0)
    for labels in (torch.tensor([10, 11, 3, 3]), torch.tensor([-1, 3, 3, 3])):  # came back unattacked, as if misclassified
        with pytest.raises(AttackConfigError, match=r"labels must lie in 0..9 .* 1-based"):
            apgd(model, x[:4], labels, ThreatModel("linf", 0.01, steps=2))


@pytest.mark.parametrize("attack", ["pgd", "apgd", "square_linf", "square_l2", "worst_case"])
def test_labels_that_do_not_fit_the_images_are_refused_before_the_first_query(digits_model, attack):
    model, x, y = digits_model
    run = {"pgd": lambda labels: pgd(model, x[:4], labels, ThreatModel("linf", 0.01, steps=2)),
           "apgd": lambda labels: apgd(model, x[:4], labels, ThreatModel("linf", 0.01, steps=2)),
           "square_linf": lambda labels: square_linf(model, x[:4], labels, 0.01, queries=2),
           "square_l2": lambda labels: square_l2(model, x[:4], labels, 0.5, queries=2),
           # an attack of the caller's that reads no labels: (4, 1) labels broadcast to a (4, 4) mask, accuracies over 16
           "worst_case": lambda labels: worst_case(model, x[:4], labels, {"none": lambda m, a, b: a})}[attack]
    for labels in (y[:3], y[:4].float(), y[:4, None]):
        with pytest.raises(ValueError, match=r"labels must be an integer tensor of shape \(4,\), one class index per image"):
            run(labels)


@pytest.mark.parametrize("norm,eps", [("linf", 4 / 255), ("l2", 0.5)])
def test_apgd_agrees_with_torchattacks(digits_model, norm, eps):
    """Same model and 96 images: APGD-CE and APGD-T robust accuracies within 1 point of torchattacks 3.5.1
    (its port of fra31/auto-attack), 25 steps, one restart, 3 targets (seeds 0 and 0)."""
    torchattacks = pytest.importorskip("torchattacks")
    model, x, y = digits_model
    threat = ThreatModel(norm, eps, steps=25)
    norm_name = "L2" if norm == "l2" else "Linf"
    ours_ce = accuracy(model, apgd(model, x, y, threat, loss="ce", generator=torch.Generator().manual_seed(0)), y)
    theirs_ce = accuracy(model, torchattacks.APGD(model, norm=norm_name, eps=eps, steps=25, seed=0, loss="ce")(x, y), y)
    ours_t = accuracy(model, apgd(model, x, y, threat, loss="dlr-targeted", n_targets=3, generator=torch.Generator().manual_seed(0)), y)
    reference_t = torchattacks.APGDT(model, norm=norm_name, eps=eps, steps=25, seed=0, n_classes=4)  # n_classes - 1 targets
    theirs_t = accuracy(model, reference_t(x, y), y)
    print(f"{norm}: APGD-CE ours {ours_ce:.4f} torchattacks {theirs_ce:.4f}; APGD-T ours {ours_t:.4f} torchattacks {theirs_t:.4f}")
    assert abs(ours_ce - theirs_ce) <= 0.01 + 1e-9, (ours_ce, theirs_ce)
    assert abs(ours_t - theirs_t) <= 0.01 + 1e-9, (ours_t, theirs_t)


def test_square_is_gradient_free_stays_in_the_ball_and_fools(digits_model):
    model, x, y = digits_model
    eps = 8 / 255
    x_adv = square_linf(model, x, y, eps, queries=300, generator=torch.Generator().manual_seed(0))
    assert ((x_adv - x).abs().amax(dim=(1, 2, 3)) <= eps + 1e-6).all()
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    assert accuracy(model, x_adv, y) < accuracy(model, x, y) - 0.1


def test_square_beats_pgd_on_a_masked_gradient(digits_model):
    """Input quantisation (round to 8 levels) has a zero gradient: PGD cannot move, Square can."""
    model, x, y = digits_model

    class Quantised(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, z):
            return self.inner(torch.round(z * 7) / 7)

    masked = Quantised(model).eval()
    eps = 16 / 255
    pgd_acc = accuracy(masked, pgd(masked, x, y, ThreatModel("linf", eps, steps=10), generator=torch.Generator().manual_seed(0)), y)
    square_acc = accuracy(masked, square_linf(masked, x, y, eps, queries=300, generator=torch.Generator().manual_seed(0)), y)
    assert square_acc < pgd_acc - 0.1, (square_acc, pgd_acc)


def test_worst_case_is_the_per_sample_intersection(digits_model):
    model, x, y = digits_model
    flips_first = lambda m, a, b: torch.where(torch.arange(len(a)).view(-1, 1, 1, 1) < 10, torch.zeros_like(a), a)  # noqa: E731
    identity = lambda m, a, b: a  # noqa: E731
    result = worst_case(model, x, y, {"none": identity, "blank": flips_first})
    with torch.no_grad():
        clean = model(x).argmax(1) == y
        blank = model(torch.zeros_like(x[:1])).argmax(1)
    assert torch.equal(result.clean, clean)
    expected = clean & ((torch.arange(len(y)) >= 10) | (blank == y))
    assert torch.equal(result.robust, expected)
    assert result.accuracies()["worst_case"] == pytest.approx(float(expected.float().mean()))


def test_square_l2_patch_is_unit_norm_with_opposite_halves():
    patch = square_l2_patch(5, transpose=False)
    assert patch.shape == (5, 5) and float(patch.norm()) == pytest.approx(1.0)
    assert (patch[:2] > 0).all() and (patch[2:] < 0).all()
    assert torch.equal(square_l2_patch(5, transpose=True), patch.T)


@pytest.mark.parametrize("second", [(6, 1), (3, 4), (2, 2)], ids=["apart", "overlapping", "same"])
def test_square_l2_proposal_moves_both_windows_mass_into_the_first_per_channel(second):
    # auto-attack's square.py takes the windows' norm per channel (sum over H and W): a perturbation of norm eps keeps it.
    # One norm over all channels grew the proposal towards sqrt(C) times the windows' mass before the final rescale.
    generator = torch.Generator().manual_seed(0)
    eps, side, first = 0.5, 3, (2, 2)
    delta = torch.randn(4, 3, 10, 10, generator=generator)
    delta *= torch.tensor([1.0, 5.0, 0.2]).view(1, 3, 1, 1)  # channels of different mass
    delta = eps * delta / delta.flatten(1).norm(dim=1).view(-1, 1, 1, 1)
    patch = square_l2_patch(side, transpose=False) * torch.randint(0, 2, (4, 3, 1, 1), generator=generator).mul(2).sub(1)
    new = square_l2_proposal(delta, first, second, side, patch, eps)
    assert torch.allclose(new.flatten(1).norm(dim=1), torch.full((4,), eps), rtol=1e-5)
    in_windows = torch.zeros(10, 10, dtype=torch.bool)
    in_windows[2:5, 2:5] = in_windows[second[0]:second[0] + side, second[1]:second[1] + side] = True
    channel_mass = lambda d: d.pow(2).sum(dim=(2, 3))  # noqa: E731
    assert torch.allclose(channel_mass(new * in_windows), channel_mass(delta * in_windows), rtol=1e-5)  # per channel
    assert torch.equal(new[..., ~in_windows], delta[..., ~in_windows])  # nothing else moves
    if second != first:
        outside_first = in_windows.clone()
        outside_first[2:5, 2:5] = False
        assert (new[..., outside_first] == 0).all()
    # with room left in the ball, the first window takes that room too, shared equally by the channels
    smaller = square_l2_proposal(delta / 2, first, second, side, patch, eps)
    expected = channel_mass(delta / 2 * in_windows) + (eps ** 2 - (eps / 2) ** 2) / 3
    assert torch.allclose(channel_mass(smaller[..., 2:5, 2:5]), expected, rtol=1e-5)
    with pytest.raises(ValueError, match=r"the second window at \(top, left\) = \(8, 0\) with side 3 does not fit a 10x10 image"):
        square_l2_proposal(delta, first, (8, 0), side, patch, eps)
    with pytest.raises(ValueError, match=r"patch must be \(N, C, side, side\) = \(4, 3, 3, 3\)"):
        square_l2_proposal(delta, first, second, side, patch[:2], eps)
    with pytest.raises(ValueError, match=r"delta must be a \(N, C, H, W\) perturbation"):
        square_l2_proposal(delta[0], first, second, side, patch, eps)


def test_square_l2_stays_in_the_ball_and_fools(digits_model):
    model, x, y = digits_model
    eps = 1.0
    x_adv = square(model, x, y, "l2", eps, queries=200, generator=torch.Generator().manual_seed(0))
    assert (torch.linalg.vector_norm((x_adv - x).flatten(1), dim=1) <= eps * (1 + 1e-4)).all()
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    assert accuracy(model, x_adv, y) < accuracy(model, x, y) - 0.1
    with pytest.raises(AttackConfigError, match="queries"):
        square_l2(model, x, y, eps, queries=0)


def test_bpda_straight_through_beats_pgd_on_quantised_input(digits_model):
    """Rounding to 8 levels has a zero gradient: PGD stalls; the same PGD with the identity as the rounding's
    gradient (BPDA) breaks the defence, and the hook is gone after the block."""
    model, x, y = digits_model
    quantised = InputQuantised(model, levels=8).eval()
    threat = ThreatModel("linf", 16 / 255, steps=10)
    plain = accuracy(quantised, pgd(quantised, x, y, threat, generator=torch.Generator().manual_seed(0)), y)
    with straight_through(quantised, "quantise"):
        x_bpda = pgd(quantised, x, y, threat, generator=torch.Generator().manual_seed(0))
    assert accuracy(quantised, x_bpda, y) < plain - 0.2, (accuracy(quantised, x_bpda, y), plain)
    assert not quantised.quantise._forward_hooks
    with pytest.raises(AttackConfigError, match="no submodule"):
        with straight_through(quantised, "quantize"):
            pass


def test_worst_case_store_skips_finished_attacks(digits_model):
    model, x, y = digits_model
    saved = {}

    class Store:
        def load(self, name):
            return saved.get(name)

        def save(self, name, correct):
            saved[name] = correct.clone()

    first = worst_case(model, x, y, {"none": lambda m, a, b: a}, store=Store())

    def boom(m, a, b):
        raise AssertionError("a stored attack ran again")

    second = worst_case(model, x, y, {"none": boom}, store=Store())
    assert torch.equal(first.robust, second.robust)


class Staircase(torch.nn.Module):
    """Two classes decided by the mean of the input rounded to ``levels`` steps: autograd's gradient is zero
    everywhere (round's), while the loss jumps between steps, the shape of k-WTA's discontinuities at its extreme."""

    def __init__(self, levels: int = 4, threshold: float = 0.45, scale: float = 40.0):
        super().__init__()
        self.levels, self.threshold, self.scale = levels, threshold, scale

    def forward(self, x):
        score = self.scale * ((x * self.levels).round().flatten(1).mean(1) / self.levels - self.threshold)
        return torch.stack([score, -score], dim=1)


def test_smoothed_gradient_estimate_matches_a_linear_loss():
    """On a linear loss the antithetic estimate is unbiased: many directions recover the true gradient."""
    from training.strong_attacks import smoothed_loss_grad
    weight = torch.randn(1, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 1, bias=False))
    model[1].weight.data = weight.flatten(1)
    x = torch.full((2, 3, 4, 4), 0.5)
    loss, grad, logits = smoothed_loss_grad(model, x, lambda z: z[:, 0], sigma=0.01, samples=8000, generator=torch.Generator().manual_seed(1),
                                            max_batch=4096)
    cosine = torch.nn.functional.cosine_similarity(grad.flatten(1), weight.flatten(1).expand(2, -1))
    assert (cosine > 0.97).all(), cosine
    assert torch.allclose(loss, logits[:, 0], atol=1e-3)  # the mean noisy loss of a linear loss is its value at x


def test_smoothed_gradient_apgd_breaks_a_loss_without_useful_gradients():
    """Autograd sees a zero gradient on every step of the staircase, so APGD-CE cannot move; the query-based
    smoothed gradient sees the steps and fools every sample."""
    model = Staircase()
    x = torch.full((8, 1, 6, 6), 0.5) + 0.02 * torch.rand(8, 1, 6, 6, generator=torch.Generator().manual_seed(0))
    y = torch.zeros(8, dtype=torch.long)
    assert accuracy(model, x, y) == 1.0
    threat = ThreatModel("linf", 0.15, steps=20)
    plain = apgd(model, x, y, threat, generator=torch.Generator().manual_seed(0))
    smooth = apgd(model, x, y, threat, smoothing_sigma=0.15, smoothing_samples=64, generator=torch.Generator().manual_seed(0))
    assert accuracy(model, plain, y) == 1.0
    assert accuracy(model, smooth, y) == 0.0
    assert (smooth - x).abs().max() <= 0.15 + 1e-6 and smooth.min() >= 0 and smooth.max() <= 1


def test_smoothed_gradient_settings_are_checked(digits_model):
    model, x, y = digits_model
    with pytest.raises(AttackConfigError, match="smoothing_sigma must be >= 0"):
        apgd(model, x[:2], y[:2], ThreatModel("linf", 0.03, steps=2), smoothing_sigma=-0.1)
    with pytest.raises(AttackConfigError, match="smoothing_samples >= 2"):
        apgd(model, x[:2], y[:2], ThreatModel("linf", 0.03, steps=2), smoothing_sigma=0.03, smoothing_samples=1)


@pytest.mark.parametrize("loss", ["ce", "dlr-targeted"])
def test_apgd_keeps_the_strongest_point_of_all_its_runs_for_a_sample_it_did_not_fool(digits_model, monkeypatch, loss):
    """Each later run used to overwrite the point of an unfooled sample: the last run's best, not the best found."""
    import training.strong_attacks as strong

    model, x, y = digits_model
    runs = []
    single_run = strong._apgd_single_run

    def recorded(model, x, y, threat, loss_of, loss_grad, generator, highest_loss=False):
        out = single_run(model, x, y, threat, loss_of, loss_grad, generator, highest_loss)
        runs.append((out[0], loss_of))
        return out

    monkeypatch.setattr(strong, "_apgd_single_run", recorded)
    with torch.no_grad():
        right = model(x).argmax(1) == y
    x, y = x[right], y[right]
    threat = ThreatModel("linf", 0.01 / 255, steps=4)  # too small a ball to fool anything
    adv = apgd(model, x, y, threat, loss=loss, restarts=4, n_targets=2, generator=torch.Generator().manual_seed(0))
    assert [point.shape[0] for point, _ in runs] == [len(x)] * (4 if loss == "ce" else 8)  # nothing fooled: every run saw every sample
    with torch.no_grad():  # one loss: the highest of the runs; several targets' losses do not compare: the smallest margin
        strength = torch.stack([loss_of(model(point)) if loss == "ce" else -margin(model(point), y) for point, loss_of in runs])
    strongest = torch.stack([point for point, _ in runs])[strength.argmax(0), torch.arange(len(x))]
    assert torch.equal(adv, strongest)


@pytest.mark.parametrize("steps", [5, 10, 20])
def test_apgd_keeps_its_step_while_the_loss_rises_at_every_step(monkeypatch, steps):
    """Croce and Hein's condition 1 counts the k steps since the last checkpoint, the first against the start point:
    a loss that rises at every step never halves the step. Without the start point's loss the first checkpoint
    counted k - 1 rises against a threshold of 0.75 k and halved every run of 5 to 22 steps."""
    import training.strong_attacks as strong_attacks

    class RisingLoss(torch.nn.Module):  # the cross-entropy of class 0 rises with every call, whatever the image
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            z0 = 1e-3 * x.flatten(1).sum(1) - 0.1 * self.calls
            return torch.stack([z0, torch.zeros_like(z0), torch.zeros_like(z0)], 1)

    step_sizes = []

    class RecordingLinfStep(strong_attacks.LinfStep):
        def step(self, x, grad, state):
            step_sizes.append(float(self.step_size[0]))
            return super().step(x, grad, state)

    monkeypatch.setattr(strong_attacks, "LinfStep", RecordingLinfStep)
    x, y = torch.full((1, 3, 4, 4), 0.5), torch.tensor([0])
    strong_attacks._apgd_single_run(RisingLoss(), x, y, ThreatModel("linf", 0.01, steps=steps), strong_attacks._loss_fn("ce", y, None),
                                    partial(strong_attacks._loss_grad, eot_samples=1), torch.Generator().manual_seed(0))
    assert step_sizes == [pytest.approx(0.02)] * steps


def test_strong_attacks_run_the_model_in_eval_mode_and_give_its_modes_back(digits_model):
    """A model still in training mode had its batch-norm statistics updated by its own audit, and was judged on batch
    statistics; a frozen batch norm stays frozen afterwards."""
    model, x, y = digits_model
    model.train()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    norms[0].eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    threat = ThreatModel("linf", 4 / 255, steps=3)
    try:
        result = worst_case(model, x[:16], y[:16], {"apgd": lambda m, a, b: apgd(m, a, b, threat),
                                                    "square": lambda m, a, b: square(m, a, b, "linf", 4 / 255, queries=5)})
        assert model.training and not norms[0].training and all(m.training for m in norms[1:])
    finally:
        model.eval()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert result.accuracies()["clean"] == accuracy(model, x[:16], y[:16])


def test_square_attacks_take_images_wider_or_taller_than_the_square():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 16, 10)).eval()
    x = torch.rand(4, 3, 64, 16)
    y = model(x).argmax(1).detach()
    for attack, eps, norm in ((square_linf, 8 / 255, "linf"), (square_l2, 0.5, "l2")):
        adv = attack(model, x, y, eps, queries=20, generator=torch.Generator().manual_seed(0))  # the side is bounded by min(h, w)
        distance = (adv - x).abs().amax(dim=(1, 2, 3)) if norm == "linf" else (adv - x).flatten(1).norm(dim=1)
        assert (distance <= eps + 1e-5).all() and adv.shape == x.shape
        adv = attack(model, x.transpose(2, 3).contiguous(), y, eps, queries=20, generator=torch.Generator().manual_seed(0))
        assert adv.shape == (4, 3, 16, 64)


def test_apgd_every_image_attacks_what_the_surrogate_gets_wrong_and_keeps_the_highest_loss(digits_model):
    """The transfer attack's setting: images the surrogate misclassifies clean were returned unperturbed, and a fooled
    image's point was the first fooling one, not its highest-loss one (so the transfer was weaker than it is)."""
    model, x, y = digits_model
    threat = ThreatModel("linf", 4 / 255, steps=10)
    with torch.no_grad():
        wrong = model(x).argmax(1) != y
    assert wrong.any()  # the shared CNN misclassifies some clean test images
    default = apgd(model, x, y, threat, loss="ce", generator=torch.Generator().manual_seed(0))
    every = apgd(model, x, y, threat, loss="ce", every_image=True, generator=torch.Generator().manual_seed(0))
    moved = lambda adv: (adv - x).flatten(1).abs().amax(1) > 0  # noqa: E731
    assert not moved(default)[wrong].any() and moved(every).all()
    assert ((every - x).abs() <= 4 / 255 + 1e-6).all() and every.min() >= 0 and every.max() <= 1
    with torch.no_grad():
        ce = lambda adv: torch.nn.functional.cross_entropy(model(adv), y, reduction="none")  # noqa: E731
        assert ce(every).mean() > ce(default).mean()


def test_apgd_t_on_every_image_targets_the_best_scoring_wrong_classes_of_a_misclassified_image(digits_model, monkeypatch):
    """The reference's targets (the 2nd, 3rd ... clean classes) assume the top class is the label; for an image the
    model gets wrong, every_image attacked the label itself as a target and never the top wrong class."""
    import training.strong_attacks as strong

    model, x, _ = digits_model
    with torch.no_grad():
        ranked = model(x[:6]).sort(dim=1, descending=True).indices
    labels = ranked[:, 1]  # every image misclassified: its top class is wrong
    targets = []
    loss_fn = strong._loss_fn
    monkeypatch.setattr(strong, "_loss_fn", lambda loss, y, target: targets.append(target) or loss_fn(loss, y, target))
    apgd(model, x[:6], labels, ThreatModel("linf", 1 / 255, steps=1), loss="dlr-targeted", n_targets=2, every_image=True)
    assert torch.equal(targets[0], ranked[:, 0]) and torch.equal(targets[1], ranked[:, 2])
    # a correctly classified image keeps the reference's targets
    targets.clear()
    apgd(model, x[:6], ranked[:, 0], ThreatModel("linf", 1 / 255, steps=1), loss="dlr-targeted", n_targets=2, every_image=True)
    assert torch.equal(targets[0], ranked[:, 1]) and torch.equal(targets[1], ranked[:, 2])


def test_a_float64_model_is_attacked_with_float64_losses():
    from training.strong_attacks import _loss_grad, _losses_of_copies

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 5)).double()
    x, y = torch.rand(3, 3, 2, 2, dtype=torch.float64), torch.tensor([0, 1, 2])
    loss_of = lambda logits: torch.nn.functional.cross_entropy(logits, y, reduction="none")  # noqa: E731
    assert _loss_grad(model, x, loss_of, eot_samples=1)[0].dtype == torch.float64  # was float32: rounding decided the best point
    assert _losses_of_copies(model, torch.cat([x, x]), loss_of, 2).dtype == torch.float64
    half = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 5)).to(torch.bfloat16)
    assert _loss_grad(half, x.to(torch.bfloat16), loss_of, eot_samples=1)[0].dtype == torch.float32


def test_worst_case_logs_the_accuracy_it_reports(digits_model, caplog):
    """The log counted an image the model gets wrong clean as robust when the attack left it wrong... or right: a
    randomised model's log read above its clean accuracy. It now counts as accuracies() does."""
    model, x, y = digits_model
    identity = lambda m, a, b: a  # noqa: E731
    flipped = {"calls": 0}

    def predict(images):  # the second look at the same images answers right everywhere: a randomised model's luck
        flipped["calls"] += 1
        with torch.no_grad():
            return model(images).argmax(1) if flipped["calls"] == 1 else y.clone()

    with caplog.at_level("INFO", logger="training.strong_attacks"):
        result = worst_case(model, x, y, {"none": identity}, predict=predict)
    assert f"none: accuracy {result.accuracies()['none']:.3f}" in caplog.text
    assert result.accuracies()["none"] < 1.0
