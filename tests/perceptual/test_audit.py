"""The audit's masking checks and verdict on constructed numbers, and on real digits models: a standard and a
PGD-trained model are not flagged, the standard model behind input quantisation (a zero gradient) is, and (slow)
a PGD-trained k-WTA CNN is; the per-attack cache; the report's layout."""
from __future__ import annotations

import math
import re

import pytest
import torch

import perceptual.audit as audit_module
from perceptual.audit import (
    DECISION_RULE,
    alignment_position,
    audit_robustness,
    chance_agreement,
    chance_message,
    check_classifier,
    clean_predictions,
    controversial_summary,
    is_above_chance,
    is_flagged,
    masking_checks,
    noise_floor,
    references_ordered,
    verdict,
)
from perceptual.audit_report import audit_html, audit_markdown
from perceptual.cache import module_identity
from training.models.defences import InputQuantised


@pytest.fixture(scope="module")
def digits(attack_test_cnn):
    """The shared digits CNN (tests/conftest.py) and the first 64 test images."""
    model, test = attack_test_cnn
    return model, test.float_images(slice(0, 64)), test.labels[:64]


class Noisy(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, z):
        return self.inner((z + 0.05 * torch.randn_like(z)).clamp(0, 1))


def test_checks_and_verdict_on_constructed_numbers():
    masked = {"clean": 0.9, "fgsm": 0.7, "pgd": 0.61, "apgd-ce": 0.6, "apgd-t": 0.6, "square": 0.08, "transfer": 0.3, "worst_case": 0.08}
    checks = {c.name: c for c in masking_checks(masked, {"unbounded_attack_succeeds": True}, 0.0, False, 1)}
    assert checks["black_box_not_stronger"].status == "fail" and "square 8.0%" in checks["black_box_not_stronger"].detail
    assert checks["pgd_not_overestimating"].status == "fail"
    assert checks["multi_step_beats_single_step"].status == "pass"
    assert checks["randomness_handled"].status == "n.a."
    assert checks["smoothed_gradient_not_stronger"].status == "n.a."
    shattered = {c.name: c for c in masking_checks(dict(masked, **{"apgd-smooth": 0.2}), {}, 0.0, False, 1)}["smoothed_gradient_not_stronger"]
    assert shattered.status == "fail" and "smoothed-gradient APGD 20.0%" in shattered.detail and "gap +40.0%" in shattered.detail
    assert {c.name: c.status for c in masking_checks(dict(masked, **{"apgd-smooth": 0.57}), {}, 0.0, False, 1)}["smoothed_gradient_not_stronger"] == "pass"
    honest = dict(masked, square=0.58, transfer=0.7, worst_case=0.57)
    assert {c.name: c.status for c in masking_checks(honest, {}, 0.0, False, 1)}["black_box_not_stronger"] == "pass"
    assert masking_checks(honest, {}, 0.0, True, 1)[-1].status == "fail"
    assert masking_checks(honest, {}, 0.0, True, 4)[-1].status == "pass"
    # the eps where robust accuracy peaks above clean, not the whole ladder after "at"
    sweep = {"eps": [1 / 255, 2 / 255, 4 / 255, 8 / 255], "accuracy": [0.5, 0.55, 0.6, 0.4], "loss": [0.1] * 4, "clean_accuracy": 0.5, "clean_loss": 0.1}
    below = {c.name: c for c in masking_checks(honest, {"robust_below_clean": False}, 0.0, False, 1, masking=sweep)}["robust_below_clean"]
    assert below.status == "fail" and below.detail == "clean 50.0%, highest PGD accuracy 60.0% at eps 0.0157 (swept: 0.00392, 0.00784, 0.0157, 0.0314)"
    assert alignment_position({"2afc": 0.6}, {"2afc": 0.5}, {"2afc": 0.9}) == pytest.approx(0.25)
    assert alignment_position({"2afc": 0.6}, {"2afc": 0.5}, {"2afc": 0.5}) is None
    # a NaN measure (a task without trials) made the position NaN, which the verdict read as "near the robust model's level"
    assert alignment_position({"2afc": 0.5, "clustering": math.nan}, {"2afc": 0.5, "clustering": 0.3}, {"2afc": 0.9, "clustering": 0.5}) == 0.0
    assert alignment_position({"2afc": math.nan}, {"2afc": 0.5}, {"2afc": 0.9}) is None
    assert "0.5" in DECISION_RULE and "5%" in DECISION_RULE


