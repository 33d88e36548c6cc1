"""perceptual: who judges and how it is scored — observers, their tasks and decisions, scores, the metric suite,
convergence and statistics, and the report writers. The commands built from these live in
:mod:`perceptual.pipelines` (``python -m perceptual measure|compare|demo|humans|humans-mvh|audit|visalign|unknown|reproduce|sweep``).
"""
from .convergence import convergence_summary
from .error_alignment import error_alignment
from .human_compare import compare_on_trials
from .measure import ModelSpec, make_panel, measure_models
from .observers import (
    LPIPSObserver,
    Observer,
    Panel,
    PixelL2Observer,
    SSIMObserver,
    default_panel,
    make_observer,
    observer_names,
    register_observer,
)
from .pair_metrics import PairMetric, pairwise_matrices, register_pair_metric
from .statistics import paired_difference, ranking_agreement
from .sweep_summary import collect_sweep, register_sweep_source, write_sweep_summary
from .tasks import controversial_spread, judge_2afc, judge_clustering, summarize

__all__ = [
    "LPIPSObserver", "ModelSpec", "Observer", "PairMetric", "Panel", "PixelL2Observer", "SSIMObserver", "compare_on_trials",
    "collect_sweep", "controversial_spread", "convergence_summary", "default_panel", "error_alignment", "judge_2afc", "judge_clustering", "make_observer",
    "make_panel", "measure_models", "observer_names", "paired_difference", "pairwise_matrices", "ranking_agreement", "register_observer",
    "register_pair_metric", "register_sweep_source", "summarize", "write_sweep_summary",
]
