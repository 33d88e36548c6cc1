"""The commands of ``python -m perceptual``, each a thin composition of library calls: ``measure`` (observer
alignment, Table 1), ``compare`` (models vs the observer panel under distortions, the metric suite), ``demo``
(the main job on the embedded digits), ``humans`` (survey answers read back), ``humans-mvh`` (the
model-vs-human benchmark's human trials), ``audit`` (a defence under strong attacks), ``visalign`` (VisAlign's
tables), ``unknown`` (Kim et al.'s unknown-detection table) and ``reproduce`` (one of the paper's results as a
preset: ``experiment=table1|table3|fig4|fig5|fig6|fig7``, ``scale=cpu|paper``) and ``sweep`` (the jobs of a Hydra
sweep in one table and figure). :data:`COMMANDS` maps a command
to its module."""
COMMANDS = {
    "measure": "perceptual.pipelines.measure",
    "demo": "perceptual.pipelines.demo",
    "compare": "perceptual.pipelines.compare",
    "humans-mvh": "perceptual.pipelines.humans_mvh",
    "humans": "perceptual.pipelines.humans",
    "audit": "perceptual.pipelines.audit",
    "visalign": "perceptual.pipelines.visalign",
    "unknown": "perceptual.pipelines.unknown",
    "reproduce": "perceptual.pipelines.reproduce",
    "sweep": "perceptual.pipelines.sweep",
}