def test_alignment_position_projects_on_the_reference_line():
    standard, robust = {"2afc": 0.0, "clustering": 0.3, "clustering_hard": 0.36}, {"2afc": 0.2, "clustering": 0.5, "clustering_hard": 0.38}
    assert alignment_position(standard, standard, robust) == pytest.approx(0.0)
    assert alignment_position(robust, standard, robust) == pytest.approx(1.0)
    # The digits k-WTA case: a 2-point reference gap on hard clustering. Per-measure ratios 0, -0.32 and -6.5 (mean -2.27);
    # the projection weighs each by its gap: (0 * 0.2 - 0.064 * 0.2 - 0.13 * 0.02) / (0.04 + 0.04 + 0.0004).
    defence = {"2afc": 0.0, "clustering": 0.236, "clustering_hard": 0.23}
    assert alignment_position(defence, standard, robust) == pytest.approx((-0.064 * 0.2 - 0.13 * 0.02) / 0.0804)
    assert -0.5 < alignment_position(defence, standard, robust) < 0
    # A measure on which the robust reference is the less aligned one keeps its sign: a defence that equals the robust model
    # is at 1, and one that moves the other way on that measure alone is below 1.
    mixed_standard, mixed_robust = {"a": 0.5, "b": 0.6}, {"a": 0.9, "b": 0.4}
    assert alignment_position(mixed_robust, mixed_standard, mixed_robust) == pytest.approx(1.0)
    assert alignment_position({"a": 0.9, "b": 0.8}, mixed_standard, mixed_robust) == pytest.approx((0.4 * 0.4 + 0.2 * -0.2) / 0.2)
    # Only the measures all three share count; none usable gives None.
    assert alignment_position({"a": 0.9, "c": 0.0}, {"a": 0.5, "b": 0.0}, {"a": 0.9, "b": 1.0, "c": 5.0}) == pytest.approx(1.0)
    assert alignment_position({"c": 0.1}, {"a": 0.5}, {"a": 0.9}) is None


def test_references_in_the_wrong_order_give_no_position_and_no_flag():
    """With the robust reference the less aligned one, the position line ran the other way: a defence as aligned as the
    standard model (the best) sat at 0, "at the standard model's level", and was flagged; one below both passed."""
    standard, robust = {"2afc": 0.80, "clustering": 0.70, "clustering_hard": 0.50}, {"2afc": 0.60, "clustering": 0.55, "clustering_hard": 0.40}
    assert not references_ordered(standard, robust) and references_ordered(robust, standard)
    assert alignment_position(standard, standard, robust) is None
    assert alignment_position({"2afc": 0.3, "clustering": 0.3, "clustering_hard": 0.3}, standard, robust) is None
    clean = audit_module.RobustnessAudit("linf", 0.03, 10, {"clean": 0.9, "pgd": 0.5, "fgsm": 0.5, "worst_case": 0.5}, False, 1, {})
    text = verdict(clean, alignment_position(standard, standard, robust))
    assert not is_flagged(text) and text.endswith("no sign of gradient masking")


def test_check_classifier_rejects_non_classifiers():
    x = torch.rand(2, 3, 8, 8)
    with pytest.raises(TypeError, match="nn.Module"):
        check_classifier(lambda z: z, x)
    with pytest.raises(ValueError, match="logits"):
        check_classifier(torch.nn.Identity(), x)
    probs = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 10), torch.nn.Softmax(dim=1))
    with pytest.raises(ValueError, match="probabilities"):
        check_classifier(probs, x)
    log_probs = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 10), torch.nn.LogSoftmax(dim=1))
    with pytest.raises(ValueError, match="log-probabilities"):
        check_classifier(log_probs, x)
    with pytest.raises(ValueError, match="failed on a batch"):
        check_classifier(torch.nn.Linear(5, 10), x)
    with pytest.raises(ValueError, match="3 scores but the data set has 10"):
        check_classifier(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 3)), x, n_classes=10)
    with pytest.raises(ValueError, match="outputs 3 class scores; the audit's APGD-T .targeted DLR loss. needs at least 4"):
        check_classifier(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 3)), x)


