"""Build data sets, models and representations from Hydra config nodes, and check configs before work starts.

* :func:`dataset_from_config`, :func:`model_from_config`, :func:`representation_from_config`: objects
  from the ``conf/data`` and ``conf/model`` nodes; path options expand ``~`` and ``$VARIABLES``
  (:func:`expand_path`).
* :func:`compose`: one of the package's configs, inside a running Hydra app or outside one.
* :func:`check_overrides`: command-line overrides checked before Hydra starts the app, so that a
  misspelt key is refused by name with the valid keys nearby (Hydra's own message suggests adding it
  with ``+``, which would silently start a default run).
* :func:`check_known_keys` / :func:`check_train_config`: a composed config may not hold keys that no
  code reads (a ``+train.epoch=1`` typo); the message lists the close and the valid keys.
"""
from __future__ import annotations

import difflib
import fnmatch
import functools
import os
import re
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from invert.validation import check_whole

from .data import IN_MEMORY, load_dataset, load_image_folder
from .models import Classifier, build_model
from .representation import Representation


class ConfigError(ValueError):
    """A config value is unknown or out of range; the message names the key and the choices."""


class CommandError(CompactHydraException):
    """A command's refusal of its input, as :func:`concise_errors` hands it to Hydra: printed as its message alone."""


def concise_errors(task: Callable[[DictConfig], Any]) -> Callable[[DictConfig], Any]:
    """For a ``@hydra.main`` command (put it under the decorator): a refusal of the run's input (a bad setting, a
    missing, existing or damaged file, a run that diverged) reaches the user as its message, in one line after Hydra's
    "Error executing job with overrides", not under a traceback of the code that checked it. Hydra prints a
    ``CompactHydraException`` so; ``HYDRA_FULL_ERROR=1`` shows the traceback, the original error chained. Other
    exceptions (bugs) keep Hydra's traceback. A sweep's jobs fail as before."""
    from .io import LockBusyError
    from .run import RunDirectoryError

    refusals = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, FloatingPointError, RunDirectoryError,
                LockBusyError)

    @functools.wraps(task)
    def run(cfg: DictConfig) -> Any:
        try:
            return task(cfg)
        except OmegaConfBaseException:  # a ValueError too, but a config read wrongly is a bug: Hydra's traceback
            raise
        except refusals as err:
            raise CommandError(f"error: {err}") from err  # Hydra adds how to see the traceback (HYDRA_FULL_ERROR=1)

    return run


def check_whole_number(value: Any, name: str, least: int = 1, hint: str = "") -> None:
    """Refuse anything but an int >= ``least`` (a bool, a float, a string), naming the setting; ``hint`` follows
    the bound in the message (e.g. " (or null)" where the caller lets None through)."""
    try:
        check_whole(value, name, least=least, why=hint)
    except ValueError as err:
        raise ConfigError(str(err)) from None


TRADES_LINF_STEP = 0.007  # the TRADES and MART reference codes' Linf step (at eps 0.031, 10 steps)


def reference_inner_step(norm: str, eps, steps) -> float:
    """The inner attack's step of ``conf/train/trades.yaml`` and ``mart.yaml``, as the TRADES reference code
    (``yaodongyu/TRADES``, ``trades.py``) takes it: 0.007 for Linf (also MART's) and ``2 * eps / steps`` for L2, its
    ``l_2`` branch. A fixed 0.007 under ``attack.norm=l2`` moved at most 0.07 in 10 steps inside a ball of 0.5: near-clean
    training called TRADES. Registered as the config resolver ``${reference_inner_step:norm,eps,steps}``."""
    from .attacks import AttackConfigError, check_norm, config_number  # attacks reads its settings through this module

    if check_norm(norm) == "linf":
        return TRADES_LINF_STEP
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:  # 0 divided by zero while the config resolved
        raise AttackConfigError(f"train.attack.steps must be a positive integer, got {steps!r}")
    return 2 * config_number(eps, "train.attack.eps") / steps


OmegaConf.register_new_resolver("reference_inner_step", reference_inner_step, replace=True)


