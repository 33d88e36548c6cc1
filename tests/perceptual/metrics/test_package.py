"""The package surface: exported names, purity (no invert/stimuli/training imports), lazy heavy imports."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

import perceptual.metrics as metrics

ISSUE_NAMES = """observed_consistency error_consistency accuracy_difference misclassification_agreement
class_level_error_similarity class_level_error_divergence linear_cka softmax_output_similarity pairwise_matrix
spearman_between mean_rank aurc eaurc unknown_detection_aurc auroc fpr_at_tpr aupr_in aupr_out
expected_calibration_error negative_log_likelihood brier_score hellinger abstention_distribution
reliability_score fleiss_kappa cronbach_alpha survey_sample_size imagenet_to_16_classes shape_bias
aggregate_trials MinMaxAbstentionCalibrator""".split()

PACKAGE_DIR = Path(metrics.__file__).parent


def test_every_issue_name_is_exported():
    for name in ISSUE_NAMES:
        assert name in metrics.__all__, name
    for name in metrics.__all__:
        assert hasattr(metrics, name), name


def test_public_functions_have_docstrings():
    for name in metrics.__all__:
        obj = getattr(metrics, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__.strip()) > 40, name


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module or "", node


@pytest.mark.parametrize("path", sorted(PACKAGE_DIR.glob("*.py")), ids=lambda p: p.name)
def test_module_is_pure_and_imports_heavy_libraries_lazily(path):
    tree = ast.parse(path.read_text())
    top_level = {id(n) for n in tree.body}
    for module, node in _imports(path):
        root = module.split(".")[0]
        assert root not in {"invert", "stimuli", "training", "perceptual"}, f"{path.name} imports {module}"
        if root in {"torch", "scipy", "sklearn", "pandas", "matplotlib"}:
            assert id(node) not in top_level, f"{path.name} imports {module} at module level"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_tensors_of_any_float_dtype_are_accepted(dtype):
    probs = torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=dtype)
    assert metrics.brier_score(probs, torch.tensor([1, 0])) == pytest.approx(0.3125, abs=1e-2)
    assert metrics.auroc(torch.tensor([1.0, 2.0], dtype=dtype), np.array([0.0])) == 1.0