def test_bad_eps_lists_and_too_few_classes_are_refused_before_any_attack_runs(digits, monkeypatch):
    """A bad sweep or masking eps was named only after every attack at eps had run; a 3-class model after FGSM, PGD and
    APGD-CE, when APGD-T started."""
    ran = []
    for name in ("fgsm", "pgd", "apgd", "square"):
        monkeypatch.setattr(audit_module, name, lambda *args, _name=name, **kwargs: ran.append(_name))
    model, x, y = digits
    for bad, match in ((dict(sweep_eps=[4 / 255, 8]), "sweep_eps: "), (dict(masking_eps=[8]), "masking_eps: ")):
        with pytest.raises(ValueError, match=match):
            audit_robustness(model, x[:4], y[:4], "linf", 4 / 255, steps=1, square_queries=1, smoothing_samples=0, **bad)
    three = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 3))
    with pytest.raises(ValueError, match="needs at least 4 classes"):
        audit_robustness(three, x[:4], y[:4] % 3, "linf", 4 / 255, steps=1, square_queries=1, smoothing_samples=0)
    assert ran == []


def test_on_a_randomised_defence_prediction_noise_does_not_fail_pgd_not_overestimating():
    """PGD's accuracy is one random prediction per image, the worst case ANDs one per attack: on a noisy defence with
    no masking PGD stood 14 points above the worst case from noise alone, and the defence was flagged."""
    noisy = {"clean": 0.84, "fgsm": 0.83, "pgd": 0.83, "apgd-ce": 0.82, "apgd-t": 0.82, "square": 0.83, "worst_case": 0.69}
    strict = {c.name: c for c in masking_checks(noisy, {}, 0.0, True, 8)}["pgd_not_overestimating"]
    assert strict.status == "fail"  # without the floor: the old verdict
    check = {c.name: c for c in masking_checks(noisy, {}, 0.0, True, 8, noise_floor=0.70)}["pgd_not_overestimating"]
    assert check.status == "pass" and "limit 10% + 14.0% prediction noise" in check.detail
    masked = dict(noisy, pgd=0.83, worst_case=0.40)  # far beyond the noise: still a failure
    assert {c.name: c for c in masking_checks(masked, {}, 0.0, True, 8, noise_floor=0.70)}["pgd_not_overestimating"].status == "fail"


def test_the_transfer_attack_perturbs_images_the_reference_gets_wrong(digits):
    from perceptual.audit import attack_suite

    model, x, y = digits
    reference = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))  # untrained: wrong on most images
    with torch.no_grad():
        wrong = reference(x).argmax(1) != y
    transfer = attack_suite(model, "linf", 4 / 255, steps=3, reference=reference)["transfer"]
    moved = (transfer(model, x, y) - x).flatten(1).abs().amax(1) > 0
    assert wrong.any() and moved[wrong].all()  # they went to the defence unperturbed


def test_a_stored_transfer_result_of_the_old_attack_is_recomputed(tmp_path):
    from perceptual.audit import JsonAttackStore
    from training.io import atomic_write_json

    store = JsonAttackStore(tmp_path, "key")
    for name in ("transfer", "pgd"):  # as the audit stored them before the transfer attack changed
        atomic_write_json(tmp_path / f"{name}.json", {"key": "key", "attack": name, "correct": [True, False]})
    assert store.load("transfer") is None and store.load("pgd").tolist() == [True, False]
    store.save("transfer", torch.tensor([False, False]))
    assert store.load("transfer").tolist() == [False, False]


@pytest.mark.gpu
def test_check_classifier_names_probabilities_from_a_cuda_defence():
    """The rows were compared with ones made on the CPU: a device error instead of the advice."""
    probs = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 10), torch.nn.Softmax(dim=1)).cuda()
    with pytest.raises(ValueError, match="probabilities"):
        check_classifier(probs, torch.rand(2, 3, 8, 8, device="cuda"))


