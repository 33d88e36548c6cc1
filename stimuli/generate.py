"""Inversion and controversial stimulus sets through the batched engine, resumable and shardable.

:func:`make_inversion_set` inverts a model's representation from every seed of every target
(Nanda et al., AAAI 2023, section 2.4 and appendix A.4, Eq. 1). :func:`make_controversial_set`
makes controversial stimuli for a model pair from origin images and several random starts each,
in both directions in one call (Nanda et al. Eq. 2, Table 2: model A keeps its representation of
the origin while model B's moves away, and B/A), or with the class-controversial objective of
Golan, Raju & Kriegeskorte (PNAS 2020) as the alternative. Out-of-distribution sets are the same
calls with :func:`stimuli.gaussian_targets` (Table 3).

How a run is organised
    The set is planned up front: static images (targets or origins, seeds or starts) and one
    *item* per result, numbered globally. Items are cut into *chunks* of ``chunk_size``
    consecutive items that share one objective (the two-model controversial objective covers both
    directions and all restarts at once, :class:`invert.TwoWayControversialLoss`; a
    class-controversial direction never straddles a chunk); ``chunk_size=None`` makes one chunk per
    objective, the whole set as one batch. Each chunk is one engine call with ``item_offset`` = its first item, so every random
    key is the global item number and a chunk computes the same numbers in every run.

    Resumable: each finished chunk is written to ``OUT/parts/`` (tensors, then a JSON record with
    their hash, both atomic), so a crash loses at most the chunk in progress; a rerun with the same
    parameters skips the recorded chunks. When all chunks are there the set is assembled and
    ``manifest.json`` is written last; ``parts/`` is then removed.

    Shardable: chunk ``c`` belongs to shard ``c mod n_shards``. A shard writes a set of its own
    results and of the targets and seeds they refer to; :func:`stimuli.merge_sets` joins the
    shards into exactly the set an unsharded run writes (same chunks, same computations).

    A run refuses to continue parts or overwrite a set made with different parameters (the
    parameters' fingerprint covers targets, seeds, models and their weights, the objective, the
    engine config and the chunk size), unless ``overwrite=True`` (which deletes it and the trial tables in its ``trials/``) or
    ``overwrite="archive"`` (which moves it aside to ``<out>.replaced-<k>``, nothing lost: what the
    measurement pipelines do with the sets they keep as caches, so a rerun after a settings or code
    change measures afresh instead of stopping).

    One process at a time: a run holds ``.<out>.lock`` beside its folder (:func:`training.io.exclusive_lock`) from
    checking ``out`` until the set is written, so a second process asking for the same set waits and then reuses it.

Deliberate differences from the paper's code: seeds are per target (one shared noise seed on
request), and controversial starts are uniform noise keyed by (origin, restart) and shared by
both directions, so A/B and B/A are compared from the same starts.
"""
from __future__ import annotations

import json
import logging
import math
import numbers
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from invert import (
    NOISE_KINDS,
    ClassControversialLoss,
    ControversialLoss,
    Engine,
    InversionLoss,
    InvertConfig,
    TwoWayControversialLoss,
    check_push_weight,
    check_sharpness,
    module_device,
    resolve_engine,
)
from training.checkpoints import weights_hash
from training.io import atomic_save, atomic_write_json, exclusive_lock

from .sets import (
    PARTS_DIR,
    StimulusSet,
    StimulusSetError,
    canonical_json,
    fingerprint_of,
    is_complete_set,
    load_set,
    manifest_table,
    read_manifest,
    remove_set,
    sha256_file,
    tensor_sha256,
    write_set,
)
from .sources import Seeds, Targets, keyed_generator, make_seeds, noise_image

logger = logging.getLogger(__name__)

# A paper-size set (100 targets x 2 seeds) is one engine call; bigger sets resume per 256 items. None: the whole
# set in one engine call (its micro-batches then come from the engine's memory budget alone), resumable only as a whole.
DEFAULT_CHUNK_SIZE = 256
DIRECTIONS = ("AB", "BA")
CONTROVERSIAL_OBJECTIVES = ("controversial", "class_controversial")
# Where the random starts of controversial stimuli come from (Nanda et al. optimise "from different starting
# values"): noise of one of invert.NOISE_KINDS (uniform by default; super and light are the inversion seeds of
# the authors' code), or the origin plus Gaussian noise of std start_sigma.
CONTROVERSIAL_STARTS = (*NOISE_KINDS, "origin")
# Engine settings that may change between a run and its resumption (e.g. a smaller micro-batch
# after running out of memory) without making it a different set.
# They change no item's objective or step, but other batch shapes round differently (invert.engine's docstring).
EXECUTION_KEYS = ("progress", "micro_batch", "cpu_micro_batch", "memory_fraction", "cuda_graph")


