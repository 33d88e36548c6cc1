"""Inversion and controversial sets through the engine: structure and provenance, resumption after
a crash equals a run in one go, shards merge to the unsharded set, refusals."""
from __future__ import annotations

import json

import pytest
import torch

from stimuli import (
    IncompleteSetError,
    ModelRef,
    StimulusSetError,
    gaussian_targets,
    load_set,
    make_controversial_set,
    make_inversion_set,
    merge_sets,
    select_targets,
    set_trials,
)
from stimuli.sets import MANIFEST, TENSORS

N_TARGETS, CHUNK = 4, 3  # 8 results in chunks of 3, 3, 2


@pytest.fixture(scope="module", autouse=True)
def _helpers(kit):
    """Module-level names for the conftest helpers (see conftest.kit)."""
    global CountingEngine, SimulatedCrash, tiny_representation, tiny_classifier
    CountingEngine, SimulatedCrash = kit.CountingEngine, kit.SimulatedCrash
    tiny_representation, tiny_classifier = kit.tiny_representation, kit.tiny_classifier


def tiny_model() -> ModelRef:
    return ModelRef("tiny", tiny_representation(0), checkpoint="tiny.safetensors", layer="features")


def invert(out, digits, engine=None, **kwargs):
    test, train = digits
    options = dict(seed_types=["noise", "train"], train_set=train, chunk_size=CHUNK, engine=engine or CountingEngine(), preview=False)
    options.update(kwargs)
    return make_inversion_set(out, tiny_model(), select_targets(test, N_TARGETS, seed=0), **options)


def same_files(a, b, names=(MANIFEST, TENSORS)):
    return all((a / name).read_bytes() == (b / name).read_bytes() for name in names)


@pytest.fixture(scope="module")
def one_go(tmp_path_factory, digits):
    engine = CountingEngine()
    s = invert(tmp_path_factory.mktemp("one_go") / "set", digits, engine, preview=True)
    return s, engine


def test_inversion_set_structure_links_and_provenance(one_go):
    s, engine = one_go
    m = s.manifest
    assert engine.calls == 3 and s.kind == "inversion" and len(s) == 4 + 8 + 8
    assert list(m["position"]) == list(range(len(m)))
    targets, seeds, results = (m[m.role == r] for r in ("target", "seed", "result"))
    assert len(targets) == 4 and len(seeds) == 8 and len(results) == 8
    ids = set(m["id"])
    for r in results.itertuples():
        seed = m[m.id == r.seed_id].iloc[0]
        assert r.target_id in ids and seed.target_id == r.target_id and seed.seed_type == r.seed_type
        assert (r.model, r.layer, r.checkpoint, r.objective) == ("tiny", "features", "tiny.safetensors", "inversion")
        assert r.steps_used == 2 and r.final_loss <= r.initial_loss
    # A result starts from its seed and moves; the kept image is in [0, 1].
    for seed_type in ("noise", "train"):
        rows = results[results.seed_type == seed_type]
        assert not torch.equal(s.get(list(rows["id"])), s.get(list(rows["seed_id"])))
    assert s.images.min() >= 0 and s.images.max() <= 1
    assert s.curve_steps == [0, 1, 2] and not s.loss_curve[s.index_of(results["id"])].isnan().any()
    assert s.loss_curve[s.index_of(targets["id"])].isnan().all()
    assert s.parameters["model"]["name"] == "tiny" and len(s.parameters["model"]["weights_sha256"]) == 16
    assert s.parameters["engine"]["steps"] == 2 and s.parameters["seeds"]["types"] == ["noise", "train"]
    assert (s.path / "preview.png").is_file() and not (s.path / "parts").exists()


