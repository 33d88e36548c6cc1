"""The audit's verdicts on the real CIFAR-10 subset (../shared/data/cifar-10-mini; skipped without it), at a CPU
scale of minutes: a PGD-trained ``kwta_resnet18`` (width 8, the paper's k-WTA network) and a standard CNN behind input
quantisation are flagged, a PGD-trained CNN is not, attacks only. Run once (2 quiet CPU threads, 4 minutes, 64 test
images): PGD "17% worst case (22% under pgd, 22% under apgd-ce, 17% under apgd-t, 25% under apgd-smooth, 19% under
square; clean 25%): no sign of gradient masking"; k-WTA "14% worst case (25% under pgd, 17% under apgd-ce, 16% under
apgd-t, 19% under apgd-smooth, 16% under square, 30% under transfer; clean 38%): suspected gradient masking (failed:
pgd_not_overestimating)" -- PGD 11 points above the worst case against the 10-point limit, close to it: after 5 epochs
on 2,000 images the network masks less than the 10-epoch one of the README (PGD 23% of 30% clean, worst case 0%);
quantised "23% worst case (41% under pgd, ..., 23% under square; clean 41%): suspected gradient masking (failed:
black_box_not_stronger, smoothed_gradient_not_stronger, pgd_not_overestimating, unbounded_attack_succeeds)"."""
from __future__ import annotations

import pytest

from perceptual.audit import audit_robustness, is_flagged, verdict
from training import load_dataset
from training.models.defences import InputQuantised

pytestmark = pytest.mark.slow

SETTINGS = dict(steps=20, square_queries=300, n_targets=3, masking_eps=[2 / 255, 8 / 255], unbounded_steps=20)


@pytest.fixture(scope="module")
def cifar_models(cifar_mini_root, train_digits):
    common = dict(dataset="cifar10", root=cifar_mini_root, n_images=2000, width=16)
    return {
        "standard": train_digits("small_cnn", epochs=5, **common),
        "pgd": train_digits("small_cnn", epochs=5, pgd_steps=3, **common),
        "kwta": train_digits("kwta_resnet18", epochs=5, pgd_steps=3, ratio=0.1, **dict(common, width=8)),
    }


@pytest.fixture(scope="module")
def cifar_test(cifar_mini_root):
    test = load_dataset("cifar10", "test", root=cifar_mini_root)
    return test.float_images(slice(0, 64)), test.labels[:64]


# The k-WTA network is close to the limit of pgd_not_overestimating (11 points against 10 where the docstring's run was
# measured); on another CPU (an AMD EPYC, 2 threads) it trained to a network at 27 % clean whose checks all pass (14 % worst
# case, 20 % under PGD, 14 % under Square). The README's CIFAR audit flags it with its alignment; the attacks alone do
# not reliably, as test_audit.py says of the digits k-WTA.
KWTA_CPU_DEPENDENT = ("attacks alone flag this small k-WTA network on some CPUs only (PGD 11 points above the worst case on one, "
                      "all checks passed on another); the README's audit flags it by its alignment")


@pytest.mark.parametrize("defence,flagged", [
    ("pgd", False),
    pytest.param("kwta", True, marks=pytest.mark.xfail(strict=False, reason=KWTA_CPU_DEPENDENT)),
    ("quantised", True),
])
def test_cifar_verdicts(cifar_models, cifar_test, defence, flagged):
    x, y = cifar_test
    model = InputQuantised(cifar_models["standard"], levels=8) if defence == "quantised" else cifar_models[defence]
    audit = audit_robustness(model, x, y, "linf", 8 / 255, reference=None if defence == "pgd" else cifar_models["pgd"], **SETTINGS)
    text = verdict(audit)
    print(f"{defence}: {text}")
    assert is_flagged(text) == flagged, text