def _get(cfg: Mapping[str, Any] | Any, key: str, default: Any = None) -> Any:
    return cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)


def get(cfg: Mapping[str, Any] | Any, key: str, default: Any = None) -> Any:
    """``cfg[key]`` for a mapping, a DictConfig or an object, dotted keys allowed; ``default`` when absent or null."""
    value: Any = cfg
    for part in key.split("."):
        if value is None:
            return default
        value = _get(value, part)
    return default if value is None else value


def as_list(value: Any, name: str) -> list | None:
    """A list option given as one bare value on the command line (``sets=PATH``, ``experiments=colour``) as a list of it,
    not of its characters; None stays None; anything else that is not a list is refused, naming ``name``."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, int, float, os.PathLike)):
        return [value]
    if not isinstance(value, Sequence):
        raise ValueError(f"{name} must be a list, e.g. {name}=[...], got {value!r}")
    return list(value)


def expand_path(value: str | os.PathLike | None) -> Path | None:
    """A path option with ``~`` and ``$VARIABLES`` expanded (None stays None). Hydra's parser takes
    ``data.root=$HOME/data`` (the shell expands it) but not an unquoted ``~``; in YAML and quoted values
    both forms work."""
    if value is None:
        return None
    return Path(os.path.expandvars(os.path.expanduser(os.fspath(value))))


# The commands' top-level path options (``out``, ``set=``, ``sets=[...]``, ...): expanded once, before any work.
PATH_OPTIONS = ("out", "set", "sets", "inputs", "package", "measure_report", "reference_dir", "runs_dir", "run_dir", "root")


# The path options that name a folder a command writes into (``stimuli trials`` takes ``out`` as a CSV path instead).
OUTPUT_FOLDERS = ("out", "run_dir", "runs_dir", "reference_dir")


def expand_path_options(cfg: Any, keys: Sequence[str] = PATH_OPTIONS, folders: Sequence[str] = OUTPUT_FOLDERS) -> Any:
    """Expand ``~`` and ``$VARIABLES`` in a command's path options, in place, and return ``cfg``: ``out='~/sets/a'``
    is the home folder's ``sets/a``, not a folder named ``~`` in the working directory. A text or a list of texts;
    other values (None, numbers) are left as they are. An output folder option (``folders``) naming an existing file is
    refused here, before any work (it failed later with a bare "Not a directory" naming a path inside it)."""
    for key in keys:
        if key not in cfg:
            continue
        value = cfg[key]
        if isinstance(value, str) and value:
            cfg[key] = str(expand_path(value))
            if key in folders and Path(cfg[key]).is_file():
                raise ValueError(f"{key}={cfg[key]} is a file: {key} names the folder the command writes into; give another path")
        elif isinstance(value, Sequence) and not isinstance(value, str) and all(isinstance(v, str) for v in value):
            cfg[key] = [str(expand_path(v)) for v in value]
    return cfg


def resolved_path_text(value: str | os.PathLike | None):
    """A path option as one text however it is spelt (``~/data``, ``$HOME/data``, ``./x/../data``): expanded and
    resolved; an unset value (None, "") is returned as it is. What caches and run folders key a data root by."""
    return str(Path(expand_path(value)).resolve()) if value else value


def check_device_name(device: Any, key: str = "device") -> None:
    """Refuse a device that torch cannot name (``cdua``, ``gpu``), in words that say what ``key`` takes."""
    if device in (None, "auto") or isinstance(device, torch.device):
        return
    try:
        torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{key} takes auto, cpu, cuda or cuda:N (a GPU's index), got {device!r}") from None


def resolve_device(device: str | None = "auto") -> torch.device:
    """``auto`` → CUDA when available, else CPU; anything else is passed to torch.device."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device_name(device)
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda was asked for but CUDA is not available here: use device=cpu or device=auto")
    return device