def test_trials_from_a_generated_set_hard_triplets_nearest_in_pixels(one_go):
    s, _ = one_go
    table = set_trials(s, "clustering_hard", seed=0)
    targets = s.role("target")[1].flatten(1)
    ids = list(s.role("target")[0]["id"])

    def nearest(a):
        i = ids.index(a)
        order = sorted((j for j in range(len(ids)) if j != i), key=lambda j: float((targets[i] - targets[j]).norm()))
        return {ids[j] for j in order[:2]}

    shown = [frozenset(group[["column_0", "column_1", "column_2"]].iloc[0]) for _, group in table.groupby("trial")]
    assert len(set(shown)) == len(shown)  # no triplet twice
    for columns in shown:  # an anchor with its two nearest, or, where that triplet is another trial's, a harder free one
        assert any(columns - {a} == nearest(a) or (frozenset({a} | nearest(a)) in shown and frozenset({a} | nearest(a)) != columns)
                   for a in columns)
    assert len(set_trials(s, "2afc", attention_rate=0.2)) == 10


def test_interrupted_and_resumed_set_equals_the_one_written_in_one_go(tmp_path, digits, one_go):
    out = tmp_path / "resumed"
    with pytest.raises(SimulatedCrash):
        invert(out, digits, CountingEngine(fail_on=3))  # dies in the last chunk
    with pytest.raises(IncompleteSetError, match=r"2 of 3 chunks done.*run the same command again to resume"):
        load_set(out)
    assert sorted(p.name for p in (out / "parts").glob("chunk-*.json")) == ["chunk-00000.json", "chunk-00001.json"]
    engine = CountingEngine()
    resumed = invert(out, digits, engine)
    assert engine.calls == 1  # only the chunk that was lost
    assert same_files(out, one_go[0].path)
    assert torch.equal(resumed.images, one_go[0].images)
    # Rerunning a finished set does nothing.
    engine = CountingEngine()
    invert(out, digits, engine)
    assert engine.calls == 0


def test_a_checkpoint_path_spelled_another_way_resumes_the_same_set(tmp_path, digits):
    """The path was fingerprinted as given: a resumption or a shard with ./ or an absolute path was another set."""
    test, train = digits
    options = dict(seed_types=["noise", "train"], train_set=train, chunk_size=CHUNK, preview=False)

    def model(checkpoint):
        return ModelRef("tiny", tiny_representation(0), checkpoint=checkpoint, layer="features")

    with pytest.raises(SimulatedCrash):
        make_inversion_set(tmp_path / "set", model("models/tiny.safetensors"), select_targets(test, N_TARGETS, seed=0),
                           engine=CountingEngine(fail_on=3), **options)
    engine = CountingEngine()
    make_inversion_set(tmp_path / "set", model("/scratch/job/./models/tiny.safetensors"), select_targets(test, N_TARGETS, seed=0),
                       engine=engine, **options)
    assert engine.calls == 1  # only the chunk that was lost


def test_a_damaged_part_is_computed_again(tmp_path, digits, one_go):
    out = tmp_path / "damaged"
    with pytest.raises(SimulatedCrash):
        invert(out, digits, CountingEngine(fail_on=3))
    part = out / "parts" / "chunk-00001.safetensors"
    part.write_bytes(part.read_bytes()[:-7])
    engine = CountingEngine()
    invert(out, digits, engine)
    assert engine.calls == 2 and same_files(out, one_go[0].path)


def test_resuming_with_other_parameters_is_refused_unless_overwrite(tmp_path, digits):
    out = tmp_path / "other"
    with pytest.raises(SimulatedCrash):
        invert(out, digits, CountingEngine(fail_on=2))
    with pytest.raises(StimulusSetError, match="parts of an unfinished run with other parameters.*overwrite=true"):
        invert(out, digits, seed_types=["noise", "gray"])
    s = invert(out, digits, seed_types=["noise", "gray"], overwrite=True)
    assert set(s.manifest["seed_type"].dropna()) == {"noise", "gray"}
    with pytest.raises(StimulusSetError, match="already holds a different stimulus set"):
        invert(out, digits, engine=CountingEngine(steps=3))
    manifest = out / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])  # truncated: the refusal says so, not "other parameters"
    with pytest.raises(StimulusSetError, match=r"already holds a set that cannot be read \(.*manifest\.json is not valid JSON.*overwrite=true"):
        invert(out, digits, seed_types=["noise", "gray"])


