"""``python -m stimuli COMMAND [hydra overrides]``: build and use stimulus sets.

Commands (each a Hydra app with its config in ``conf/stimuli_<command>.yaml``)::

    python -m stimuli invert model=resnet18 model.checkpoint=robust.pt data=cifar10 data.root=$HOME/data \\
        n_targets=100 seeds=[noise,train]
    python -m stimuli controversial model_a=resnet18 model_b=vgg16 lambda_=0.1
    python -m stimuli trials set=sets/inversion-resnet18-cifar10 task=clustering_hard attention_rate=0.1
    python -m stimuli merge out=sets/inversion-resnet18-cifar10

``model_a=NAME`` / ``model_b=NAME`` are shorthand for Hydra's ``model@model_a=NAME`` (both pick a
file of the ``model`` group); ``model_a.checkpoint=...`` sets a field as usual. Append ``--help``
to a command for its Hydra help (``--cfg job`` prints the composed config).
"""
from __future__ import annotations

import re
import sys

USAGE = __doc__

# `model_a=resnet18` (choose a config of the model group) but not `model_a.checkpoint=...`.
_MODEL_ALIAS = re.compile(r"^(model_[ab])=(.*)$")


def translate(overrides: list[str]) -> list[str]:
    """Rewrite the ``model_a=NAME`` / ``model_b=NAME`` shorthand into Hydra's package syntax."""
    return [_MODEL_ALIAS.sub(r"model@\1=\2", o) for o in overrides]


def main(argv: list[str] | None = None) -> None:
    from .commands import COMMANDS

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        print(f"commands: {', '.join(COMMANDS)}")
        return
    command, overrides = argv[0], argv[1:]
    if command not in COMMANDS:
        sys.exit(f"unknown command {command!r}: use one of {', '.join(COMMANDS)} (python -m stimuli --help)")
    from training.config import run_checked
    from training.io import exit_on_sigterm

    exit_on_sigterm()  # a killed job (timeout, scancel) removes its staging folders as Ctrl-C does
    overrides = translate(overrides)
    run_checked(f"stimuli_{command}", overrides)  # a misspelt key is refused by name before Hydra starts
    sys.argv = [f"{sys.argv[0]} {command}"] + overrides
    COMMANDS[command]()


if __name__ == "__main__":
    main()
