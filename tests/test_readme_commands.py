"""Every command line in the README's shell blocks parses and composes (Hydra, no work done), so that a
documented command can never be unparseable again.

A block's lines are joined at trailing backslashes and split like a shell would (``$HOME`` expanded,
comments dropped). ``python -m training|stimuli X|perceptual X`` and ``torchrun ... -m training`` lines are
composed with their config after the same pre-check the commands run (:func:`training.config.check_overrides`;
a sweep composes on its first value); ``python -m training.convert`` is parsed by its own argument parser; another
package's module (``python -m http.server``) must exist. A ``...``
stands for the arguments of the command above it and is dropped.
"""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from training.config import check_overrides

README = Path(__file__).resolve().parents[1] / "README.md"


def _configs() -> dict[tuple[str, ...], str]:
    """Every command's config: ``python -m perceptual X`` reads ``conf/X.yaml``, ``python -m stimuli X`` reads
    ``conf/stimuli_X.yaml`` (taken from the two dispatch tables, so a new command is checked without editing this)."""
    from perceptual.pipelines import COMMANDS as PERCEPTUAL
    from stimuli.commands import COMMANDS as STIMULI

    configs = {("training",): "train", ("training.info",): "config"}
    configs.update({("perceptual", name): name for name in PERCEPTUAL})
    configs.update({("stimuli", name): f"stimuli_{name}" for name in STIMULI})
    return configs


CONFIGS = _configs()


def shell_commands(text: str) -> list[str]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def _words(command: str) -> list[str]:
    words = shlex.split(os.path.expandvars(command), comments=True)
    return [w for w in words if w != "..."]


def _python_module(words: list[str]) -> tuple[str, list[str]] | None:
    """(module, arguments) of ``python -m MODULE ...`` or ``torchrun [options] -m MODULE ...``."""
    if words[0].endswith(("python", "python3")) or words[0] == "torchrun":
        index = words.index("-m") if "-m" in words else None
        if index is not None:
            return words[index + 1], words[index + 2:]
    return None


PROJECT_PACKAGES = ("training", "stimuli", "perceptual", "invert")
COMMANDS = shell_commands(README.read_text())
MODULE_COMMANDS = [c for c in COMMANDS if _python_module(_words(c))]


def test_the_readme_has_commands_to_check():
    assert len(MODULE_COMMANDS) >= 20
    assert any(c.startswith("make demo") for c in COMMANDS) and any(c.startswith("make test") for c in COMMANDS)


@pytest.mark.parametrize("command", MODULE_COMMANDS)
def test_every_readme_command_parses_and_composes(command, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # what $HOME expands to does not matter, only that it parses
    module, arguments = _python_module(_words(command))
    if module.split(".")[0] not in PROJECT_PACKAGES:  # another package's module (python -m http.server): it must exist here
        import importlib.util

        assert importlib.util.find_spec(module) is not None, f"{command!r}: no module {module!r} on this machine"
        return
    if module == "training.convert":
        from unittest import mock

        from training.convert import main

        with mock.patch("training.convert.convert", return_value=tmp_path / "out") as convert:
            main(arguments)  # argparse exits (a test failure) on a bad command line
        assert convert.called
        return
    key = (module,) if module.startswith("training") else (module, arguments[0])
    assert key in CONFIGS, f"{command!r}: unknown command {key}"
    overrides = arguments if module.startswith("training") else arguments[1:]
    if module == "stimuli":
        from stimuli.__main__ import translate

        overrides = translate(overrides)
    flags = [a for a in overrides if a.startswith("-")]
    assert set(flags) <= {"-m", "--multirun"}, f"{command!r}: unexpected flags {flags}"
    hydra_overrides = [o for o in overrides if o.startswith("hydra")]
    check_overrides(CONFIGS[key], [o for o in overrides if not o.startswith("hydra")])
    if hydra_overrides:  # a launcher choice: composes with Hydra's own config
        from hydra import compose, initialize_config_module

        with initialize_config_module(config_module="conf", version_base=None):
            compose(config_name=CONFIGS[key], overrides=hydra_overrides, return_hydra_config=True)