@dataclass
class ModelRef:
    """A model as the builders need it, with the names recorded as provenance.

    representation: [0, 1] images → features (for inversion and controversial sets), e.g. a
    :class:`training.Representation`. classifier: [0, 1] images → logits (for the
    class-controversial objective). name, checkpoint, layer: provenance (``layer`` defaults to the
    representation's ``layer`` attribute). settings: what changes the model's function but not its weights (a
    zoo model's kwargs such as a k-WTA ratio, a factory and its kwargs); part of every set's fingerprint, so a
    set made with other settings is not taken for this model's.
    """

    name: str
    representation: nn.Module | None = None
    classifier: nn.Module | None = None
    checkpoint: str | None = None
    layer: str | None = None
    settings: dict | None = None

    def __post_init__(self) -> None:
        if self.representation is None and self.classifier is None:
            raise ValueError(f"model {self.name!r}: give a representation (features) or a classifier (logits)")
        if self.layer is None and self.representation is not None:
            self.layer = getattr(self.representation, "layer", None)
        if self.checkpoint is not None:
            self.checkpoint = str(self.checkpoint)

    @classmethod
    def from_classifier(
        cls, classifier: nn.Module, name: str | None = None, checkpoint: str | None = None,
        layer: str | None = None, fake_relu: bool | None = None, settings: Mapping | None = None,
    ) -> "ModelRef":
        """Wrap a zoo :class:`training.Classifier`: its representation at ``layer`` (default the
        penultimate) and its logits."""
        from training import Representation

        representation = Representation(classifier, layer=layer, fake_relu=fake_relu)
        return cls(name or getattr(classifier, "arch", type(classifier).__name__), representation, classifier, checkpoint,
                   settings=dict(settings) if settings else None)

    def module(self, what: str) -> nn.Module:
        module = self.representation if what == "representation" else self.classifier
        if module is None:
            raise ValueError(f"model {self.name!r} has no {what}: the objective needs one")
        return module

    def device(self) -> torch.device:
        return module_device(self.representation, self.classifier)

    def provenance(self) -> dict:
        provenance = {
            "name": self.name,
            # The weights' hash says which weights; the path only where they were read, which a resumption or another
            # shard (a Slurm node staging files elsewhere) may spell differently: its file name alone is recorded here.
            "checkpoint": Path(self.checkpoint).name if self.checkpoint else None,
            "layer": self.layer,
            "fake_relu": getattr(self.representation, "fake_relu", None),
            "weights_sha256": weights_hash(self.classifier if self.classifier is not None else self.representation),
        }
        if self.settings:  # left out when empty, so sets made before settings were recorded keep their fingerprint
            provenance["settings"] = self.settings
        # Also left out where they add nothing (so older sets keep their fingerprint): a representation with weights of
        # its own (an encoder beside a probe), whose new weights were taken for the old set's; a pool other than auto's.
        if self.representation is not None and self.classifier is not None:
            shared = {t.data_ptr() for t in (*self.classifier.parameters(), *self.classifier.buffers())}
            if any(t.data_ptr() not in shared for t in (*self.representation.parameters(), *self.representation.buffers())):
                provenance["representation_sha256"] = weights_hash(self.representation)
        pool, default_pool = getattr(self.representation, "pool", None), getattr(self.representation, "default_pool", None)
        if pool is not None and default_pool is not None and pool != default_pool:
            provenance["pool"] = pool
        return provenance


# Options added after sets were first written, at the value that reproduces the old behaviour: left out of the
# fingerprint then, so a set made before the option existed is still recognised as the same set.
NEUTRAL_DEFAULTS = {"step_schedule": "constant"}


def _engine_parameters(engine: Engine) -> dict:
    values = engine.config.to_dict()
    parameters = {k: v for k, v in values.items() if k not in EXECUTION_KEYS and not (k in NEUTRAL_DEFAULTS and v == NEUTRAL_DEFAULTS[k])}
    if values["transform_robust"] and (values["tv_weight"] or values["lp_weight"]):
        parameters["priors_on"] = "image"  # the engine once put priors inside the transformations: such sets are remade, not reused
    return parameters


# ------------------------------------------------------------------------------------------- plans


@dataclass
class _Group:
    """Consecutive items [start, stop) that share one objective."""

    name: str
    start: int
    stop: int
    objective: Callable[[Tensor, torch.device], nn.Module]  # (global item ids, device) → objective


@dataclass
class _Chunk:
    index: int
    group: _Group
    start: int
    stop: int


@dataclass
class _Plan:
    kind: str
    static_rows: list[dict]
    static_images: Tensor
    result_rows: list[dict]  # one per item, in item order
    init_index: Tensor  # item → row of static_images it starts from
    groups: list[_Group]
    parameters: dict
    chunk_size: int | None  # None: one chunk per group

    def chunks(self) -> list[_Chunk]:
        out = []
        for group in self.groups:
            size = self.chunk_size or max(group.stop - group.start, 1)
            for start in range(group.start, group.stop, size):
                out.append(_Chunk(len(out), group, start, min(start + size, group.stop)))
        return out


def _id_width(n: int) -> int:
    return max(4, len(str(max(n - 1, 0))))


def _target_rows(targets: Targets, prefix: str, role: str, first_position: int) -> list[dict]:
    width = _id_width(len(targets))
    rows = []
    for k in range(len(targets)):
        label = int(targets.labels[k])
        index = int(targets.source_index[k])
        rows.append({
            "id": f"{prefix}{k:0{width}d}",
            "position": first_position + k,
            "role": role,
            "label": label if label >= 0 else None,
            "class_name": targets.class_name(k),
            "source": targets.sources[k],
            "source_split": targets.split,
            "source_index": index if index >= 0 else None,
        })
    return rows