def test_bad_smoothing_settings_are_refused_before_any_attack_runs(digits, monkeypatch):
    import perceptual.audit as audit_module

    ran = []
    monkeypatch.setattr(audit_module, "fgsm", lambda *args, **kwargs: ran.append("fgsm"))
    model, x, y = digits
    x, y = x[:4], y[:4]
    for samples, sigma in ((1, None), (-2, None), (8, 0.0), (8, float("nan"))):
        with pytest.raises(ValueError, match="smoothing.samples must be 0 .off. or at least 2 and smoothing.sigma null or > 0"):
            audit_robustness(model, x, y, "linf", 4 / 255, steps=1, square_queries=1, smoothing_samples=samples, smoothing_sigma=sigma)
    assert ran == []


def test_standard_model_is_not_flagged_and_quantised_one_is(digits, tmp_path):
    """Measured (seed 0, 24 images, shared loaded CPU, 40 s): standard "0% worst case ... not robust"; quantised
    "8% worst case (38% under pgd, 25% under square, 8% under transfer)": suspected gradient masking."""
    model, x, y = digits
    eps = 8 / 255
    kwargs = dict(steps=8, square_queries=150, n_targets=1, masking_eps=[2 / 255, 8 / 255], unbounded_steps=10, smoothing_samples=16)
    x, y = x[:24], y[:24]
    plain = audit_robustness(model, x, y, "linf", eps, **kwargs)
    plain_verdict = verdict(plain)
    assert not is_flagged(plain_verdict), plain_verdict
    masked = audit_robustness(InputQuantised(model, levels=8), x, y, "linf", eps, reference=model, **kwargs)
    masked_verdict = verdict(masked, alignment=0.1)
    assert is_flagged(masked_verdict), masked_verdict
    assert "at the standard model's level" in masked_verdict
    failed = {c.name for c in masked.checks if c.status == "fail"}
    assert "black_box_not_stronger" in failed
    report = {"verdict": masked_verdict, "flagged": True, "robustness": masked.to_dict()}
    text = audit_markdown(report)
    assert text.index("Verdict") < text.index("Masking checks") and "| square |" in text
    page = audit_html(report)
    assert page.index("Verdict") < page.index("Masking checks") and "suspected gradient masking" in page
    # the page is audit.md's content, every section and table of it, with the verdict boxed and the checks coloured
    assert all(f"<h2>{h}</h2>" in page for h in re.findall(r"^## (.+)$", text, flags=re.MULTILINE))
    assert page.count("<table>") == len(re.findall(r"^\|---", text, flags=re.MULTILINE)) >= 3
    assert '<p class="verdict"><strong>Verdict:</strong>' in page
    for status, name in (("fail", "fail"), ("pass", "pass"), ("n.a.", "na")):
        assert page.count(f'<tr class="{name}">') == sum(c.status == status for c in masked.checks)


