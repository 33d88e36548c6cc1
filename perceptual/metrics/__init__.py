"""The metric suite: behavioural and representational alignment, unknown detection, VisAlign, survey statistics.

Pure functions over numpy arrays or torch tensors (converted on entry; torch is never imported here), returning
Python floats or numpy arrays. Every function checks its inputs and raises TypeError/ValueError that says what
was wrong; each docstring names the paper and reference code it follows and any deliberate difference.
scipy and scikit-learn are imported inside the functions that need them, so importing this package is cheap.

Modules: ``behavioural`` (error consistency, misclassification agreement, class-level error similarity,
softmax similarity), ``representational`` (linear CKA), ``ranking`` (pairwise matrices, Spearman, mean rank),
``trials`` (model-vs-human aggregation over a trial table), ``unknown`` (AURC, AUROC, FPR@TPR, AUPR, ECE, NLL,
Brier), ``visalign`` (Hellinger, abstention, reliability score), ``survey`` (Fleiss' kappa, Cronbach's alpha,
sample size), ``mvh`` (16-class mapping, shape bias).
"""
from .behavioural import (
    accuracy_difference,
    class_level_error_divergence,
    class_level_error_similarity,
    error_consistency,
    expected_consistency,
    jensen_shannon_divergence,
    joint_error_mask,
    misclassification_agreement,
    observed_consistency,
    softmax_output_similarity,
)
from .mvh import SIXTEEN_CLASS_IMAGENET_INDICES, SIXTEEN_CLASS_NAMES, imagenet_to_16_classes, shape_bias
from .ranking import mean_rank, pairwise_matrix, spearman_between
from .representational import linear_cka
from .survey import cronbach_alpha, fleiss_kappa, survey_sample_size
from .trials import (
    MVH_EXCLUDED_CONDITIONS,
    TRIAL_COLUMNS,
    TrialAggregate,
    aggregate_trials,
    condition_key,
    is_excluded,
    mvh_exclusions,
    ood_accuracy,
)
from .unknown import (
    aupr_in,
    aupr_out,
    aurc,
    auroc,
    brier_score,
    eaurc,
    expected_calibration_error,
    fpr_at_tpr,
    negative_log_likelihood,
    optimal_aurc,
    risk_coverage_curve,
    unknown_detection_aurc,
)
from .visalign import (
    GROUPS,
    MinMaxAbstentionCalibrator,
    ReliabilityResult,
    abstention_distribution,
    check_reliability_settings,
    hellinger,
    reliability_score,
)

__all__ = [
    # behavioural alignment
    "observed_consistency",
    "expected_consistency",
    "error_consistency",
    "accuracy_difference",
    "aggregate_trials",
    "ood_accuracy",
    "TrialAggregate",
    "TRIAL_COLUMNS",
    "MVH_EXCLUDED_CONDITIONS",
    "mvh_exclusions",
    "condition_key",
    "is_excluded",
    "misclassification_agreement",
    "joint_error_mask",
    "class_level_error_similarity",
    "class_level_error_divergence",
    "linear_cka",
    "jensen_shannon_divergence",
    "softmax_output_similarity",
    "pairwise_matrix",
    "spearman_between",
    "mean_rank",
    # unknown detection
    "aurc",
    "eaurc",
    "optimal_aurc",
    "risk_coverage_curve",
    "unknown_detection_aurc",
    "auroc",
    "fpr_at_tpr",
    "aupr_in",
    "aupr_out",
    "expected_calibration_error",
    "negative_log_likelihood",
    "brier_score",
    # VisAlign
    "hellinger",
    "abstention_distribution",
    "MinMaxAbstentionCalibrator",
    "check_reliability_settings",
    "reliability_score",
    "ReliabilityResult",
    "GROUPS",
    # survey statistics
    "fleiss_kappa",
    "cronbach_alpha",
    "survey_sample_size",
    # model-vs-human helpers
    "imagenet_to_16_classes",
    "SIXTEEN_CLASS_NAMES",
    "SIXTEEN_CLASS_IMAGENET_INDICES",
    "shape_bias",
]