def _inversion_plan(model: ModelRef, targets: Targets, seeds: Seeds, chunk_size: int | None, engine: Engine) -> _Plan:
    n = len(targets)
    target_rows = _target_rows(targets, "t", "target", 0)
    target_ids = [r["id"] for r in target_rows]
    seed_rows = []
    for j in range(len(seeds)):
        owner, seed_type = seeds.targets[j], seeds.seed_types[j]
        train_label = int(seeds.labels[j])
        row = {
            "id": f"seed.{seed_type}" if owner is None else f"{target_ids[owner]}.seed.{seed_type}",
            "position": n + j,
            "role": "seed",
            "target_id": None if owner is None else target_ids[owner],
            "seed_type": seed_type,
        }
        if seed_type == "train":
            row.update(
                label=train_label,
                class_name=seeds.train_classes[train_label] if seeds.train_classes and 0 <= train_label < len(seeds.train_classes) else None,
                source=seeds.train_source,
                source_split="train",
                source_index=int(seeds.train_index[j]),
            )
        else:
            gray_noise = seeds.params.get("noise_channels") == "gray"
            kind = seeds.params.get("noise", "uniform")
            row["source"] = (f"{kind}_gray_noise" if gray_noise else f"{kind}_noise") if seed_type == "noise" else "constant"
        seed_rows.append(row)
    provenance = model.provenance()
    result_rows, init_index, target_of = [], [], []
    first = n + len(seeds)
    for k in range(n):
        for seed_type in seeds.params["types"]:
            j = seeds.lookup[(k, seed_type)]
            result_rows.append({
                "id": f"{target_ids[k]}.result.{seed_type}",
                "position": first + len(result_rows),
                "role": "result",
                "target_id": target_ids[k],
                "seed_id": seed_rows[j]["id"],
                "seed_type": seed_type,
                "label": target_rows[k]["label"],
                "class_name": target_rows[k]["class_name"],
                "model": model.name,
                "layer": model.layer,
                "checkpoint": model.checkpoint,
                "objective": "inversion",
                "objective_params": {"loss": "||g(x) - g(x_t)||_2 / ||g(x_t)||_2"},
            })
            init_index.append(n + j)
            target_of.append(k)
    representation = model.module("representation")
    target_index = torch.tensor(target_of, dtype=torch.long)

    def objective(items: Tensor, device: torch.device) -> nn.Module:
        # Target features are computed per chunk from that chunk's rows, so a chunk's numbers do
        # not depend on which other chunks run in the same process.
        return InversionLoss(representation, targets.images[target_index[items]].to(device))

    parameters = {
        "kind": "inversion",
        "targets": targets.params,
        "seeds": seeds.params,
        "model": provenance,
        "objective": {"name": "inversion"},
        "engine": _engine_parameters(engine),
        "chunk_size": chunk_size,
    }
    static_images = torch.cat([targets.images, seeds.images]).float().contiguous()
    parameters["static_sha256"] = tensor_sha256(static_images)
    return _Plan(
        kind="inversion",
        static_rows=target_rows + seed_rows,
        static_images=static_images,
        result_rows=result_rows,
        init_index=torch.tensor(init_index, dtype=torch.long),
        groups=[_Group("inversion", 0, len(result_rows), objective)],
        parameters=parameters,
        chunk_size=chunk_size,
    )


