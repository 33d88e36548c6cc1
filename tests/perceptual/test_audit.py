"""The audit's masking checks and verdict on constructed numbers, and on real digits models: a standard
model is not flagged, the same model behind input quantisation (a zero gradient) is."""
from __future__ import annotations

import pytest
import torch

from perceptual.audit import (
    DECISION_RULE,
    alignment_position,
    audit_markdown,
    audit_robustness,
    check_classifier,
    is_flagged,
    masking_checks,
    verdict,
)


@pytest.fixture(scope="module")
def digits(attack_test_cnn):
    """The shared digits CNN (tests/conftest.py) and the first 64 test images."""
    model, test = attack_test_cnn
    return model, test.float_images(slice(0, 64)), test.labels[:64]


class Quantised(torch.nn.Module):
    """Input quantisation to 8 levels in front of a model: its gradient is zero almost everywhere."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, z):
        return self.inner(torch.round(z * 7) / 7)


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
    honest = dict(masked, square=0.58, transfer=0.7, worst_case=0.57)
    assert {c.name: c.status for c in masking_checks(honest, {}, 0.0, False, 1)}["black_box_not_stronger"] == "pass"
    assert masking_checks(honest, {}, 0.0, True, 1)[-1].status == "fail"
    assert masking_checks(honest, {}, 0.0, True, 4)[-1].status == "pass"
    assert alignment_position({"2afc": 0.6}, {"2afc": 0.5}, {"2afc": 0.9}) == pytest.approx(0.25)
    assert alignment_position({"2afc": 0.6}, {"2afc": 0.5}, {"2afc": 0.5}) is None
    assert "0.5" in DECISION_RULE and "5%" in DECISION_RULE


def test_check_classifier_rejects_non_classifiers():
    x = torch.rand(2, 3, 8, 8)
    with pytest.raises(TypeError, match="nn.Module"):
        check_classifier(lambda z: z, x)
    with pytest.raises(ValueError, match="logits"):
        check_classifier(torch.nn.Identity(), x)
    probs = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 10), torch.nn.Softmax(dim=1))
    with pytest.raises(ValueError, match="probabilities"):
        check_classifier(probs, x)


def test_standard_model_is_not_flagged_and_quantised_one_is(digits, tmp_path):
    """Measured (seed 0, 24 images, shared loaded CPU, 40 s): standard "0% worst case ... not robust"; quantised
    "8% worst case (38% under pgd, 25% under square, 8% under transfer)": suspected gradient masking."""
    model, x, y = digits
    eps = 8 / 255
    kwargs = dict(steps=8, square_queries=150, n_targets=1, masking_eps=[2 / 255, 8 / 255], unbounded_steps=10)
    x, y = x[:24], y[:24]
    plain = audit_robustness(model, x, y, "linf", eps, **kwargs)
    plain_verdict = verdict(plain)
    assert not is_flagged(plain_verdict), plain_verdict
    masked = audit_robustness(Quantised(model), x, y, "linf", eps, reference=model, **kwargs)
    masked_verdict = verdict(masked, alignment=0.1)
    assert is_flagged(masked_verdict), masked_verdict
    assert "at the standard model's level" in masked_verdict
    failed = {c.name for c in masked.checks if c.status == "fail"}
    assert "black_box_not_stronger" in failed
    text = audit_markdown(masked, masked_verdict)
    assert text.index("Verdict") < text.index("Masking checks") and "| square |" in text


def test_randomised_defence_is_detected(digits):
    model, x, y = digits
    audit = audit_robustness(Noisy(model), x[:16], y[:16], "linf", 4 / 255, steps=3, square_queries=20, n_targets=1, masking_eps=[4 / 255], unbounded_steps=3)
    assert audit.randomised
    assert {c.name: c.status for c in audit.checks}["randomness_handled"] == "fail"