def test_rule_0_a_classifier_must_beat_the_chance_agreement_of_its_answers():
    y = torch.arange(10).repeat(2)  # 20 labels, 2 per class
    assert chance_agreement(torch.full((20,), 3), y) == pytest.approx(0.1)  # a constant answer: its class's share
    assert chance_agreement(y.roll(1), y) == pytest.approx(0.1)  # uniform answers, uniform labels: 1/10
    assert chance_agreement(torch.zeros(4, dtype=torch.long), torch.tensor([0, 0, 1, 1])) == pytest.approx(0.5)
    assert not is_above_chance(torch.full((20,), 3), y)  # right on 2 of 20, its chance agreement exactly
    half_right = torch.where(torch.arange(20) < 10, y, (y + 1) % 10)
    assert is_above_chance(half_right, y)  # 10 of 20 against 10 %: p = 7e-6
    three_right = torch.where(torch.arange(20) < 3, y, (y + 1) % 10)
    assert not is_above_chance(three_right, y)  # 3 of 20 against 10 %: p = 0.32
    assert not is_above_chance(torch.ones(8, dtype=torch.long), torch.ones(8, dtype=torch.long))  # one class only: nothing to beat
    # a perfect defence on too few images, or on one class, was told to check its weights, input range and class order
    assert "all have one label" in chance_message(torch.ones(8, dtype=torch.long), torch.ones(8, dtype=torch.long))
    three = torch.tensor([0, 1, 2])
    assert not is_above_chance(three, three) and "3 images are too few for the test" in chance_message(three, three)
    assert is_above_chance(torch.arange(4), torch.arange(4))  # 4 of 4 against 1/4: p = 0.004
    assert "Check the weights" in chance_message(torch.full((20,), 3), y)
    with pytest.raises(ValueError, match="one answer per label"):
        chance_agreement(torch.zeros(3, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="class indices >= 0"):
        chance_agreement(torch.zeros(4, dtype=torch.long), torch.full((4,), -1))  # Gaussian targets' label
    with pytest.raises(ValueError, match=r"alpha .* must lie in \(0, 1\)"):
        is_above_chance(half_right, y, alpha=5)


def test_clean_predictions_refuse_bad_images_and_budgets(digits):
    model, x, _ = digits
    assert torch.equal(clean_predictions(model, x[:8]), model(x[:8]).argmax(1))
    with pytest.raises(ValueError, match=r"audited images .*\[0, 1\]"):
        clean_predictions(model, x[:8] * 255)
    with pytest.raises(ValueError, match="eot must be an integer >= 1"):
        clean_predictions(model, x[:8], eot_samples=0)


class Constant(torch.nn.Module):
    """Answers class 3 for every image (a classifier whose weights did not load)."""

    def forward(self, x):
        return torch.nn.functional.one_hot(torch.full((len(x),), 3), 10).float() * 5 + 0 * x.mean()


def test_a_constant_classifier_gets_no_verdict_and_is_flagged(digits):
    model, x, y = digits
    kwargs = dict(steps=2, square_queries=5, n_targets=1, masking_eps=[4 / 255], unbounded_steps=2, smoothing_samples=0)
    broken = audit_robustness(Constant(), x, y, "linf", 8 / 255, **kwargs)
    assert broken.accuracy["clean"] == broken.accuracy["worst_case"] == float((y == 3).float().mean())  # no attack lowers it
    assert not broken.above_chance and broken.chance_agreement == pytest.approx(float((y == 3).float().mean()))
    text = verdict(broken)
    assert "no verdict: the defence does not classify" in text and is_flagged(text)
    assert "does not classify these images" in broken.warnings[0]
    report = {"verdict": text, "flagged": True, "warnings": broken.warnings, "robustness": broken.to_dict()}
    note = f"chance agreement of the clean answers {broken.chance_agreement:.1%} (rule 0)"
    assert note in audit_markdown(report) and note in audit_html(report)
    two = {**report, "warnings": ["first thing", "second thing"]}
    assert audit_html(two).count("<blockquote>") == 2  # each warning a paragraph of its own, not run together
    working = audit_robustness(model, x[:16], y[:16], "linf", 8 / 255, **kwargs)  # the weakly trained CNN, 7 of 16 right
    assert working.above_chance is True and "does not classify" not in verdict(working)


def test_randomised_defence_is_detected(digits):
    model, x, y = digits
    audit = audit_robustness(Noisy(model), x[:16], y[:16], "linf", 4 / 255, steps=3, square_queries=20, n_targets=1, masking_eps=[4 / 255], unbounded_steps=3,
                             smoothing_samples=4)
    assert audit.randomised
    assert {c.name: c.status for c in audit.checks}["randomness_handled"] == "fail"
    # prediction noise alone lowers a worst case over this many random predictions; the report says how far
    assert audit.noise_floor is not None and audit.noise_floor <= audit.accuracy["clean"]
    assert any("with no attack, the worst case of the same" in w for w in audit.warnings)
    assert audit_robustness(model, x[:8], y[:8], "linf", 4 / 255, steps=2, square_queries=5, n_targets=1, masking_eps=[4 / 255],
                            unbounded_steps=2, smoothing_samples=0).noise_floor is None  # deterministic: no noise


def test_kernel_rounding_is_not_randomness(digits):
    """A GPU's atomic adds change the last bits of a deterministic network between passes: exact equality called it
    randomised, and with eot=1 randomness_handled failed and the defence was flagged."""
    from perceptual.audit import is_randomised

    class Jitter(torch.nn.Module):
        def __init__(self, inner, size):
            super().__init__()
            self.inner, self.size = inner, size

        def forward(self, z):
            logits = self.inner(z)
            return logits * (1 + self.size * torch.randn_like(logits))

    model, x, _ = digits
    assert not is_randomised(Jitter(model, 1e-7), x[:8])  # float32 rounding
    assert is_randomised(Jitter(model, 1e-2), x[:8]) and is_randomised(Noisy(model), x[:8])
    assert not is_randomised(model, x[:8])


def test_the_noise_floor_is_the_worst_case_of_unattacked_predictions():
    y = torch.zeros(10, dtype=torch.long)
    calls = iter(range(100))

    def predict(x):  # call k gets sample k wrong
        wrong = torch.zeros(10, dtype=torch.long)
        wrong[next(calls)] = 1
        return wrong

    assert noise_floor(predict, torch.zeros(10, 1, 2, 2), y, evaluations=3) == pytest.approx(0.7)
    assert noise_floor(lambda x: y, torch.zeros(10, 1, 2, 2), y, evaluations=8) == 1.0
    with pytest.raises(ValueError, match="evaluations must be an integer >= 1"):
        noise_floor(lambda x: y, torch.zeros(10, 1, 2, 2), y, evaluations=0)
    with pytest.raises(ValueError, match="one label per image: 10 images"):
        noise_floor(lambda x: y, torch.zeros(10, 1, 2, 2), y[:4], evaluations=2)


def test_randomised_defence_without_eot_is_a_stated_warning(digits):
    model, x, y = digits
    audit = audit_robustness(Noisy(model), x[:8], y[:8], "linf", 4 / 255, steps=2, square_queries=5, n_targets=1, masking_eps=[4 / 255], unbounded_steps=2,
                             smoothing_samples=4)
    assert audit.warnings and "eot" in audit.warnings[0]
    text = audit_markdown({"verdict": verdict(audit), "warnings": audit.warnings, "robustness": audit.to_dict()})
    assert "**Warning:** the defence is randomised" in text


def test_pgd_trained_model_is_not_flagged(pgd_test_cnn, digits):
    """Measured (seed 0, 48 images, Linf 8/255): "19% worst case (25% under pgd, 25% under apgd-ce, 19% under apgd-t,
    25% under square; clean 40%): no sign of gradient masking"; every check passes."""
    _, x, y = digits
    audit = audit_robustness(pgd_test_cnn, x[:48], y[:48], "linf", 8 / 255, steps=10, square_queries=200, n_targets=1, masking_eps=[2 / 255, 8 / 255],
                             unbounded_steps=10, smoothing_samples=16)
    text = verdict(audit)
    assert not is_flagged(text), text
    assert all(c.status != "fail" for c in audit.checks), audit.checks


KWTA_NOT_RELIABLY_MASKED = (
    "at this CPU scale the masking checks alone do not reliably flag the small k-WTA CNN: with one torch thread it failed "
    "unbounded_attack_succeeds, with two (the suite's) it trained to another model (clean 35%) whose checks all pass "
    "(17% worst case, 19% PGD, 19% Square); the real digits audit (README) flags it by its alignment (decision rule 4)")


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason=KWTA_NOT_RELIABLY_MASKED)
def test_pgd_trained_kwta_is_flagged(pgd_test_cnn, digits, train_digits):
    """k-WTA (kwta_small_cnn: small_cnn with k-WTA activations, ratio 0.1; the CPU stand-in for kwta_resnet18) PGD-trained
    like Xiao et al. (3 steps, Linf 8/255, 5 epochs, ~40 s), attack-only audit with the robust PGD model as the transfer
    source. Expected to be flagged; see KWTA_NOT_RELIABLY_MASKED for why it is not asserted strictly."""
    kwta = train_digits("kwta_small_cnn", epochs=5, pgd_steps=3, width=8, ratio=0.1)
    _, x, y = digits
    audit = audit_robustness(kwta, x[:48], y[:48], "linf", 8 / 255, steps=10, square_queries=200, n_targets=1, masking_eps=[2 / 255, 8 / 255],
                             unbounded_steps=10, reference=pgd_test_cnn)
    text = verdict(audit)
    assert is_flagged(text), text


