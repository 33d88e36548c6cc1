"""Checkpoint import and export: safetensors, state dicts, torchvision weights, `robustness` checkpoints.

Every format is turned into one state dict with :class:`~training.models.Classifier` keys
(``net.*`` for the network, ``normalize.mean`` / ``normalize.std`` when the file carries them);
:func:`load_into` also loads into any other module (a ``defence.factory`` model) in the key layout that fits it.

Pickles load with ``torch.load(weights_only=True)``, which cannot run code. A file that needs more
(arbitrary Python objects, a whole pickled model) is refused unless the caller passes
``trust_pickle=True``. ``robustness``-library checkpoints (a dict whose ``model`` holds
``module.model.*``, ``module.attacker.model.*`` and ``module.normalizer.*``) load without the
library installed.

Command line: ``python -m training.convert SRC DST --arch resnet18 --dataset cifar10`` writes a clean
safetensors file from any supported format (:mod:`training.convert`).
"""
from __future__ import annotations

import hashlib
import json
import pickle
import pickletools
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from .io import atomic_save


class CheckpointError(ValueError):
    """A checkpoint could not be read or does not fit the model; the message says why and what to do."""


_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "model.")  # DataParallel/DDP, torch.compile, Lightning-style


def read_checkpoint(path: str | Path, trust_pickle: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read any supported checkpoint into (state dict with Classifier keys, metadata)."""
    state, metadata = _read_state_dict(path, trust_pickle)
    return canonical_state_dict(state, source=str(Path(path).expanduser())), metadata


def _read_state_dict(path: str | Path, trust_pickle: bool) -> tuple[Mapping[str, torch.Tensor], dict[str, str]]:
    """The file's own state dict (keys as saved) and its metadata."""
    path = Path(path).expanduser()
    if path.is_dir():
        held = sorted(p.name for p in path.iterdir() if p.is_file() and (".pt" in p.suffixes or p.suffix in (".pth", ".bin", ".ckpt", ".safetensors")))
        raise CheckpointError(f"{path} is a folder, not a checkpoint file: give the file inside it"
                              + (f" (it holds {held[:8]})" if held else " (it holds no .pt, .pth, .bin, .ckpt or .safetensors file)"))
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if _is_safetensors(path):
        from safetensors import SafetensorError
        from safetensors.torch import load_file, safe_open

        try:
            state = load_file(str(path))
            with safe_open(str(path), framework="pt") as f:
                metadata = dict(f.metadata() or {})
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{path} is not a readable safetensors file (truncated or corrupt?): {err}") from err
        return state, metadata
    check_torch_format(path)
    raw = _torch_load(path, trust_pickle)
    return _extract_state_dict(raw, path), _metadata_of(raw)


def _is_safetensors(path: Path) -> bool:
    if path.suffix == ".safetensors":
        return True
    with open(path, "rb") as f:
        head = f.read(9)
    # safetensors: 8-byte little-endian header length, then a JSON object.
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100_000_000


# torch.save writes a zip archive (torch >= 1.6) or, in the legacy format, a pickle (protocol byte 0x80).
_TORCH_MAGIC = (b"PK\x03\x04", b"\x80")


def check_torch_format(path: Path) -> None:
    """Refuse files that are neither a torch zip archive nor a pickle before unpickling anything, so a
    text file or random bytes get a plain "not a checkpoint" instead of advice about trusting pickles."""
    with open(path, "rb") as f:
        head = f.read(64)
    if not head:
        raise CheckpointError(f"{path} is empty: not a checkpoint (an interrupted download or copy?)")
    if head.startswith(_TORCH_MAGIC):
        return
    looks_like = "text" if all(32 <= b < 127 or b in (9, 10, 13) for b in head) else "binary data"
    raise CheckpointError(
        f"{path} is not a checkpoint: it is neither a PyTorch file (torch.save's zip archive or pickle) nor "
        f"safetensors; it starts with {looks_like} ({head[:24]!r}). Check the path, or re-download the file."
    )


# How torch's safe load starts every refusal (an object it does not allow, a class, a function, or an opcode it does not
# read, such as protocol 4's FRAME); the reason follows in its message.
_WEIGHTS_ONLY_MARKER = "weights only load failed"
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def _is_safe_load_refusal(err: BaseException) -> bool:
    """Whether torch's safe load refused what a pickle may hold (a global, or an opcode it does not read but pickle
    does), rather than bytes that are no pickle at all (an opcode pickle does not know: a corrupt file)."""
    text = str(err).lower()
    if _WEIGHTS_ONLY_MARKER not in text:
        return False
    operand = re.search(r"unsupported operand (\d+)", text)
    return operand is None or int(operand.group(1)) < 256 and chr(int(operand.group(1))) in {op.code for op in pickletools.opcodes}


def _refusal_reason(err: BaseException) -> str:
    """The line of torch's safe-load refusal that names what it refused (``Unsupported global: GLOBAL argparse.Namespace``,
    ``Unsupported operand 149``), without its terminal colour codes."""
    named = re.search(r"unsupported (?:global: GLOBAL \S+|operand \d+)", _ANSI_ESCAPE.sub("", str(err)), flags=re.IGNORECASE)
    return named.group(0) if named else first_line(err)


def _torch_load(path: Path, trust_pickle: bool) -> Any:
    _refuse_plain_pickle(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as err:
        if not trust_pickle and _is_safe_load_refusal(err):
            raise CheckpointError(
                f"{path} holds what a safe load (torch.load(weights_only=True)) refuses ({_refusal_reason(err)}): a pickle "
                f"can run arbitrary code when loaded. If you trust where this file came from, load it with "
                f"trust_pickle=True (command line: model.trust_pickle=true, or --trust-pickle for training.convert), "
                f"then convert it once to safetensors with `python -m training.convert`; if it came from an interrupted download "
                f"or copy, fetch it again"
            ) from err
        raise CheckpointError(f"{path} is not a readable checkpoint (truncated or corrupt?): {first_line(err)}") from err
    except (ModuleNotFoundError, AttributeError) as err:  # a trusted pickle of objects whose code is not importable here
        raise CheckpointError(
            f"{path} is a pickle of Python objects whose code is not importable here ({type(err).__name__}: {first_line(err)}): "
            "run with the code that defined them on PYTHONPATH, or load the file where that code lives and save its "
            "state_dict() with torch.save (a plain state dict needs no code)"
        ) from err
    except Exception as err:  # noqa: BLE001 - a corrupt archive or pickle raises almost any type (IndexError, KeyError, ...)
        raise CheckpointError(f"{path} is not a readable checkpoint (truncated or corrupt?): {type(err).__name__}: {first_line(err)}") from err


# torch.save's legacy (non-zip) format starts with a pickle of this magic number; its zip format starts "PK".
_LEGACY_TORCH_MAGIC = 0x1950A86A20F9469CFC6C


def _refuse_plain_pickle(path: Path) -> None:
    """torch.load calls a ``pickle.dump`` file corrupt ("invalid magic number"), or, loading safely, talks about
    ``weights_only``; say what it is instead, from its first opcodes, before any unpickling."""
    with open(path, "rb") as file:
        plain = file.read(1) == b"\x80"  # pickle's PROTO opcode: protocol 2 and later
        if plain:
            file.seek(0)
            plain = _is_plain_pickle(file)
    if plain:
        raise CheckpointError(f"{path} looks like a plain pickle.dump file, not torch.save's format: where you trust it, load it with "
                              "pickle and save its state dict with torch.save or as safetensors")


def _is_plain_pickle(file, opcodes: int = 64) -> bool:
    """Whether the first ``opcodes`` opcodes (or all, up to STOP) parse and are not torch's magic number: pickletools
    reads them without running any; random bytes after a PROTO byte fail to parse (a corrupt file, not a pickle)."""
    try:
        for count, (opcode, argument, _) in enumerate(pickletools.genops(file)):
            if argument == _LEGACY_TORCH_MAGIC:
                return False
            if opcode.name == "STOP" or count + 1 >= opcodes:
                return True
    except Exception:  # noqa: BLE001 - an unknown opcode or a truncated argument
        return False
    return False


def first_line(err: BaseException) -> str:
    """An error's first non-empty line, without terminal colour codes (torch's safe-load messages carry them)."""
    lines = [line for line in _ANSI_ESCAPE.sub("", str(err)).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def _extract_state_dict(raw: Any, path: Path) -> Mapping[str, torch.Tensor]:
    if isinstance(raw, nn.Module):  # a whole pickled model (only reachable with trust_pickle)
        return raw.state_dict()
    if not isinstance(raw, Mapping):
        raise CheckpointError(f"{path} holds a {type(raw).__name__}, not a state dict or a checkpoint dict")
    for key in ("model", "state_dict", "model_state_dict", "net"):
        inner = raw.get(key)
        if isinstance(inner, nn.Module):
            return inner.state_dict()
        # a state dict holds tensors: {"model": {config...}, "state_dict": weights} is read at "state_dict"
        if isinstance(inner, Mapping) and inner and all(isinstance(k, str) for k in inner) and any(isinstance(v, torch.Tensor) for v in inner.values()):
            return inner
    if raw and all(isinstance(v, torch.Tensor) for v in raw.values()):
        return raw
    if raw and all(isinstance(v, (torch.Tensor, np.ndarray)) for v in raw.values()):  # a trusted pickle of numpy weights
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in raw.items()}
    raise CheckpointError(
        f"{path}: no state dict found (looked for a tensor dict, or one under 'model', 'state_dict', "
        f"'model_state_dict', 'net'); top-level keys are {sorted(map(str, raw))[:10]}"
    )


def _metadata_of(raw: Any) -> dict[str, str]:
    if isinstance(raw, Mapping):
        return {k: str(v) for k, v in raw.items() if k in ("epoch", "arch", "dataset", "num_classes") and not isinstance(v, (Mapping, torch.Tensor))}
    return {}


# torchvision's released DenseNet weights name a dense layer's modules norm.1, conv.2 ...; its models name them norm1, conv2
# (torchvision.models.densenet._load_state_dict renames them the same way).
_LEGACY_DENSENET = re.compile(r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var|num_batches_tracked))$")


def canonical_state_dict(state: Mapping[str, torch.Tensor], source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Map any supported key layout onto Classifier keys (``net.*``, ``normalize.*``)."""
    state = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if not state:
        raise CheckpointError(f"{source}: the state dict holds no tensors")
    if any(k.startswith(("module.model.", "module.attacker.", "module.normalizer.")) for k in state):
        return _from_robustness(state)
    if any(k.startswith(("attacker.model.", "normalizer.new_")) for k in state):  # robustness, saved without DataParallel
        return _from_robustness({"module." + k: v for k, v in state.items()})
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        key = _LEGACY_DENSENET.sub(r"\1\2", _strip_prefixes(key))
        if not key.startswith(("net.", "normalize.")):
            key = "net." + key
        out[key] = value
    return out


def _strip_prefixes(key: str, prefixes: tuple[str, ...] = _WRAPPER_PREFIXES) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in prefixes:
            if key.startswith(prefix) and not key.startswith(("net.", "normalize.")):
                key, changed = key[len(prefix):], True
    return key


def _from_robustness(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """robustness layout: the classifier under module.model., a duplicate under module.attacker.model., and
    InputNormalize buffers new_mean / new_std of shape (3, 1, 1). A network trained with ``add_custom_forward=True``
    (robustness's way to train torchvision architectures it lacks) sits one ``model.`` deeper; robustness's ImageNet
    AlexNet names its last linear layer ``last_layer``, torchvision's ``classifier.6``."""
    classifier = {k[len("module.model."):]: v for k, v in state.items() if k.startswith("module.model.")}
    if classifier and all(k.startswith("model.") for k in classifier):
        classifier = {k[len("model."):]: v for k, v in classifier.items()}
    if any(k.startswith("last_layer.") for k in classifier) and not any(k.startswith("classifier.6.") for k in classifier):
        classifier = {("classifier.6." + k[len("last_layer."):] if k.startswith("last_layer.") else k): v for k, v in classifier.items()}
    out = {"net." + k: v for k, v in classifier.items()}
    for ours, theirs in (("normalize.mean", "module.normalizer.new_mean"), ("normalize.std", "module.normalizer.new_std")):
        if theirs in state:
            out[ours] = state[theirs].reshape(1, -1, 1, 1).float()
    if not any(k.startswith("net.") for k in out):
        raise CheckpointError("robustness checkpoint without module.model.* weights")
    return out


def _is_classifier_layout(keys) -> bool:
    return any(k.startswith("net.") for k in keys) and all(k.startswith(("net.", "normalize.")) for k in keys)


def _fitting_layout(raw: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """The file's keys laid out for ``own``: Classifier keys for a Classifier; for any other module (a
    ``defence.factory`` model) the candidate layout that fits its keys best: as saved, the Classifier keys without
    ``net.`` (which also maps a ``robustness`` checkpoint onto the bare network), the Classifier keys, or without
    wrapper prefixes (a submodule called ``model`` is a prefix only where stripping it fits)."""
    canonical = canonical_state_dict(raw, source=source)
    if _is_classifier_layout(own):
        return canonical
    tensors = {k: v for k, v in raw.items() if isinstance(v, torch.Tensor)}
    has_normalize = any(k.startswith("normalize.") for k in own)
    bare = {k.removeprefix("net."): v for k, v in canonical.items() if has_normalize or not k.startswith("normalize.")}
    candidates = [tensors, bare, canonical] + [{_strip_prefixes(k, prefixes): v for k, v in tensors.items()}
                                               for prefixes in (("module.", "_orig_mod."), _WRAPPER_PREFIXES)]
    return min(candidates, key=lambda state: len(state.keys() ^ own.keys()))  # the first of the best fits


def load_into(model: nn.Module, checkpoint: str | Path, trust_pickle: bool = False) -> dict[str, str]:
    """Load a checkpoint into a model, refusing one whose keys or shapes do not fit.

    A :class:`~training.models.Classifier` takes the file in Classifier keys (:func:`canonical_state_dict`), with
    normalisation stats from the file when it has them. Any other module (a ``defence.factory`` model) takes the
    layout of the file's keys that fits its own (:func:`_fitting_layout`). BatchNorm's ``num_batches_tracked``
    may be absent, as in checkpoints saved before PyTorch 0.4.1 (``load_state_dict`` accepts them too).
    """
    raw, metadata = _read_state_dict(checkpoint, trust_pickle)
    own = model.state_dict()
    state = _fitting_layout(raw, own, str(checkpoint))
    unused = tuple(getattr(model, "unused_checkpoint_keys", ()))  # e.g. TRADES's WideResNet's sub_block1
    state = {k: v for k, v in state.items() if not (unused and k.startswith(unused) and k not in own)}
    wanted = {k for k in own if not k.startswith("normalize.") and not k.endswith(".num_batches_tracked")}
    missing = sorted(wanted - state.keys())
    unexpected = sorted(k for k in state if k not in own)
    mismatched = sorted(k for k in state.keys() & own.keys() if state[k].shape != own[k].shape)
    if missing or unexpected or mismatched:
        arch = getattr(model, "arch", type(model).__name__)
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {missing[:3]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[:3]})")
        if mismatched:
            parts.append("shape mismatch for " + ", ".join(f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in mismatched[:3]))
        # Builder arguments are named only where the network built with them fits the file (kwargs_hint); where the keys
        # are the model's and only the output layer differs, the file's class count is.
        hint_of = getattr(model, "kwargs_hint", None)  # a zoo Classifier can tell which builder argument differs
        same_keys = mismatched and not missing and not unexpected
        hint = (hint_of(state) if callable(hint_of) else "") or (_class_count_hint(model, state, mismatched) if same_keys else "")
        raise CheckpointError(
            f"{checkpoint} does not fit {arch} with {getattr(model, 'num_classes', '?')} classes: {'; '.join(parts)}"
            + (hint or ". Is it a checkpoint of another architecture or data set?")
        )
    halves = [k for k in ("normalize.mean", "normalize.std") if k in state]
    if len(halves) == 1 and any(k.startswith("normalize.") for k in own):
        other = ({"normalize.mean", "normalize.std"} - set(halves)).pop()
        raise CheckpointError(f"{checkpoint} holds {halves[0]} but not {other}: half an input normalisation would mix the file's and the "
                              f"data set's; add {other} to the file, or drop {halves[0]} to use the data set's statistics")
    _refuse_non_finite(model, state, checkpoint)
    model.load_state_dict(state, strict=False)
    if any(k.startswith("normalize.") for k in own):  # did the file say how its inputs were normalised?
        model.normalization_from_checkpoint = "normalize.mean" in state and "normalize.std" in state
    return metadata


def _class_count_hint(model: nn.Module, state: Mapping[str, torch.Tensor], mismatched: list[str]) -> str:
    """Where the shapes that differ are the output layer's, the file's class count and how to build for it."""
    classes = getattr(model, "num_classes", None)
    own = model.state_dict()
    outputs = {state[k].shape[0] for k in mismatched if own[k].shape[:1] == (classes,) and state[k].shape[1:] == own[k].shape[1:]}
    if classes is None or len(outputs) != 1 or len(mismatched) > 2:
        return ""
    found = outputs.pop()
    return (f" (the checkpoint has {found} outputs, the model {classes}: choose the data set it was trained on (data=..., or "
            f"--dataset for training.convert), or build with num_classes={found} (--num-classes {found}))")


def _refuse_non_finite(model: nn.Module, state: Mapping[str, torch.Tensor], checkpoint) -> None:
    """Weights or batch-norm statistics holding NaN or Inf (a run that diverged) are refused here, naming the file: loaded,
    they surface as a NaN objective at the first step of an inversion or attack, far from their cause. Other buffers
    may hold infinities on purpose and are not checked."""
    checked = {name for name, _ in model.named_parameters()} | {k for k in state if k.endswith((".running_mean", ".running_var"))}
    bad = sorted(k for k in checked & state.keys() if state[k].is_floating_point() and not bool(torch.isfinite(state[k]).all()))
    if bad:
        raise CheckpointError(f"{checkpoint} holds NaN or Inf in {len(bad)} weight tensor(s) (e.g. {bad[:3]}): the training run that wrote it "
                              "diverged; use an earlier checkpoint of that run or train again (a lower learning rate)")


def save_checkpoint(model: nn.Module, path: str | Path, metadata: Mapping[str, Any] | None = None) -> Path:
    """Write the model's weights (normalisation included) as safetensors, atomically, with its metadata: its
    architecture, data set and classes, and its builder arguments as ``kwarg.<name>`` (a k-WTA ratio has no weight
    to tell it by), which :func:`training.models.build_model` checks when it loads the file."""
    from safetensors.torch import save_file

    meta = {"format": "repalign"}
    for attr in ("arch", "dataset", "num_classes"):
        if hasattr(model, attr):
            meta[attr] = str(getattr(model, attr))
    meta.update({f"kwarg.{k}": str(v) for k, v in (getattr(model, "arch_kwargs", None) or {}).items()})
    meta.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()})
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    return atomic_save(path, lambda tmp: save_file(state, str(tmp), metadata=meta))


def weights_hash(module: nn.Module) -> str:
    """SHA-256 (16 hex digits) of a module's parameters and buffers: resuming with other weights
    would mix two models in one set."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()[:16]