def test_overwrite_replaces_a_set_that_has_trial_tables_and_keeps_other_files(tmp_path, digits):
    """`python -m stimuli trials` writes into <set>/trials/: overwrite=true deleted the set and then refused the
    folder as 'not a stimulus set', so the old set was gone and no new one was written."""
    out = tmp_path / "set"
    first = invert(out, digits)
    table = set_trials(first, "2afc", seed=0)
    (out / "trials").mkdir()
    table.to_csv(out / "trials" / "2afc-seed0.csv", index=False)
    (out / "notes.txt").write_text("mine")
    again = invert(out, digits, overwrite=True)  # the same parameters, made afresh
    assert again.fingerprint == first.fingerprint and not (out / "trials").exists()  # its trials named the old images
    second = invert(out, digits, seed_types=["noise", "gray"], overwrite=True)
    assert load_set(out).fingerprint == second.fingerprint != first.fingerprint
    assert (out / "notes.txt").read_text() == "mine"


def test_an_interrupted_replacement_loses_neither_set(tmp_path, digits):
    """overwrite=true deleted the set before the new run had made anything: a crash left neither."""
    out = tmp_path / "set"
    first = invert(out, digits)
    (out / "trials").mkdir()
    set_trials(first, "2afc", seed=0).to_csv(out / "trials" / "2afc-seed0.csv", index=False)
    with pytest.raises(SimulatedCrash):
        invert(out, digits, CountingEngine(fail_on=2), seed_types=["noise", "gray"], overwrite=True)
    kept = load_set(out)  # the old set, whole and in use, with its trial tables
    assert kept.fingerprint == first.fingerprint and torch.equal(kept.images, first.images) and (out / "trials" / "2afc-seed0.csv").is_file()
    with pytest.raises(StimulusSetError, match="also to resume an interrupted replacement"):
        invert(out, digits, seed_types=["noise", "gray"])
    engine = CountingEngine()
    second = invert(out, digits, engine, seed_types=["noise", "gray"], overwrite=True)
    assert engine.calls == 2  # the replacement resumed: its first chunk was kept
    assert load_set(out).fingerprint == second.fingerprint != first.fingerprint and not (out / "trials").exists()
    assert second.images.shape == invert(tmp_path / "fresh", digits, seed_types=["noise", "gray"]).images.shape
    assert torch.equal(second.images, load_set(tmp_path / "fresh").images)


def test_an_interrupted_remake_with_the_same_parameters_keeps_the_old_set(tmp_path, digits):
    """overwrite=true with the same parameters deleted the set before the run made anything: a crash left none."""
    out = tmp_path / "set"
    first = invert(out, digits)
    with pytest.raises(SimulatedCrash):
        invert(out, digits, CountingEngine(fail_on=2), overwrite=True)
    kept = load_set(out)
    assert kept.fingerprint == first.fingerprint and torch.equal(kept.images, first.images)
    engine = CountingEngine()
    again = invert(out, digits, engine, overwrite=True)
    assert engine.calls > 0 and torch.equal(again.images, first.images) and load_set(out).fingerprint == first.fingerprint


def test_archive_moves_an_out_of_date_set_or_its_parts_aside_and_starts_afresh(tmp_path, digits):
    """What the measurement pipelines do with their cached sets: nothing is deleted, nothing is refused."""
    out = tmp_path / "set"
    first = invert(out, digits, CountingEngine())
    again = CountingEngine()
    assert invert(out, digits, again, overwrite="archive").fingerprint == first.fingerprint and again.calls == 0  # up to date: kept
    second = invert(out, digits, seed_types=["noise", "gray"], overwrite="archive")
    assert second.fingerprint != first.fingerprint
    assert load_set(tmp_path / "set.replaced-1").fingerprint == first.fingerprint
    with pytest.raises(SimulatedCrash):
        invert(out, digits, CountingEngine(fail_on=2, steps=3), overwrite=True)
    third = invert(out, digits, overwrite="archive")
    assert third.fingerprint == first.fingerprint and (tmp_path / "set.replaced-2" / "parts").is_dir()
    with pytest.raises(ValueError, match="overwrite must be false, true or 'archive'"):
        invert(tmp_path / "bad", digits, overwrite="yes")