def test_attack_results_are_cached_and_not_recomputed(digits, tmp_path, monkeypatch):
    model, x, y = digits
    kwargs = dict(steps=2, square_queries=5, n_targets=1, masking_eps=[4 / 255], unbounded_steps=2, sweep_eps=[2 / 255], cache_dir=tmp_path,
                  smoothing_samples=4)
    first = audit_robustness(model, x[:8], y[:8], "linf", 4 / 255, **kwargs)
    assert (tmp_path / "attacks" / "linf-eps0.0156863" / "apgd-ce.json").is_file() and (tmp_path / "masking.json").is_file()

    def refuse(*args, **kw):
        raise AssertionError("a cached attack ran again")

    for name in ("apgd", "pgd", "fgsm", "square", "gradient_masking_report"):
        monkeypatch.setattr(audit_module, name, refuse)
    second = audit_robustness(model, x[:8], y[:8], "linf", 4 / 255, **kwargs)
    assert second.accuracy == first.accuracy and second.sweep == first.sweep
    assert set(second.sweep) == {"0.00784314", "0.0156863"}


def test_an_unreadable_cache_file_is_recomputed_not_a_crash(tmp_path):
    from perceptual.cache import cached_json

    path = tmp_path / "entry.json"
    for damaged in (b'{"key": "k", "value"', b'{"key": "k", "value": "\xff\xfe"}'):  # truncated; bytes that are not UTF-8
        path.write_bytes(damaged)
        assert cached_json(path, "k") is None
    path.write_text('{"key": "k", "value": 1}')
    assert cached_json(path, "k") == {"key": "k", "value": 1} and cached_json(path, "other") is None