def _controversial_plan(
    model_a: ModelRef,
    model_b: ModelRef,
    origins: Targets,
    *,
    objective: str,
    lam: float,
    alpha: float,
    restarts: int,
    directions: Sequence[str],
    start: str,
    start_sigma: float,
    seed: int,
    chunk_size: int | None,
    engine: Engine,
    num_classes: int | None,
) -> _Plan:
    n = len(origins)
    origin_rows = _target_rows(origins, "o", "origin", 0)
    origin_ids = [r["id"] for r in origin_rows]
    start_type = "origin" if start == "origin" else "noise"  # the seed_type of the starts and of the results from them
    start_rows, start_images, start_of = _controversial_starts(origins, origin_ids, restarts, start, start_sigma, seed, start_type)
    models = {"A": model_a, "B": model_b}
    class_keep = class_push = None
    if objective == "class_controversial":
        classes = _class_count(origins, num_classes, (model_a, model_b))
        class_keep, class_push = origins.labels.clone(), _pushed_classes(origins, classes, seed)
    provenance = {"A": model_a.provenance(), "B": model_b.provenance()}
    result_rows, init_index, origin_of, groups = [], [], [], []
    first = n + len(start_rows)
    for direction in directions:
        keep, push = models[direction[0]], models[direction[1]]
        group_start = len(result_rows)
        for k in range(n):
            for r in range(restarts):
                params: dict[str, Any]
                if objective == "controversial":
                    params = {"lambda": lam}
                else:
                    params = {"alpha": alpha, "class_keep": int(class_keep[k]), "class_push": int(class_push[k])}
                    if origins.classes:
                        params.update(class_keep_name=origins.classes[int(class_keep[k])], class_push_name=origins.classes[int(class_push[k])])
                result_rows.append({
                    "id": f"{origin_ids[k]}.{direction}.{r:02d}",
                    "position": first + len(result_rows),
                    "role": "result",
                    "origin_id": origin_ids[k],
                    "seed_id": start_rows[start_of[(k, r)]]["id"],
                    "seed_type": start_type,
                    "direction": direction,
                    "restart": r,
                    "label": origin_rows[k]["label"],
                    "class_name": origin_rows[k]["class_name"],
                    "model": keep.name,
                    "layer": keep.layer,
                    "checkpoint": keep.checkpoint,
                    "pushed_model": push.name,
                    "pushed_layer": push.layer,
                    "pushed_checkpoint": push.checkpoint,
                    "objective": objective,
                    "objective_params": params,
                })
                init_index.append(n + start_of[(k, r)])
                origin_of.append(k)
        groups.append(_Group(direction, group_start, len(result_rows), _controversial_objective(
            objective, keep, push, origins, torch.tensor(origin_of, dtype=torch.long), lam, alpha, class_keep, class_push,
        )))
    if objective == "controversial" and sorted(directions) == sorted(DIRECTIONS):
        # Both directions (and all restarts) as one engine batch: the same forwards as one batch per direction, half the
        # launches (invert.TwoWayControversialLoss computes each row exactly as ControversialLoss does).
        first_keeps = torch.tensor([row["direction"] == "AB" for row in result_rows])
        groups = [_Group("+".join(directions), 0, len(result_rows), _two_way_objective(
            model_a, model_b, origins, torch.tensor(origin_of, dtype=torch.long), first_keeps, lam,
        ))]
    parameters = {
        "kind": objective,
        "origins": origins.params,
        "starts": {"restarts": restarts, "noise": start, "seed": seed, **({"sigma": start_sigma} if start == "origin" else {})},
        "models": provenance,
        "directions": list(directions),
        # The class count draws each origin's pushed class: a set made with another one is another set.
        "objective": {"name": objective, **({"lambda": lam} if objective == "controversial" else {"alpha": alpha, "num_classes": classes})},
        "engine": _engine_parameters(engine),
        "chunk_size": chunk_size,
    }
    static_images = torch.cat([origins.images, torch.stack(start_images)]).float().contiguous()
    parameters["static_sha256"] = tensor_sha256(static_images)
    return _Plan(
        kind=objective,
        static_rows=origin_rows + start_rows,
        static_images=static_images,
        result_rows=result_rows,
        init_index=torch.tensor(init_index, dtype=torch.long),
        groups=groups,
        parameters=parameters,
        chunk_size=chunk_size,
    )


def _controversial_starts(
    origins: Targets, origin_ids: list[str], restarts: int, start: str, start_sigma: float, seed: int, start_type: str,
) -> tuple[list[dict], list[Tensor], dict[tuple[int, int], int]]:
    """Each (origin, restart)'s start image and manifest row; ``start_of`` maps (origin, restart) to its row."""
    n, shape = len(origins), tuple(origins.images.shape[1:])
    start_rows, start_images = [], []
    start_of: dict[tuple[int, int], int] = {}
    for k in range(n):
        for r in range(restarts):
            # Keyed by (origin, restart) alone: neither n nor the number of restarts moves a start.
            if start == "origin":  # x0 plus Gaussian noise: Eq. 2 has zero gradient at x0 itself
                noise = torch.randn(shape, generator=keyed_generator(seed, f"controversial_start:{r}", k))
                image = (origins.images[k] + start_sigma * noise).clamp(0, 1)
            else:
                image = noise_image(shape, seed, f"controversial_start:{r}", k, kind=start)
            start_of[(k, r)] = len(start_rows)
            start_rows.append({
                "id": f"{origin_ids[k]}.start.{r:02d}",
                "position": n + len(start_rows),
                "role": "seed",
                "origin_id": origin_ids[k],
                "seed_type": start_type,
                "restart": r,
                "source": "origin_plus_noise" if start == "origin" else f"{start}_noise",
            })
            start_images.append(image)
    return start_rows, start_images, start_of


def _class_count(origins: Targets, num_classes: int | None, models: Sequence[ModelRef]) -> int:
    """The class-controversial objective's class count: given, else the origins', else a classifier's."""
    if bool((origins.labels < 0).any()):
        raise ValueError("the class-controversial objective needs labelled origins (data-set images, not Gaussian ones)")
    classes = num_classes or (len(origins.classes) if origins.classes else None)
    for m in models:
        classes = classes or getattr(m.classifier, "num_classes", None)
    if not classes or classes < 2:
        raise ValueError("the class-controversial objective needs the number of classes (num_classes=)")
    return classes


def _pushed_classes(origins: Targets, classes: int, seed: int) -> Tensor:
    """Per origin, the class the pushed model is driven to: another than the origin's, drawn keyed by the origin."""
    return torch.tensor(
        [(int(origins.labels[k]) + 1 + int(torch.randint(classes - 1, (1,), generator=keyed_generator(seed, "class_controversial", k))))
         % classes for k in range(len(origins))],
        dtype=torch.long,
    )


def _two_way_objective(model_a, model_b, origins, origin_of, first_keeps, lam):
    def build(items: Tensor, device: torch.device) -> nn.Module:
        return TwoWayControversialLoss(model_a.module("representation"), model_b.module("representation"),
                                       origins.images[origin_of[items]].to(device), first_keeps[items], lam=lam)

    return build