def test_execution_settings_leave_the_set_as_it_is(digits, one_go):
    # cuda_graph and the micro-batch change how the engine runs, never what it computes: a set made without them
    # is the set asked for with them (no refusal, no engine call), so adding such keys keeps existing sets valid.
    s, _ = one_go
    engine = CountingEngine(cuda_graph="auto", micro_batch=2)
    again = invert(s.path, digits, engine, preview=True)
    assert engine.calls == 0 and again.fingerprint == s.fingerprint
    assert "step_schedule" not in s.parameters["engine"]  # the constant schedule is the behaviour from before the option


def test_a_step_schedule_is_a_different_set(tmp_path, digits):
    constant = invert(tmp_path / "constant", digits, CountingEngine())
    cosine = invert(tmp_path / "cosine", digits, CountingEngine(step_schedule="cosine"))
    assert cosine.parameters["engine"]["step_schedule"] == "cosine" and cosine.fingerprint != constant.fingerprint


def test_settings_the_weights_do_not_show_make_another_set(digits, one_go):
    """A k-WTA ratio changes the model, not its weights: recorded as settings, it is part of the fingerprint; a model
    without settings keeps the fingerprint sets had before settings were recorded."""
    s, _ = one_go
    assert "settings" not in s.parameters["model"]
    test, train = digits
    model = ModelRef("tiny", tiny_representation(0), checkpoint="tiny.safetensors", layer="features", settings={"ratio": 0.5})
    with pytest.raises(StimulusSetError, match="already holds a different stimulus set"):
        make_inversion_set(s.path, model, select_targets(test, N_TARGETS, seed=0), seed_types=["noise", "train"], train_set=train,
                           chunk_size=CHUNK, engine=CountingEngine(), preview=False)


def test_shards_merge_to_the_unsharded_set(tmp_path, digits, one_go):
    shards = []
    for shard in range(2):
        s = invert(tmp_path / f"shard{shard}", digits, shard=shard, n_shards=2)
        assert s.shard == {"index": shard, "count": 2, "n_images": 20}
        shards.append(s.path)
    # Shard 0 has chunks 0 and 2 (items 0-2 and 6-7) and the targets and seeds those refer to.
    first = load_set(shards[0], allow_shard=True)
    assert len(first.role("result")[0]) == 5
    assert list(first.role("target")[0]["id"]) == ["t0000", "t0001", "t0003"] and len(first.role("seed")[0]) == 5
    with pytest.raises(IncompleteSetError, match="shard 0 of 2"):
        load_set(shards[0])
    with pytest.raises(StimulusSetError, match=r"missing shards \[1\]"):
        merge_sets(shards[:1], tmp_path / "merged")
    merged = merge_sets(shards, tmp_path / "merged")
    assert merged.shard is None
    assert same_files(merged.path, one_go[0].path)
    pngs = sorted(p.name for p in (one_go[0].path / "images").iterdir())
    assert pngs == sorted(p.name for p in (merged.path / "images").iterdir())
    assert same_files(merged.path, one_go[0].path, [f"images/{name}" for name in pngs])


def test_chunk_size_none_inverts_the_whole_set_in_one_engine_call(tmp_path, digits, one_go):
    engine = CountingEngine()
    whole = invert(tmp_path / "whole", digits, engine, chunk_size=None)
    assert engine.calls == 1 and whole.parameters["chunk_size"] is None  # one batch instead of chunks of 3, 3, 2
    assert whole.fingerprint != one_go[0].fingerprint  # recorded: shards and resumed parts must agree on it
    # Each item is stepped on its own, so cutting the set differently changes no result.
    torch.testing.assert_close(whole.images, one_go[0].images, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=r"n_shards=2 needs at least 2 chunks.* 1 chunk\(s\), one per objective \(chunk_size=null\)"):
        invert(tmp_path / "sharded", digits, chunk_size=None, shard=0, n_shards=2)