def test_controversial_summary_counts_observers():
    result = {"model_a": "defence", "model_b": "robust",
              "favoured_by_observer": {"a": {"favours": "robust"}, "b": {"favours": "robust"}, "c": {"favours": None}, "d": {"favours": "defence"}}}
    assert controversial_summary(result) == "of 4 observers, 2 favour robust, 1 defence, 1 undecided"
    few = {"model_a": "defence", "model_b": "robust", "favoured_by_observer": {o: {"favours": None, "n_origins": 4} for o in "abcde"}}
    assert controversial_summary(few) == "of 5 observers, 0 favour robust, 0 defence, 5 undecided (4 origins: a verdict needs at least 6)"
    assert controversial_summary({"model_a": "defence", "model_b": "robust", "objective": "class_controversial", "n_origins": 1,
                                  "observers": {"a": {"favours": None}}}).endswith("(1 origin: a verdict needs at least 6)")
    audit = audit_module.RobustnessAudit("linf", 0.03, 10, {"clean": 0.9, "fgsm": 0.6, "pgd": 0.6, "apgd-ce": 0.6, "apgd-t": 0.6, "square": 0.6,
                                                            "worst_case": 0.6}, False, 1, {})
    text = verdict(audit, alignment=0.2, controversial=controversial_summary(result))
    assert "controversial stimuli against the robust reference: of 4 observers" in text
    assert text.endswith("no sign of gradient masking, but low alignment predicts stronger attacks may break it") and is_flagged(text)
    assert not is_flagged(verdict(audit, alignment=0.8))


def test_a_defence_setting_outside_the_weights_is_not_served_from_the_cache(digits, tmp_path):
    """InputQuantised's levels is no tensor: keyed by the weights alone, levels=3 was served levels=8's results."""
    model, x, y = digits
    kwargs = dict(steps=2, square_queries=5, n_targets=1, masking_eps=[4 / 255], unbounded_steps=2, sweep_eps=[], smoothing_samples=0)
    eight, three = InputQuantised(model, 8).eval(), InputQuantised(model, 3).eval()
    first = audit_robustness(eight, x[:16], y[:16], "linf", 4 / 255, cache_dir=tmp_path, **kwargs)
    cached = audit_robustness(three, x[:16], y[:16], "linf", 4 / 255, cache_dir=tmp_path, **kwargs)
    fresh = audit_robustness(three, x[:16], y[:16], "linf", 4 / 255, cache_dir=tmp_path / "fresh", **kwargs)
    assert cached.accuracy == fresh.accuracy and cached.masking == fresh.masking
    assert fresh.accuracy != first.accuracy  # the two settings do differ on these images
    # what the caller knows besides (a factory's kwargs) keys the cache too
    assert module_identity(eight) != module_identity(three) and module_identity(eight, {"k": 1}) != module_identity(eight, {"k": 2})
