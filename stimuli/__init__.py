"""Stimulus sets: targets and seeds, inversion and controversial sets on disk, and trials.

What the engine optimises and what is kept of it, in a form that the simulated observer and
human surveys both read (Nanda et al., "Do Invariances in Deep Neural Networks Align with Human
Perception?", AAAI 2023, section 2.4 and appendix A.4; Golan et al. 2020 for class-controversial
stimuli). Usable without Hydra::

    from training import load_dataset, build_model
    import stimuli

    test, train = load_dataset("digits", "test"), load_dataset("digits", "train")
    model = stimuli.ModelRef.from_classifier(build_model("small_cnn", "digits"), checkpoint=None)
    targets = stimuli.select_targets(test, n=100, seed=0)
    s = stimuli.make_inversion_set("sets/demo", model, targets, seed_types=["noise", "train"],
                                   train_set=train, engine="fast")
    s = stimuli.load_set("sets/demo")          # s.images (N, 3, 32, 32), s.manifest (DataFrame)
    trials = stimuli.make_trials(s.manifest, "2afc", seed=0, attention_rate=0.1)

Modules: :mod:`~stimuli.sources` (targets, seeds), :mod:`~stimuli.generate` (sets through the
engine, resumable and sharded), :mod:`~stimuli.sets` (the on-disk format, loader, merge),
:mod:`~stimuli.trials` (2AFC, clustering, attention checks), :mod:`~stimuli.distances` (distances
for hard clustering), :mod:`~stimuli.preview` (the figure), :mod:`~stimuli.commands` (Hydra).
"""
from invert import resolve_engine  # noqa: F401  (stimuli.resolve_engine: the engine from a preset, config or mapping)

from .distances import pixel_l2_distances, resolve_distance, set_trials, target_distances
from .generate import CONTROVERSIAL_OBJECTIVES, DIRECTIONS, ModelRef, check_chunk_size, make_controversial_set, make_inversion_set
from .sets import (
    COLUMNS,
    FORMAT_VERSION,
    QUANTISATION,
    IncompleteSetError,
    StimulusSet,
    StimulusSetError,
    find_shards,
    load_set,
    merge_sets,
    quantise,
    read_png,
    shard_path,
    write_set,
)
from .sources import DEFAULT_GAUSSIANS, SEED_TYPES, Seeds, Targets, check_gaussians, gaussian_targets, make_seeds, select_targets
from .trials import TASKS, check_attention_rate, clustering_trials, make_trials, nearest_triplets, two_afc_trials

__all__ = [
    "COLUMNS", "CONTROVERSIAL_OBJECTIVES", "DEFAULT_GAUSSIANS", "DIRECTIONS", "FORMAT_VERSION", "IncompleteSetError", "ModelRef", "QUANTISATION",
    "SEED_TYPES", "Seeds", "StimulusSet", "StimulusSetError", "TASKS", "Targets", "check_attention_rate", "check_chunk_size",
    "check_gaussians", "clustering_trials", "find_shards", "gaussian_targets", "load_set", "make_controversial_set", "make_inversion_set", "make_seeds",
    "make_trials", "merge_sets", "nearest_triplets", "pixel_l2_distances", "quantise", "read_png",
    "resolve_distance", "resolve_engine", "select_targets", "set_trials", "shard_path", "target_distances",
    "two_afc_trials", "write_set",
]