def test_chunk_size_none_keeps_class_controversial_directions_apart(tmp_path, digits):
    test, _ = digits
    a, b = ModelRef("a", classifier=tiny_classifier(1)), ModelRef("b", classifier=tiny_classifier(2))
    engine = CountingEngine()
    s = make_controversial_set(tmp_path / "cc", a, b, select_targets(test, 2, seed=0), objective="class_controversial", restarts=2,
                               chunk_size=None, engine=engine, preview=False)
    assert engine.calls == 2 and len(s.role("result")[0]) == 8  # one call per direction: each has its own objective


def test_shards_of_different_runs_do_not_merge(tmp_path, digits):
    a = invert(tmp_path / "a", digits, shard=0, n_shards=2).path
    b = invert(tmp_path / "b", digits, shard=1, n_shards=2, seed=1).path
    with pytest.raises(StimulusSetError, match=r"different runs .*\['seeds', 'static_sha256'\]"):
        merge_sets([a, b], tmp_path / "m")


def test_merging_over_another_set_drops_its_trial_tables(tmp_path, digits):
    """Trial tables name the images of the set they were made from: a merge that replaces the set with another run's
    removes them, and one that makes the very same set again keeps them."""
    def shards(seed):
        return [invert(tmp_path / f"seed{seed}-shard{i}", digits, shard=i, n_shards=2, seed=seed).path for i in range(2)]

    out = tmp_path / "merged"
    first = merge_sets(shards(0), out)
    (out / "trials").mkdir()
    set_trials(first, "2afc", seed=0).to_csv(out / "trials" / "2afc-seed0.csv", index=False)
    with pytest.raises(StimulusSetError, match="already holds another stimulus set: pass overwrite=true"):
        merge_sets(shards(1), out)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    again = merge_sets(shards(0), out)  # a requeued job's script merging again: its set, as it is (it was refused)
    assert again.fingerprint == first.fingerprint and (out / "manifest.json").stat().st_mtime_ns == stamp
    assert merge_sets(shards(0), out, overwrite=True).fingerprint == first.fingerprint
    assert (out / "trials" / "2afc-seed0.csv").is_file()
    replaced = merge_sets(shards(1), out, overwrite=True)
    assert replaced.fingerprint != first.fingerprint and not (out / "trials").exists()


def test_shards_of_different_splits_are_named_apart(tmp_path, digits):
    halves = [invert(tmp_path / f"half{i}", digits, shard=i, n_shards=2).path for i in range(2)]
    third = invert(tmp_path / "third", digits, shard=2, n_shards=3).path
    with pytest.raises(StimulusSetError, match=r"different numbers of parts .*3: \[.*third.*\]"):
        merge_sets([*halves, third], tmp_path / "m")


def test_the_fingerprint_sees_a_representations_own_weights_and_its_pool():
    """An encoder beside a classifier (a probe), or pool="flatten" at the penultimate layer, gave the fingerprint of
    another set: a rerun into the same folder returned the old images."""
    from training import Representation, build_model

    classifier = build_model("small_cnn", "digits", width=4)
    zoo = ModelRef.from_classifier(classifier, name="cnn")
    assert "representation_sha256" not in zoo.provenance() and "pool" not in zoo.provenance()  # older sets keep theirs
    probe = ModelRef("probe", tiny_representation(0), tiny_classifier(1))
    other_encoder = ModelRef("probe", tiny_representation(5), tiny_classifier(1))
    assert probe.provenance()["weights_sha256"] == other_encoder.provenance()["weights_sha256"]
    assert probe.provenance()["representation_sha256"] != other_encoder.provenance()["representation_sha256"]
    flat = ModelRef("cnn", Representation(classifier, pool="flatten"), classifier)
    assert flat.provenance()["pool"] == "flatten"
    assert "pool" not in ModelRef("cnn", Representation(classifier, pool="avg"), classifier).provenance()  # auto's choice here


def test_more_shards_than_chunks_is_an_error_in_every_shard(tmp_path, digits):
    """Only the shards without a chunk were refused: shard 0 inverted its part in full, and the set could never merge."""
    engine = CountingEngine()
    for shard in (0, 3):
        with pytest.raises(ValueError, match=r"n_shards=4 needs at least 4 chunks, one per shard, but the set's 8 items make only 3 "
                                             r"chunk\(s\) of up to 3 items: use n_shards=3 or fewer, or chunk_size=2 or smaller"):
            invert(tmp_path / "x", digits, engine, shard=shard, n_shards=4)
    assert engine.calls == 0