def dataset_from_config(data_cfg, split: str = "test"):
    """An in-memory :class:`ImageSet` (cifar10, cifar100, digits) or a torchvision ImageFolder (imagenet)."""
    name = _get(data_cfg, "name")
    root = expand_path(_get(data_cfg, "root"))
    if name in IN_MEMORY:
        return load_dataset(name, split, root=root, download=bool(_get(data_cfg, "download", False)))
    if name == "imagenet":
        return load_image_folder(root, _get(data_cfg, "split", "val") if split == "test" else split)
    raise ValueError(f"unknown data set {name!r}: use one of {list(IN_MEMORY) + ['imagenet']}")


def model_from_config(model_cfg, dataset: str, num_classes: int | None = None) -> Classifier:
    """A zoo model from a ``conf/model`` node (name, checkpoint, trust_pickle, pretrained, kwargs)."""
    kwargs = dict(_get(model_cfg, "kwargs") or {})
    checkpoint = expand_path(_get(model_cfg, "checkpoint"))
    return build_model(
        _get(model_cfg, "name"),
        dataset,
        num_classes=num_classes,
        checkpoint=None if checkpoint is None else str(checkpoint),
        trust_pickle=bool(_get(model_cfg, "trust_pickle", False)),
        pretrained=bool(_get(model_cfg, "pretrained", False)),
        **kwargs,
    )


def representation_from_config(model: Classifier, model_cfg) -> Representation:
    return Representation(model, layer=_get(model_cfg, "layer"), fake_relu=_get(model_cfg, "fake_relu"))


# ------------------------------------------------------------------------------------------ checks