def _controversial_objective(objective, keep, push, origins, origin_of, lam, alpha, class_keep, class_push):
    def build(items: Tensor, device: torch.device) -> nn.Module:
        index = origin_of[items]
        if objective == "controversial":
            return ControversialLoss(keep.module("representation"), push.module("representation"), origins.images[index].to(device), lam=lam)
        return ClassControversialLoss(
            keep.module("classifier"), push.module("classifier"), class_keep[index].to(device), class_push[index].to(device), alpha=alpha,
        )

    return build


# ------------------------------------------------------------------------------------------- runs


class _Parts:
    """Finished chunks of one run in ``OUT/parts``: ``chunk-NNNNN.safetensors`` (results) and
    ``chunk-NNNNN.json`` (its record: items, fingerprint, the tensors' hash), both atomic, the
    record last, so a chunk counts as done only when both are complete and agree."""

    def __init__(self, folder: Path, fingerprint: str):
        self.folder, self.fingerprint = folder, fingerprint

    def _files(self, chunk: _Chunk) -> tuple[Path, Path]:
        stem = self.folder / f"chunk-{chunk.index:05d}"
        return stem.with_suffix(".safetensors"), stem.with_suffix(".json")

    def load(self, chunk: _Chunk) -> dict | None:
        """The chunk's results, or None when it is not (validly) done."""
        from safetensors.torch import load_file

        tensors_file, record_file = self._files(chunk)
        if not record_file.is_file():
            return None
        try:
            record = json.loads(record_file.read_text())
            ok = (
                record.get("fingerprint") == self.fingerprint
                and record.get("items") == [chunk.start, chunk.stop]
                and tensors_file.is_file()
                and sha256_file(tensors_file) == record.get("sha256")
            )
            if ok:
                return {"record": record, **load_file(str(tensors_file))}
        except (OSError, ValueError) as err:
            logger.warning("chunk %d in %s is unreadable (%s): running it again", chunk.index, self.folder, err)
            return None
        logger.warning("chunk %d in %s does not match its record: running it again", chunk.index, self.folder)
        return None

    def save(self, chunk: _Chunk, result: Any) -> dict:
        from safetensors.torch import save_file

        tensors = {
            "images": result.images.detach().to("cpu", torch.float32).contiguous(),
            "best_loss": result.best_loss.detach().to("cpu", torch.float32).contiguous(),
            "task_loss": result.task_loss.detach().to("cpu", torch.float32).contiguous(),
            "initial_loss": result.initial_loss.detach().to("cpu", torch.float32).contiguous(),
            "last_loss": result.last_loss.detach().to("cpu", torch.float32).contiguous(),
            "steps_used": result.steps_used.detach().to("cpu", torch.long).contiguous(),
            "loss_curve": result.loss_curve.detach().to("cpu", torch.float32).T.contiguous(),
        }
        tensors_file, record_file = self._files(chunk)
        atomic_save(tensors_file, lambda tmp: save_file(tensors, str(tmp)))
        record = {
            "chunk": chunk.index,
            "group": chunk.group.name,
            "items": [chunk.start, chunk.stop],
            "fingerprint": self.fingerprint,
            "sha256": sha256_file(tensors_file),
            "curve_steps": [int(s) for s in result.curve_steps],
        }
        atomic_write_json(record_file, record)
        return {"record": record, **tensors}


def _config_record(config: Mapping[str, Any] | None) -> dict:
    if config is None:  # a Python-API run: the parameters say everything
        return {}
    if hasattr(config, "_metadata"):
        from omegaconf import OmegaConf

        config = OmegaConf.to_container(config, resolve=True)
    config = dict(config)
    try:
        return json.loads(canonical_json(config))
    except TypeError as err:
        bad = []
        for key, value in config.items():
            try:
                canonical_json(value)
            except TypeError:
                bad.append(key)
        raise ValueError(f"config key(s) {bad} cannot be recorded in the manifest ({err}): pass plain numbers, strings, lists and "
                         "dicts (e.g. str(device))") from None


OVERWRITE_MODES = (False, True, "archive")


def _archive(out: Path, why: str) -> None:
    """Move ``out`` aside to the first free ``<out>.replaced-<k>`` (an atomic rename: nothing is lost)."""
    k = 1
    while (aside := out.with_name(f"{out.name}.replaced-{k}")).exists():
        k += 1
    out.rename(aside)
    logger.warning("%s held %s: moved it to %s and starting afresh", out, why, aside)