def test_out_must_be_new_empty_or_a_set(tmp_path, digits):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(StimulusSetError, match="not empty and not a stimulus set"):
        invert(tmp_path / "busy", digits)
    with pytest.raises(StimulusSetError, match="refusing to delete"):
        invert(tmp_path / "busy", digits, overwrite=True)
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_images_a_png_cannot_hold_are_refused_before_the_engine_runs(tmp_path):
    four = ModelRef("four", torch.nn.Sequential(torch.nn.Conv2d(4, 2, 3), torch.nn.Flatten()).eval())
    engine = CountingEngine()
    with pytest.raises(ValueError, match="need 1 or 3 channels .* got 4"):  # was: after every chunk was inverted
        make_inversion_set(tmp_path / "x", four, gaussian_targets(2, (4, 8, 8)), seed_types=["gray"], engine=engine, preview=False)
    assert engine.calls == 0


def test_merge_does_not_delete_pngs_of_a_folder_that_is_no_set(tmp_path, digits):
    shards = [invert(tmp_path / f"shard{i}", digits, shard=i, n_shards=2).path for i in range(2)]
    out = tmp_path / "merged"
    (out / "images").mkdir(parents=True)
    (out / "images" / "my_figure.png").write_bytes(b"mine")
    with pytest.raises(StimulusSetError, match=r"holds 1 PNG\(s\) that are no image of this set \(my_figure.png\)"):
        merge_sets(shards, out)
    assert (out / "images" / "my_figure.png").read_bytes() == b"mine"
    (out / "images" / "my_figure.png").unlink()
    assert merge_sets(shards, out).shard is None


def test_ood_inversion_set_from_gaussian_targets(tmp_path, digits):
    targets = gaussian_targets(3, (3, 32, 32), seed=0)
    s = make_inversion_set(tmp_path / "ood", tiny_model(), targets, seed_types=["gray"], engine=CountingEngine(), preview=False)
    rows = s.role("target")[0]
    assert list(rows["source"]) == ["gaussian:dark", "gaussian:light", "gaussian:dark"]
    assert rows["label"].isna().all() and s.parameters["targets"]["source"] == "gaussian"
    assert torch.equal(s.role("target")[1], targets.images)


def test_controversial_set_both_directions_from_shared_starts(tmp_path, digits):
    test, _ = digits
    a = ModelRef("a", tiny_representation(1))
    b = ModelRef("b", tiny_representation(2))
    s = make_controversial_set(
        tmp_path / "c", a, b, select_targets(test, 2, seed=0), lam=0.5, restarts=2, engine=CountingEngine(), chunk_size=3, preview=True,
    )
    m = s.manifest
    origins, starts, results = (m[m.role == r] for r in ("origin", "seed", "result"))
    assert s.kind == "controversial" and len(origins) == 2 and len(starts) == 4 and len(results) == 8
    for r in results.itertuples():
        start = m[m.id == r.seed_id].iloc[0]
        assert start.origin_id == r.origin_id and start.restart == r.restart
        kept, pushed = ("a", "b") if r.direction == "AB" else ("b", "a")
        assert (r.model, r.pushed_model, r.objective, r.objective_params) == (kept, pushed, "controversial", {"lambda": 0.5})
    # Both directions start from the same noise for each (origin, restart).
    ab = results[results.direction == "AB"].set_index(["origin_id", "restart"])["seed_id"]
    ba = results[results.direction == "BA"].set_index(["origin_id", "restart"])["seed_id"]
    assert ab.sort_index().equals(ba.sort_index())
    assert (s.path / "preview.png").is_file()
    with pytest.raises(ValueError, match="trials are built from inversion sets"):
        set_trials(s, "2afc")


