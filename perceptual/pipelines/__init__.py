"""The commands of ``python -m perceptual``, each a thin composition of library calls: ``measure`` (observer
alignment, Table 1), ``compare`` (models vs the observer panel under distortions, the metric suite) and ``demo``
(the main job on the embedded digits). :data:`COMMANDS` maps a command to its module."""
COMMANDS = {
    "measure": "perceptual.pipelines.measure",
    "demo": "perceptual.pipelines.demo",
    "compare": "perceptual.pipelines.compare",
    "audit": "perceptual.pipelines.audit",
}