def compose(config_name: str, overrides: Sequence[str] = (), *, with_hydra: bool = False) -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` with overrides, inside a running Hydra app (which already
    searches ``pkg://conf``) or outside one; ``with_hydra`` keeps the ``hydra`` node (launcher, sweeper, ...)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=with_hydra)
    with initialize_config_module(config_module="conf", version_base=None):
        return hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=with_hydra)


def _flattened(node: Any, prefix: str, resolve: bool) -> dict[str, Any]:
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=resolve)
    if isinstance(node, Mapping) and node:
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(_flattened(value, f"{prefix}{key}.", resolve))
        return flat
    return {prefix[:-1]: node} if prefix else {}


def flat_keys(node: Any, prefix: str = "") -> list[str]:
    """Every leaf key of a nested config, dotted (``train.optimizer.lr``); lists are leaves; interpolations unresolved."""
    return list(_flattened(node, prefix, resolve=False))


def flat_items(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{optimizer: {lr: 0.1}}`` -> ``{"optimizer.lr": 0.1}``: nested config values as the dotted overrides a recipe takes
    (configs write them nested so that each can be overridden from the command line); an empty dict is a value."""
    return _flattened(node, prefix, resolve=True)


def _near(key: str, known: Iterable[str]) -> list[str]:
    known = list(known)
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    if not close:  # also match the last part alone: train.optimizer.learning_rate ~ train.optimizer.lr
        tail = key.rsplit(".", 1)[-1]
        close = [k for k in known if k.rsplit(".", 1)[-1] in difflib.get_close_matches(tail, [k.rsplit(".", 1)[-1] for k in known], n=3, cutoff=0.6)]
    return close[:3]


def unknown_key_message(key: str, known: Iterable[str], where: str) -> str:
    known = sorted(set(known))
    parent = key.rsplit(".", 1)[0] + "." if "." in key else ""
    depth = key.count(".")
    siblings = [k for k in known if k.startswith(parent) and k.count(".") == depth]
    close = _near(key, known)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    listed = ", ".join(siblings[:40]) + (" ..." if len(siblings) > 40 else "")
    return f"unknown config key {key!r} in {where}.{hint} Valid keys{' under ' + parent[:-1] if parent else ''}: {listed}"


def check_known_keys(cfg: Any, reference: Any, where: str, free: Sequence[str] = (), prefix: str = "") -> None:
    """Raise :class:`ConfigError` for keys of ``cfg`` that ``reference`` does not have (``free``: prefixes
    under which any key is allowed, e.g. ``model.kwargs``)."""
    known = {prefix + k for k in flat_keys(reference)}
    known_nodes = {k.rsplit(".", i)[0] for k in known for i in range(k.count(".") + 1)}
    for key in flat_keys(cfg):
        full = prefix + key
        if full in known or full in known_nodes or any(full == f or full.startswith(f + ".") for f in free):
            continue
        raise ConfigError(unknown_key_message(full, known, where))


MODEL_KEYS = ("name", "checkpoint", "trust_pickle", "pretrained", "layer", "fake_relu", "kwargs")


def check_train_config(cfg: DictConfig) -> None:
    """Refuse keys that ``python -m training`` would ignore: every key of ``train`` must be one of the
    chosen recipe's (``conf/train/<recipe>.yaml``), every top-level key one of ``conf/train.yaml``'s."""
    recipe = get(cfg, "train.name")
    from .recipes import RECIPE_DEFAULTS, RECIPES

    if recipe not in RECIPES:
        raise ConfigError(f"unknown training recipe {recipe!r}: use one of {sorted(RECIPES)} (train=NAME)")
    defaults = RECIPE_DEFAULTS.get(recipe, recipe)
    reference = compose("train", [f"train={defaults}"])
    check_known_keys(cfg.train, reference.train, f"the {recipe} recipe (conf/train/{defaults}.yaml)", prefix="train.")
    top = {k: v for k, v in cfg.items() if k not in ("model", "data", "train")}
    check_known_keys(top, {k: v for k, v in reference.items() if k not in ("model", "data", "train")}, "conf/train.yaml")
    check_known_keys(cfg.model, {k: None for k in MODEL_KEYS}, "the model config", free=("model.kwargs",), prefix="model.")


def _sweep_free(override) -> str:
    """An override line with a sweep (``a=1,2``, ``range(3)``) replaced by its first value."""
    if not override.is_sweep_override():
        return override.input_line
    first = next(iter(override.sweep_string_iterator()))
    return f"{override.get_key_element()}={first}"


def parse_overrides(arguments: Sequence[str]) -> list:
    """Hydra's parse of command-line overrides (flags such as ``-m`` and ``--cfg`` left out), with a config loader
    (:func:`training.sweeps.override_parser`: a glob sweep over a config group reads the group's options from it)."""
    from .sweeps import override_parser

    return override_parser().parse_overrides([a for a in arguments if not a.startswith("-")])


def quoted(value) -> str:
    """``value`` as a single-quoted Hydra override value, read back verbatim: a path with ``=``, ``,`` (a sweep
    unquoted), ``~``, spaces or quotes. Backslashes are doubled only where Hydra unescapes them (before a quote)."""
    return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), str(value)) + "'"


def _quoting_hint(override: str | None) -> str:
    """For an override whose value holds characters of Hydra's grammar (a sweep job's folder, ``runs/n_targets=4``): how
    to quote it."""
    key, sep, value = (override or "").partition("=")
    if not sep or not any(c in value for c in "=,()[]{}:'\" ") or value[:1] in "[{'\"":
        return ""
    return f". Quote a value that holds '=', ',', brackets or spaces, and the whole override for the shell: \"{key}={quoted(value)}\""


def override_value(value) -> str:
    """``value`` (a config's None, bool, number, string, list or mapping, OmegaConf's containers too) written as a Hydra
    override value that reads back as the same value: ``null``, ``true``, strings quoted (:func:`quoted`: a ``,`` would
    start a sweep, a ``=`` break the grammar, and ``None`` unquoted would be the string "None"), lists and mappings
    element by element."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return quoted(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{key}:{override_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, Sequence):
        return "[" + ",".join(override_value(item) for item in value) + "]"
    raise TypeError(f"cannot write a {type(value).__name__} ({value!r}) as a Hydra override value")


def _first_unknown_subkey(key: str, overrides: Sequence[str], known: Sequence[str]) -> str:
    """For a dict value (``train.schedule={name:step,milestone:[5]}``) the first of its keys that the node lacks,
    dotted (``train.schedule.milestone``); ``key`` itself otherwise. ``overrides``: the lines composed (no sweeps)."""
    for override in parse_overrides(overrides):
        value = override.value() if override.key_or_group == key else None
        if isinstance(value, Mapping):
            for leaf in flat_keys(OmegaConf.create(dict(value))):
                parts = leaf.split(".")
                for depth in range(1, len(parts) + 1):  # the shortest unknown prefix: a misspelt node, not its leaves
                    candidate = ".".join([key, *parts[:depth]])
                    if candidate not in known:
                        return candidate
    return key


def _composition_message(err: Exception, overrides: Sequence[str] = ()) -> str:
    """Hydra's composition error without its config search path; an unknown group choice (``invert=papr``) with
    the close and the valid choices, spelt as the override that chose it (``model_a=`` for ``model@model_a=``)."""
    from hydra.errors import MissingConfigException

    if isinstance(err, MissingConfigException) and err.options and err.missing_cfg_file:
        group, _, choice = err.missing_cfg_file.rpartition("/")
        options = sorted(err.options)
        close = difflib.get_close_matches(choice, options, n=3, cutoff=0.5)
        packaged = [o.split("=", 1)[0].lstrip("+") for o in overrides if o.lstrip("+").startswith(f"{group}@") and o.endswith(f"={choice}")]
        key = packaged[0].split("@", 1)[1] if packaged else group  # the package: stimuli's model_a= alias of model@model_a=
        hint = f" Did you mean {' or '.join(f'{key}={c}' for c in close)}?" if close else ""
        return (f"unknown {group} config {choice!r} ({key}={choice}: no {group}/{choice}.yaml on the config search path).{hint}"
                f" Valid choices: {', '.join(options)}{_launcher_hint(err.missing_cfg_file)}")
    message = str(err).split("\nConfig search path:")[0].strip()
    cause = str(err.__cause__ or "").strip().splitlines()
    if cause and cause[0] not in message:  # "Error merging override hydra.launcher.timeout_min=4h" said nothing of why
        message += f": {cause[0]}"
    message += _launcher_hint(message)
    twice = re.match(r"(\S+) appears more than once in the final defaults list", message)
    if twice:  # '+invert=fast' adds a second invert config to the one the command already chooses
        message += f": choose another with {twice.group(1)}=NAME (no +)"
    return message


def _launcher_hint(text: str) -> str:
    """How to get the Slurm and local-process launchers, where ``text`` names one and hydra-submitit-launcher is missing
    (its configs are what ``slurm_gpu`` extends: without it both fail to load, and the valid choices omit them)."""
    from importlib.util import find_spec

    if "hydra/launcher" not in text or find_spec("hydra_plugins.hydra_submitit_launcher") is not None:
        return ""
    return (". The submitit launchers (hydra/launcher=slurm_gpu, submitit_slurm, submitit_local) need hydra-submitit-launcher: "
            'pip install -e ".[slurm]"')


def _is_group(key: str) -> bool:
    from importlib.resources import files

    return "/" in key or (files("conf") / key).is_dir()


def _check_composition(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """``compose(config_name, overrides)`` (no sweeps), with Hydra's composition errors as :class:`ConfigError`: an
    unknown key named with the close and the valid keys."""
    from hydra.errors import ConfigCompositionException

    try:
        return compose(config_name, overrides)
    except ConfigCompositionException as err:
        found = re.search(r"Could not override '([^']+)'", str(err))
        if not found:
            raise ConfigError(_composition_message(err, overrides)) from None
        key = found.group(1)
        rest = [o for o in overrides if not o.lstrip("+~").startswith(key + "=")]
        base = compose(config_name, rest, with_hydra=key.startswith("hydra."))  # hydra.launcher.* keys live there
        if not key.startswith("hydra.") and OmegaConf.select(base, key) is None and _unknown_added_key(key, base, config_name) is None:
            node = key.rsplit(".", 1)[0]
            raise ConfigError(f"{key!r} is not set in conf/{config_name}.yaml with these choices, but {node} takes it: "
                              f"add it with +{key}=VALUE (the + adds a key)") from None
        known = [k for k in flat_keys(base) if k.startswith("hydra.") == key.startswith("hydra.")]
        known += [k.rsplit(".", i)[0] for k in known for i in range(1, k.count(".") + 1)]
        key = _first_unknown_subkey(key, overrides, known)
        where = "Hydra's config (the chosen hydra/launcher and hydra/sweeper)" if key.startswith("hydra.") else f"conf/{config_name}.yaml"
        raise ConfigError(unknown_key_message(key, known, where)) from None


def check_overrides(config_name: str, arguments: Sequence[str]) -> DictConfig:
    """Compose ``config_name`` with command-line ``arguments`` (sweeps take their first value) and return
    it; a key that does not exist is refused as :class:`ConfigError` naming the close and the valid keys. A sweep's
    later values are composed too where they can change the keys (config group choices, dict values).

    Meant to run before ``@hydra.main``: Hydra answers ``train.epoch=1`` with "To append to your config
    use +train.epoch=1", which would start a run that ignores the value.
    """
    from hydra.errors import OverrideParseException

    try:
        parsed = parse_overrides(arguments)
    except OverrideParseException as err:
        raise ConfigError(f"cannot read the override {err.override!r}: {err.message}{_quoting_hint(err.override)}") from None
    overrides = [_sweep_free(o) for o in parsed]
    config = _check_composition(config_name, overrides)
    for i, o in enumerate(parsed):  # later sweep values that can change the config's keys: group choices and dict values
        if o.is_sweep_override() and (_is_group(o.key_or_group) or any(v.lstrip().startswith("{") for v in o.sweep_string_iterator())):
            for value in list(o.sweep_string_iterator())[1:]:
                try:
                    _check_composition(config_name, overrides[:i] + [f"{o.get_key_element()}={value}"] + overrides[i + 1:])
                except ConfigError as err:
                    raise ConfigError(f"{err} (in the sweep's jobs with {o.key_or_group}={value})") from None
    _check_values(config_name, parsed, overrides)
    # '+group=choice' adds a whole config group: one the command's config does not choose is read by no code.
    groups = [o for o in parsed if (o.is_add() or o.is_force_add()) and not o.package and "." not in o.key_or_group
              and "/" not in o.key_or_group and _is_group(o.key_or_group)]
    if groups:
        base = compose(config_name, [line for o, line in zip(parsed, overrides) if o not in groups])
        unread = [o for o in groups if o.key_or_group not in base]
        if unread:
            used = sorted(k for k in base if _is_group(str(k)))
            o = unread[0]
            raise ConfigError(f"{o.input_line} adds the {o.key_or_group} config group, which conf/{config_name}.yaml does not use, so no "
                              f"code would read it; this command's groups are {', '.join(used) or 'none'}")
    # '+key=value' adds a key Hydra accepts and no command reads: one new to a closed node is a typo.
    added = {o.key_or_group for o in parsed if (o.is_add() or o.is_force_add()) and not o.key_or_group.startswith("hydra.")
             and ("." in o.key_or_group or not _is_group(o.key_or_group))}  # '+group=choice' adds a config group
    if added:
        base = compose(config_name, [line for o, line in zip(parsed, overrides) if o.key_or_group not in added])
        unknown = sorted(filter(None, (_unknown_added_key(key, base, config_name) for key in added)))
        if unknown:
            known = flat_keys(base)
            parts = unknown[0].split(".")
            for depth in range(1, len(parts)):  # below a pass-through node: its schema's keys
                node = ".".join(parts[:depth])
                schema = _pass_through_schema(config_name, node)
                if schema is not None:
                    known = [f"{node}.{k}" for k in schema]
            known += [k.rsplit(".", i)[0] for k in known for i in range(1, k.count(".") + 1)]
            raise ConfigError(unknown_key_message(unknown[0], known, f"conf/{config_name}.yaml")
                              + f" ('+{unknown[0]}=...' would add a key that {config_name} never reads)")
    return config


# Switches (false by default) that take a word besides true and false, by their last key part.
SWITCH_WORDS = {"cuda_graph": ("auto",), "overwrite": ("archive",)}


def _number_like(value: Any) -> bool:
    """What a numeric key's reader takes: a number, a fraction or ``inf`` written as text (``8/255``), null, an
    interpolation, or a list of those (``eps=[0.5,1]``); a bool is not one (``float(True)`` would read it as 1)."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return True
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        if text.startswith("${"):
            return True
        try:
            float(Fraction(text)) if "/" in text else float(text)
        except (ValueError, ZeroDivisionError):
            return False
        return True
    return isinstance(value, (list, tuple)) and all(_number_like(v) for v in value)


def _check_values(config_name: str, parsed: Sequence, overrides: Sequence[str]) -> None:
    """Refuse, for every value a command line gives (each of a sweep's too), a word where the config has a switch
    (``resume=no``: Hydra reads only true and false as booleans, and the command would read any other word as true)
    or a number (``train.beta=1,6x``: the sweep's second job would stop there, after the first had trained)."""
    candidates = [o for o in parsed if not o.is_delete() and not o.key_or_group.startswith("hydra.") and not _is_group(o.key_or_group)]
    if not candidates:
        return
    reference = compose(config_name, [line for o, line in zip(parsed, overrides) if _is_group(o.key_or_group) and not o.is_delete()])
    for o in candidates:
        default = OmegaConf.select(reference, o.key_or_group, default=None)
        # A sweep's values come back as escaped text (cuda\:1, 6x): each read as Hydra reads it for its job.
        values = ([parse_overrides([f"{o.key_or_group}={v}"])[0].value() for v in o.sweep_string_iterator()] if o.is_sweep_override()
                  else [o.value()])
        if o.key_or_group.rsplit(".", 1)[-1] == "device":  # torch names it only inside the job: a sweep would queue jobs that fail
            for value in values:
                try:
                    check_device_name(value, o.key_or_group)
                except ValueError as err:
                    raise ConfigError(str(err)) from None
            continue
        if not isinstance(default, (bool, int, float)):
            continue
        if isinstance(default, bool):
            words = SWITCH_WORDS.get(o.key_or_group.rsplit(".", 1)[-1], ())
            for value in values:
                if not (isinstance(value, bool) or str(value).lower() in ("true", "false", *words)):
                    raise ConfigError(f"{o.key_or_group} is a switch: {o.key_or_group}=true or {o.key_or_group}=false"
                                      + "".join(f" or {o.key_or_group}={w}" for w in words) + f", got {value!r}")
            continue
        for value in values:
            if not _number_like(value):
                fraction = " or a fraction like 8/255" if isinstance(default, float) else ""
                job = f" (in the sweep's jobs with {o.key_or_group}={value})" if o.is_sweep_override() else ""
                raise ConfigError(f"{o.key_or_group} takes a number (conf/{config_name}.yaml has {default!r}), e.g. "
                                  f"{o.key_or_group}={default}{fraction}, got {value!r}{job}")


# Nodes whose keys are free-form, so that '+node.anything=value' is how they are filled: architecture arguments,
# the training overrides of a reproduce preset, the parameters of (registered) abstention scores.
OPEN_NODES = ("kwargs", "model_kwargs", "overrides", "score_params")


@functools.lru_cache(maxsize=None)
def _recipe_keys(below: str = "") -> frozenset[str]:
    """Every key of the training recipes' configs (``conf/train/<recipe>.yaml``), dotted, or those under ``below``."""
    from .recipes import RECIPES

    keys: set[str] = set()
    for recipe in RECIPES:
        for key in flat_keys(compose("train", [f"train={recipe}"]).train):
            if not below or key.startswith(below + "."):
                keys.add(key[len(below) + 1:] if below else key)
    return frozenset(keys)


@functools.lru_cache(maxsize=None)
def _invert_keys() -> frozenset[str]:
    from invert.config import InvertConfig

    return frozenset(["preset", *InvertConfig().to_dict()])


# Nodes a command hands on to another schema, key by key: '+node.key=value' may add any key of that schema, and
# only those. (config name, node pattern) -> the schema's dotted keys.
PASS_THROUGH_NODES: dict[tuple[str, str], Callable[[], frozenset[str]]] = {
    ("reproduce", "scale.measure.invert"): _invert_keys,
    ("reproduce", "scale.schedule"): _recipe_keys,
    ("reproduce", "scale.recipe_schedule.*"): _recipe_keys,
    ("reproduce", "scale.attack"): lambda: _recipe_keys("attack"),
    ("reproduce", "trainings.*"): lambda: frozenset(["recipe", "adversarial", "overrides"]),
    ("demo", "schedule"): _recipe_keys,
    ("demo", "attack"): lambda: _recipe_keys("attack"),
    ("audit", "references.schedule"): _recipe_keys,
    ("audit", "references.attack"): lambda: _recipe_keys("attack"),
}


def _pass_through_schema(config_name: str, node_path: str) -> frozenset[str] | None:
    for (name, pattern), keys in PASS_THROUGH_NODES.items():
        if name == config_name and fnmatch.fnmatchcase(node_path, pattern) and node_path.count(".") == pattern.count("."):
            return keys()
    return None


@functools.lru_cache(maxsize=None)
def _null_nodes(config_name: str) -> frozenset[str]:
    """The dotted keys that ``conf/<config_name>.yaml`` sets to null: where a command takes a dict of the user's
    (``measure``'s ``controversial``), whose keys it checks itself."""
    if not config_name:
        return frozenset()
    return frozenset(key for key, value in _flattened(compose(config_name), "", resolve=False).items() if value is None)


def _unknown_added_key(key: str, base: DictConfig, config_name: str = "") -> str | None:
    """The shortest part of the dotted ``key`` that ``base`` lacks (``threat.epz`` of ``threat.epz.x``) where the node
    it would join is closed: a non-empty dict, not named in :data:`OPEN_NODES`. None when the key exists, or joins a
    free-form, empty or null node (the command checks a dict put there, as ``measure`` checks ``controversial``). Below
    a node of :data:`PASS_THROUGH_NODES` the key must be one of its schema's (``scale.measure.invert.cuda_graph``)."""
    node: Any = base
    parts = key.split(".")
    for depth, part in enumerate(parts):
        schema = _pass_through_schema(config_name, ".".join(parts[:depth])) if depth else None
        if schema is not None:
            rest = ".".join(parts[depth:])
            if rest in schema or any(k.startswith(rest + ".") for k in schema) or parts[depth] in OPEN_NODES:
                return None
            return key
        new_entry = not isinstance(node, DictConfig) or node._is_none() or part not in node
        if new_entry and _pass_through_schema(config_name, ".".join(parts[:depth + 1])) is not None:
            continue  # a new entry of a pass-through collection (scale.recipe_schedule.pgd): its keys are checked next
        if not isinstance(node, DictConfig) or node._is_none() or (depth and not len(node)):
            return None
        if part not in node:
            # a key added to a dict the user gave where the config has null (+controversial.steps=20): the command checks it
            return None if depth and ".".join(parts[:depth]) in _null_nodes(config_name) else ".".join(parts[:depth + 1])
        if part in OPEN_NODES:
            return None
        node = node._get_node(part)
    return None


def run_checked(config_name: str, arguments: Sequence[str]) -> None:
    """Exit with the message of :func:`check_overrides` (status 1, as ``sys.exit`` with a message gives) when an override
    names no key."""
    import sys

    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in arguments):
        return  # --cfg, --help, --config-name ...: Hydra's own flags; let Hydra read them
    try:
        check_overrides(config_name, arguments)
    except ConfigError as err:
        sys.exit(f"error: {err}")


__all__ = [
    "CommandError", "ConfigError", "as_list", "check_known_keys", "concise_errors",
    "check_overrides", "check_train_config", "check_whole_number", "compose", "dataset_from_config",
    "expand_path", "expand_path_options", "flat_items", "flat_keys", "get", "model_from_config", "override_value",
    "representation_from_config", "resolve_device", "run_checked",
    "unknown_key_message",
]