def test_both_controversial_directions_run_as_one_engine_batch_with_each_directions_results(tmp_path, digits):
    from invert import ControversialLoss

    test, _ = digits
    a, b = ModelRef("a", tiny_representation(1)), ModelRef("b", tiny_representation(2))
    engine = CountingEngine(steps=6)
    s = make_controversial_set(tmp_path / "c", a, b, select_targets(test, 2, seed=0), lam=0.5, restarts=2, engine=engine, preview=False)
    assert engine.calls == 1  # 2 origins x 2 restarts x 2 directions: one batch
    results = s.manifest[s.manifest.role == "result"]
    for direction, (keep, push) in {"AB": (a, b), "BA": (b, a)}.items():
        rows = results[results.direction == direction]
        origins, starts = s.get(list(rows.origin_id)), s.get(list(rows.seed_id))
        alone = CountingEngine(steps=6).run(ControversialLoss(keep.module("representation"), push.module("representation"), origins, lam=0.5), starts)
        # The same per-row computation; only the batch around a row differs (convolutions may round differently).
        torch.testing.assert_close(s.get(list(rows.id)), alone.images, atol=1e-5, rtol=0)


def test_class_controversial_drives_the_pushed_model_to_another_class(tmp_path, digits):
    test, _ = digits
    a = ModelRef("a", classifier=tiny_classifier(1))
    b = ModelRef("b", classifier=tiny_classifier(2))
    origins = select_targets(test, 3, seed=0)
    s = make_controversial_set(
        tmp_path / "cc", a, b, origins, objective="class_controversial", restarts=1, directions=["AB"],
        engine=CountingEngine(), preview=False,
    )
    results = s.role("result")[0]
    assert s.kind == "class_controversial" and list(results["direction"]) == ["AB"] * 3
    for r in results.itertuples():
        params = r.objective_params
        assert params["class_keep"] == r.label and params["class_push"] != r.label and 0 <= params["class_push"] < 10
        assert params["alpha"] == 100.0
    # the class count draws the pushed classes: under the same out, another count is another set, not the old one reused
    options = dict(objective="class_controversial", restarts=1, directions=["AB"], engine=CountingEngine(), preview=False, num_classes=4)
    with pytest.raises(StimulusSetError, match="already holds a different stimulus set"):
        make_controversial_set(tmp_path / "cc", a, b, origins, **options)
    four = make_controversial_set(tmp_path / "cc", a, b, origins, overwrite=True, **options)
    assert four.fingerprint != s.fingerprint and all(p["class_push"] < 4 for p in four.role("result")[0]["objective_params"])
    with pytest.raises(ValueError, match="needs labelled origins"):
        make_controversial_set(tmp_path / "x", a, b, gaussian_targets(2, (3, 32, 32)), objective="class_controversial", engine=CountingEngine())
    with pytest.raises(ValueError, match="has no representation"):
        make_controversial_set(tmp_path / "y", a, b, origins, engine=CountingEngine())


def test_bad_arguments_are_refused_before_any_work(tmp_path, digits):
    test, _ = digits
    a, b, origins = tiny_model(), tiny_model(), select_targets(test, 2)
    for kwargs, message in [
        ({"directions": ["AB", "AB"]}, "directions must be distinct"),
        ({"directions": ["AC"]}, "directions must be distinct"),
        ({"restarts": 0}, r"restarts must be a whole number >= 1, got 0"),
        ({"restarts": 1.5}, r"restarts must be a whole number >= 1, got 1.5"),  # ran 1 restart, recorded 1.5
        ({"restarts": True}, r"restarts must be a whole number >= 1, got True"),
        ({"objective": "adversarial"}, "unknown objective"),
        ({"start": "pink"}, "start must be"),
        ({"chunk_size": 0}, "chunk_size must be at least 1"),
        ({"chunk_size": 2.5}, "chunk_size must be at least 1"),
        ({"chunk_size": float("inf")}, "chunk_size must be at least 1"),
        ({"chunk_size": "all"}, r"or None \(null in a config\) for the whole set in one engine call"),
        ({"chunk_size": True}, "chunk_size must be at least 1"),
    ]:
        with pytest.raises(ValueError, match=message):
            make_controversial_set(tmp_path / "z", a, b, origins, engine=CountingEngine(), **kwargs)
    with pytest.raises(ValueError, match="0 <= shard < n_shards"):
        invert(tmp_path / "z", digits, shard=2, n_shards=2)
    engine = CountingEngine()  # a config JSON cannot hold failed after every chunk, naming no key
    with pytest.raises(ValueError, match=r"config key\(s\) \['device'\] cannot be recorded in the manifest"):
        invert(tmp_path / "z", digits, engine, config={"device": torch.device("cpu"), "n_targets": N_TARGETS})
    assert engine.calls == 0 and not (tmp_path / "z").exists()