def _prepare(out: Path, fingerprint: str, shard_info: dict | None, n_chunks: int, overwrite: bool | str) -> tuple[bool, bool]:
    """Make ``out`` ready for this run. Returns (done, replacing): ``done`` when it already holds this very set (nothing
    to do); ``replacing`` when ``overwrite=true`` replaces a set (with other parameters, or the same ones made afresh), which
    stays in place (and in use) until the new one is assembled, so an interrupted replacement loses neither (rerun with
    overwrite=true to resume one with other parameters; one with the same parameters starts again)."""
    if overwrite not in OVERWRITE_MODES:
        raise ValueError(f"overwrite must be false, true or 'archive', got {overwrite!r}")
    if out.exists() and not out.is_dir():
        raise StimulusSetError(f"{out} is a file: give a directory for the stimulus set")
    cleared = replacing = False  # a set this run replaces: what else its folder holds stays, and the new set joins it
    if is_complete_set(out):
        unreadable = None
        try:
            info = read_manifest(out)
            same = info.get("fingerprint") == fingerprint and info.get("shard") == shard_info
        except StimulusSetError as err:
            same, unreadable = False, err
        if same and overwrite is not True:
            return True, False
        if overwrite == "archive":
            _archive(out, "a stimulus set made with other parameters" if unreadable is None else "a stimulus set whose manifest cannot be read")
        elif not overwrite:
            held = "a different stimulus set (other parameters or shard)" if unreadable is None else f"a set that cannot be read ({unreadable})"
            raise StimulusSetError(
                f"{out} already holds {held}: choose another out, "
                "or pass overwrite=true to replace it (also to resume an interrupted replacement)"
            )
        elif same:  # made afresh with the same parameters: the old set stays in use until the new one is whole
            shutil.rmtree(out / PARTS_DIR, ignore_errors=True)  # parts it kept (keep_parts) would be reused, not made again
            cleared = replacing = True
        else:
            cleared = replacing = True
    plan_file = out / PARTS_DIR / "plan.json"
    if plan_file.is_file():
        try:
            previous = json.loads(plan_file.read_text())
        except (OSError, ValueError):
            previous = {}
        if (previous.get("fingerprint"), previous.get("shard")) != (fingerprint, shard_info):
            if overwrite == "archive":
                _archive(out, "the parts of an unfinished run with other parameters")
            elif not overwrite:
                raise StimulusSetError(
                    f"{out} holds the parts of an unfinished run with other parameters (or another shard): rerun with the "
                    "original settings to resume it, choose another out, or pass overwrite=true to discard those parts"
                )
            elif replacing:  # the parts of yet another run: the set being replaced stays until the new one is whole
                shutil.rmtree(out / PARTS_DIR)
            else:
                remove_set(out)
    elif out.is_dir() and any(out.iterdir()) and not (out / PARTS_DIR).is_dir() and not cleared:
        if overwrite:
            raise StimulusSetError(f"{out} is not empty and not a stimulus set: refusing to delete it; choose another out")
        raise StimulusSetError(f"{out} is not empty and not a stimulus set: choose a new or empty directory")
    (out / PARTS_DIR).mkdir(parents=True, exist_ok=True)
    atomic_write_json(plan_file, {"fingerprint": fingerprint, "shard": shard_info, "n_chunks_in_shard": n_chunks})
    return False, replacing


def set_lock_file(out: str | Path) -> Path:
    """The lock file of the stimulus set at ``out``: a hidden file beside the folder (``.<name>.lock``), not in it, so
    that archiving, replacing or removing the set never moves the lock a waiting process holds open."""
    out = Path(out).expanduser().resolve()
    return out.parent / f".{out.name}.lock"


def _assemble(plan: _Plan, out: Path, mine: list[_Chunk], done: dict[int, dict], keep_all_static: bool) -> tuple[list[dict], Tensor, Tensor, list[int]]:
    """This shard's results and the static images they refer to (all of them for an unsharded run), in complete-set
    order: (manifest rows, images, loss curves with NaN rows for static images, curve steps)."""
    curve_steps = done[mine[0].index]["record"]["curve_steps"]
    result_rows, result_images, result_curves = [], [], []
    for chunk in mine:
        part = done[chunk.index]
        if part["record"]["curve_steps"] != curve_steps:
            raise StimulusSetError(f"chunk {chunk.index} in {out / PARTS_DIR} has other curve steps: rerun with overwrite=true")
        for offset, item in enumerate(range(chunk.start, chunk.stop)):
            row = dict(plan.result_rows[item])
            row.update(
                steps_used=int(part["steps_used"][offset]),
                initial_loss=float(part["initial_loss"][offset]),
                final_loss=float(part["best_loss"][offset]),
                final_task_loss=float(part["task_loss"][offset]) if "task_loss" in part else math.nan,  # parts saved before it
                last_loss=float(part["last_loss"][offset]) if "last_loss" in part else math.nan,
            )
            result_rows.append(row)
        result_images.append(part["images"])
        result_curves.append(part["loss_curve"])
    referenced = {row[link] for row in result_rows for link in ("target_id", "seed_id", "origin_id") if row.get(link)}
    static = [(i, row) for i, row in enumerate(plan.static_rows) if keep_all_static or row["id"] in referenced]
    static_index = torch.tensor([i for i, _ in static], dtype=torch.long)
    rows = [row for _, row in static] + result_rows
    images = torch.cat([plan.static_images[static_index]] + result_images)
    curves = torch.cat([torch.full((len(static), len(curve_steps)), math.nan)] + result_curves)
    order = sorted(range(len(rows)), key=lambda i: rows[i]["position"])
    return [rows[i] for i in order], images[order], curves[order], curve_steps


