"""The commands of ``python -m perceptual``, each a thin composition of library calls: ``measure`` (observer
alignment, Table 1), ``compare`` (models vs the observer panel under distortions, the metric suite), ``demo``
(the main job on the embedded digits), ``humans`` (survey answers read back) and ``humans-mvh`` (the
model-vs-human benchmark's human trials), ``audit`` (a defence under strong attacks), ``visalign`` (VisAlign's
tables) and ``unknown`` (Kim et al.'s unknown-detection table). :data:`COMMANDS` maps a command to its module."""
COMMANDS = {
    "measure": "perceptual.pipelines.measure",
    "demo": "perceptual.pipelines.demo",
    "compare": "perceptual.pipelines.compare",
    "humans-mvh": "perceptual.pipelines.humans_mvh",
    "humans": "perceptual.pipelines.humans",
    "audit": "perceptual.pipelines.audit",
    "visalign": "perceptual.pipelines.visalign",
    "unknown": "perceptual.pipelines.unknown",
}