def test_the_manifest_records_the_config_given(tmp_path, digits):
    s = invert(tmp_path / "cfg", digits, config={"note": "from a test", "n_targets": N_TARGETS})
    assert s.config == {"note": "from a test", "n_targets": N_TARGETS}
    info = json.loads((s.path / MANIFEST).read_text())
    assert info["format_version"] == 1 and info["fingerprint"] == s.fingerprint and info["shard"] is None


def test_controversial_starts_near_the_origin_are_the_origin_plus_keyed_noise(tmp_path, kit, digits):
    import stimuli as S

    origins = S.select_targets(digits[0], n=2, seed=0)
    model = S.ModelRef("tiny", kit.tiny_representation())
    starts = {}
    for start, extra in (("origin", {"start_sigma": 0.05}), ("uniform", {})):
        s = S.make_controversial_set(tmp_path / start, model, model, origins, restarts=2, start=start, engine={"steps": 1, "progress": False},
                                     preview=False, **extra)
        seeds, images = s.role("seed")
        starts[start] = images
        assert set(seeds["source"]) == ({"origin_plus_noise"} if start == "origin" else {"uniform_noise"})
        # a start near the origin is no noise seed: human answers and reports group by seed_type
        assert set(seeds["seed_type"]) == set(s.role("result")[0]["seed_type"]) == {"origin" if start == "origin" else "noise"}
    assert 0 < (starts["origin"][0] - origins.images[0]).abs().mean() < 0.06
    assert (starts["uniform"][0] - origins.images[0]).abs().mean() > 0.2
    with pytest.raises(ValueError, match="start must be one of"):
        S.make_controversial_set(tmp_path / "x", model, model, origins, start="zeros")
    with pytest.raises(ValueError, match="start_sigma > 0"):
        S.make_controversial_set(tmp_path / "y", model, model, origins, start="origin", start_sigma=0.0)
    with pytest.raises(ValueError, match="lambda .* must be a finite number >= 0, got -1.0"):
        S.make_controversial_set(tmp_path / "z", model, model, origins, lam=-1)
    with pytest.raises(ValueError, match="alpha .* must be a finite number > 0, got -10.0"):
        S.make_controversial_set(tmp_path / "z", model, model, origins, objective="class_controversial", alpha=-10)
    assert not (tmp_path / "z").exists()  # refused before any work


def test_precision_auto_is_recorded_as_what_it_ran_in(tmp_path, digits, monkeypatch):
    """precision=auto (bf16 on a GPU, fp32 on a CPU) was fingerprinted as "auto": a CPU run resumed or reused GPU-made
    bf16 parts as its own."""
    from invert import Engine

    assert CountingEngine(precision="auto").resolved_precision(torch.device("cpu")) == "fp32"
    assert CountingEngine(precision="bf16").resolved_precision(torch.device("cpu")) == "bf16"
    cpu = invert(tmp_path / "cpu", digits, CountingEngine(precision="auto"))
    assert cpu.parameters["engine"]["precision"] == "auto"  # fp32, recorded as sets made before record it
    with monkeypatch.context() as patch:  # a machine where auto means bf16
        patch.setattr(Engine, "resolved_precision", lambda self, device: "bf16" if self.config.precision in ("auto", "bf16") else "fp32")
        gpu = invert(tmp_path / "gpu", digits, CountingEngine(precision="auto"))
    assert gpu.parameters["engine"]["precision"] == "bf16" and gpu.fingerprint != cpu.fingerprint
    with pytest.raises(StimulusSetError, match="already holds a different stimulus set"):
        invert(tmp_path / "gpu", digits, CountingEngine(precision="auto"))  # the CPU does not take the bf16 set as its own