def _run_plan(
    plan: _Plan,
    out: str | Path,
    engine: Engine,
    *,
    device: torch.device,
    shard: int,
    n_shards: int,
    config: Mapping[str, Any] | None,
    overwrite: bool | str,
    keep_parts: bool,
    preview: bool,
) -> StimulusSet:
    out = Path(out)
    if n_shards < 1 or not 0 <= shard < n_shards:
        raise ValueError(f"need 0 <= shard < n_shards, got shard={shard} n_shards={n_shards}")
    if plan.static_images.shape[1] not in (1, 3):  # write_set's refusal, before the engine runs rather than after
        raise ValueError(f"stimulus-set images need 1 or 3 channels (PNGs hold grey or RGB), got {plan.static_images.shape[1]}")
    chunks = plan.chunks()
    mine = [c for c in chunks if c.index % n_shards == shard]
    if len(chunks) < n_shards:  # refused in every shard: shard 0 ran the whole set before shard 3 learnt it could not merge
        n_items = len(plan.result_rows)
        raise ValueError(
            f"n_shards={n_shards} needs at least {n_shards} chunks, one per shard, but the set's {n_items} items make only "
            + (f"{len(chunks)} chunk(s) of up to {plan.chunk_size} items" if plan.chunk_size
               else f"{len(chunks)} chunk(s), one per objective (chunk_size=null)")
            + f": use n_shards={len(chunks)} or fewer, or chunk_size={max(1, -(-n_items // n_shards))} or smaller"
        )
    n_total = len(plan.static_rows) + len(plan.result_rows)
    shard_info = None if n_shards == 1 else {"index": shard, "count": n_shards, "n_images": n_total}
    if plan.parameters["engine"].get("precision") == "auto" and engine.resolved_precision(device) == "bf16":
        # auto means bf16 here: recorded as such, so that fp32 runs (auto on a CPU) never resume or reuse these parts.
        # auto in fp32 stays "auto", as sets made before this record it.
        plan.parameters["engine"]["precision"] = "bf16"
    fingerprint = fingerprint_of(plan.parameters)
    config_record = _config_record(config)  # before the engine runs: a config JSON cannot hold is named now
    # Two jobs of a sweep that need the same set (reproduce's presets share their measurements) make it once: the
    # second waits here, then finds it complete and reuses it.
    with exclusive_lock(set_lock_file(out), what=str(out), activity="being made"):
        done_already, replacing = _prepare(out, fingerprint, shard_info, len(mine), overwrite)
        if done_already:
            logger.info("%s already holds this set: nothing to do", out)
            return load_set(out, allow_shard=shard_info is not None)
        parts = _Parts(out / PARTS_DIR, fingerprint)
        done: dict[int, dict] = {}
        for chunk in mine:
            previous = parts.load(chunk)
            if previous is not None:
                done[chunk.index] = previous
        if done:
            logger.info("resuming %s: %d of %d chunks already done", out, len(done), len(mine))
        for chunk in mine:
            if chunk.index in done:
                continue
            items = torch.arange(chunk.start, chunk.stop)
            objective = chunk.group.objective(items, device)
            init = plan.static_images[plan.init_index[items]].to(device)
            result = engine.run(objective, init, item_offset=chunk.start, desc=f"{plan.kind} chunk {chunk.index + 1}/{len(chunks)}")
            done[chunk.index] = parts.save(chunk, result)
            logger.info("chunk %d/%d done (items %d-%d)", chunk.index + 1, len(chunks), chunk.start, chunk.stop - 1)

        rows, images, curves, curve_steps = _assemble(plan, out, mine, done, keep_all_static=n_shards == 1)
        if replacing:  # the replaced set goes only now, with the trial tables that name its images
            remove_set(out, keep_parts=True)
        write_set(
            out,
            images,
            manifest_table(rows),
            kind=plan.kind,
            parameters=plan.parameters,
            config=config_record,
            fingerprint=fingerprint,
            curve_steps=curve_steps,
            loss_curve=curves,
            shard=shard_info,
            preview=preview,
        )
        if not keep_parts:
            shutil.rmtree(out / PARTS_DIR, ignore_errors=True)
        return load_set(out, allow_shard=shard_info is not None)


def _device(device: str | torch.device | None, *models: ModelRef) -> torch.device:
    if device is not None:
        return torch.device(device)
    return models[0].device()


def check_chunk_size(chunk_size: int | None) -> int | None:
    """``chunk_size`` as an int of at least 1, or None (the whole set in one engine call); refuses anything else."""
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Real) or not float(chunk_size).is_integer() or chunk_size < 1:
        raise ValueError(
            f"chunk_size must be at least 1 (a whole number of items), or None (null in a config) for the whole set in one engine call; "
            f"got {chunk_size!r}"
        )
    return int(chunk_size)


def make_inversion_set(
    out: str | Path,
    model: ModelRef,
    targets: Targets,
    *,
    seed_types: Sequence[str] = ("noise", "train"),
    train_set: Any = None,
    shared_noise: bool = False,
    noise_channels: str = "color",
    noise_kind: str = "uniform",
    seed: int = 0,
    engine: Engine | InvertConfig | Mapping | str | None = None,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    shard: int = 0,
    n_shards: int = 1,
    device: str | torch.device | None = None,
    config: Mapping[str, Any] | None = None,
    overwrite: bool | str = False,
    keep_parts: bool = False,
    preview: bool = True,
) -> StimulusSet:
    """Invert ``model``'s representation for every target × seed type; write the set to ``out``.

    Nanda et al. (AAAI 2023) Eq. 1: each result minimises ``||g(x) - g(x_t)|| / ||g(x_t)||`` from
    its seed with the engine (``engine``: an :class:`invert.Engine`, config, preset name or None for
    the paper's 5000 L2 steps). Seeds come from :func:`stimuli.make_seeds` (``train_set`` is the
    model's training split, needed for ``train`` seeds; ``noise_channels``: ``color`` noise seeds, ``gray``, or ``auto``:
    grey for greyscale targets; ``noise_kind``: their distribution, :data:`invert.NOISE_KINDS`). ``model.representation`` must live on
    ``device`` (default: the model's device). ``chunk_size`` items make one engine call and one resumable part;
    None runs the whole set as one engine call (one batch, micro-batched from the GPU's memory; the fastest on a
    GPU, but an interrupted run starts again). ``config`` is recorded as the config that made the
    set. With ``n_shards > 1`` this writes shard ``shard`` to ``out`` (merge with
    :func:`stimuli.merge_sets`). Resumes an unfinished run in ``out``; returns the loaded set.
    """
    engine = resolve_engine(engine)
    seeds = make_seeds(targets, seed_types, seed=seed, train_set=train_set, shared_noise=shared_noise, noise_channels=noise_channels,
                       noise_kind=noise_kind)
    plan = _inversion_plan(model, targets, seeds, check_chunk_size(chunk_size), engine)
    return _run_plan(
        plan, out, engine, device=_device(device, model), shard=shard, n_shards=n_shards, config=config,
        overwrite=overwrite, keep_parts=keep_parts, preview=preview,
    )


def make_controversial_set(
    out: str | Path,
    model_a: ModelRef,
    model_b: ModelRef,
    origins: Targets,
    *,
    objective: str = "controversial",
    lam: float = 0.1,
    alpha: float = 100.0,
    restarts: int = 3,
    directions: Sequence[str] = DIRECTIONS,
    start: str = "uniform",
    start_sigma: float = 0.1,
    num_classes: int | None = None,
    seed: int = 0,
    engine: Engine | InvertConfig | Mapping | str | None = None,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    shard: int = 0,
    n_shards: int = 1,
    device: str | torch.device | None = None,
    config: Mapping[str, Any] | None = None,
    overwrite: bool | str = False,
    keep_parts: bool = False,
    preview: bool = True,
) -> StimulusSet:
    """Controversial stimuli for the pair (A, B) from each origin and ``restarts`` random starts.

    ``objective="controversial"`` (Nanda et al. Eq. 2): direction ``AB`` minimises
    ``||g_A(x) - g_A(x0)|| / ||g_A(x0)|| - lam * ||g_B(x) - g_B(x0)|| / ||g_B(x0)||`` (A keeps its
    representation of the origin x0, B's moves away); ``BA`` swaps the models; both directions
    run in one call, as in the paper's Table 2. ``objective="class_controversial"`` (Golan et al.
    2020): in ``AB`` model A is driven to the origin's class and B to another class drawn per
    origin (smooth minimum with sharpness ``alpha``); needs ``classifier`` on both models.
    Starts (:data:`CONTROVERSIAL_STARTS`) are keyed by (origin, restart) and shared by both directions:
    noise of a kind of :data:`invert.NOISE_KINDS` (``uniform`` by default; :func:`stimuli.sources.noise_image`), or ``origin``: the
    origin plus Gaussian noise of std ``start_sigma``, clamped; the starts and their results carry ``seed_type`` ``noise``
    or ``origin`` accordingly. Other arguments as :func:`make_inversion_set`.
    """
    if objective not in CONTROVERSIAL_OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}: use one of {CONTROVERSIAL_OBJECTIVES}")
    directions = tuple(str(d) for d in directions)
    if not directions or len(set(directions)) != len(directions) or set(directions) - set(DIRECTIONS):
        raise ValueError(f"directions must be distinct values of {DIRECTIONS}, got {list(directions)}")
    if isinstance(restarts, bool) or not isinstance(restarts, numbers.Integral) or restarts < 1:  # 1.5 and true ran 1 restart
        raise ValueError(f"restarts must be a whole number >= 1, got {restarts!r}")
    if start not in CONTROVERSIAL_STARTS:
        raise ValueError(f"start must be one of {CONTROVERSIAL_STARTS}, got {start!r}")
    if start == "origin" and not (math.isfinite(start_sigma) and start_sigma > 0):
        raise ValueError(f"start=origin needs start_sigma > 0 (Eq. 2 has no gradient at the origin itself), got {start_sigma}")
    lam, alpha = check_push_weight(lam), check_sharpness(alpha)
    needed = "representation" if objective == "controversial" else "classifier"
    for m in (model_a, model_b):
        m.module(needed)
    engine = resolve_engine(engine)
    plan = _controversial_plan(
        model_a, model_b, origins, objective=objective, lam=float(lam), alpha=float(alpha), restarts=int(restarts),
        directions=directions, start=start, start_sigma=float(start_sigma), seed=seed, chunk_size=check_chunk_size(chunk_size), engine=engine,
        num_classes=num_classes,
    )
    return _run_plan(
        plan, out, engine, device=_device(device, model_a), shard=shard, n_shards=n_shards, config=config,
        overwrite=overwrite, keep_parts=keep_parts, preview=preview,
    )


__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DIRECTIONS",
    "ModelRef",
    "check_chunk_size",
    "make_controversial_set",
    "make_inversion_set",
]
