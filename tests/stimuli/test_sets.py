"""The on-disk format: round trip, PNG quantisation as documented, refusal of partial or
corrupted sets with messages that say what to do."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from stimuli import QUANTISATION, IncompleteSetError, StimulusSetError, load_set, quantise, read_png, write_set
from stimuli.sets import MANIFEST, TENSORS, manifest_table


def small_set(n_targets: int = 3):
    """A hand-made inversion-like set: targets, noise seeds, results (with losses and curves)."""
    generator = torch.Generator().manual_seed(0)
    rows, images = [], []
    for k in range(n_targets):
        rows.append({"id": f"t{k:04d}", "role": "target", "label": k, "class_name": str(k), "source": "digits", "source_split": "test", "source_index": 10 + k})
        images.append(torch.rand(3, 8, 8, generator=generator))
    for k in range(n_targets):
        rows.append({"id": f"t{k:04d}.seed.noise", "role": "seed", "target_id": f"t{k:04d}", "seed_type": "noise", "source": "uniform_noise"})
        images.append(torch.rand(3, 8, 8, generator=generator))
    for k in range(n_targets):
        rows.append({
            "id": f"t{k:04d}.result.noise", "role": "result", "target_id": f"t{k:04d}", "seed_id": f"t{k:04d}.seed.noise",
            "seed_type": "noise", "model": "tiny", "layer": "features", "objective": "inversion",
            "objective_params": {"b": 1, "a": [1, 2]}, "steps_used": 7, "initial_loss": 0.9 + k, "final_loss": 0.1 / (k + 3),
        })
        images.append(torch.rand(3, 8, 8, generator=generator))
    for position, row in enumerate(rows):
        row["position"] = position
    curve = torch.full((len(rows), 3), math.nan)
    curve[2 * n_targets :] = torch.tensor([[0.9, 0.5, 0.1]])
    return torch.stack(images), manifest_table(rows), curve


@pytest.fixture
def written(tmp_path):
    images, manifest, curve = small_set()
    path = write_set(
        tmp_path / "set", images, manifest, kind="inversion", parameters={"seed": 0}, config={"n_targets": 3},
        curve_steps=[0, 1, 2], loss_curve=curve,
    )
    return path, images, manifest, curve


def test_round_trip_gives_back_exact_tensors_and_the_same_manifest(written, tmp_path):
    path, images, manifest, curve = written
    s = load_set(path)
    assert torch.equal(s.images, images) and s.images.dtype == torch.float32
    assert torch.equal(s.loss_curve.isnan(), curve.isnan()) and torch.equal(s.loss_curve.nan_to_num(), curve.nan_to_num())
    expected = manifest.copy()
    expected["png"] = pd.Series([f"images/{i}.png" for i in manifest["id"]], dtype=object)
    pd.testing.assert_frame_equal(s.manifest, expected)
    assert s.kind == "inversion" and s.curve_steps == [0, 1, 2] and s.config == {"n_targets": 3} and s.parameters == {"seed": 0}
    assert s.manifest["steps_used"].dtype == "Int64" and s.manifest["target_id"].iloc[0] is None
    assert s.manifest["objective_params"].iloc[-1] == {"a": [1, 2], "b": 1}
    # Written again from what was loaded: byte-identical files.
    again = s.write(tmp_path / "again")
    for name in (MANIFEST, TENSORS, "images/t0001.result.noise.png"):
        assert (again / name).read_bytes() == (path / name).read_bytes()
    assert (path / "preview.png").is_file()


def test_png_quantisation_is_what_the_manifest_says(tmp_path):
    # Values on and between the rounding boundaries, including exact halves (round half to even).
    values = torch.tensor([0.0, 0.5 / 255, 1.5 / 255, 2.5 / 255, 0.2, 0.5, 127.5 / 255, 0.7, 254.5 / 255, 1.0])
    images = values.repeat(3, 10, 1).unsqueeze(0).repeat(2, 1, 1, 1)
    images[1] = torch.rand(3, 10, 10, generator=torch.Generator().manual_seed(1))
    manifest = manifest_table([{"id": "a", "role": "target", "position": 0}, {"id": "b", "role": "target", "position": 1}])
    path = write_set(tmp_path / "q", images, manifest, kind="custom", preview=False)
    info = json.loads((path / MANIFEST).read_text())
    assert info["png"]["quantisation"] == QUANTISATION == "uint8 = round(clamp(x, 0, 1) * 255), round half to even (torch.round)"
    assert info["png"]["dtype"] == "uint8" and info["png"]["mode"] == "RGB"
    for i, image_id in enumerate(["a", "b"]):
        pixels = read_png(path / f"images/{image_id}.png")
        assert pixels.dtype == torch.uint8 and pixels.shape == (3, 10, 10)
        assert torch.equal(pixels, torch.round(images[i].clamp(0, 1) * 255).to(torch.uint8))
        assert torch.equal(pixels, quantise(images[i]))
        assert (pixels.float() / 255 - images[i]).abs().max() <= 0.5 / 255 + 1e-7
    assert read_png(path / "images/a.png")[0, 0, :4].tolist() == [0, 0, 2, 2]  # 0.5 -> 0, 1.5 -> 2, 2.5 -> 2


def test_a_missing_manifest_with_parts_is_an_unfinished_run_to_resume(written):
    path = written[0]
    (path / MANIFEST).unlink()
    (path / "parts").mkdir()
    (path / "parts" / "plan.json").write_text(json.dumps({"n_chunks_in_shard": 4}))
    (path / "parts" / "chunk-00000.json").write_text("{}")
    with pytest.raises(IncompleteSetError, match=r"unfinished stimulus set \(1 of 4 chunks done.*run the same command again to resume"):
        load_set(path)


def test_a_directory_without_manifest_is_not_a_set(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(StimulusSetError, match="not a stimulus set: manifest.json is missing"):
        load_set(tmp_path / "empty")
    with pytest.raises(StimulusSetError, match="does not exist"):
        load_set(tmp_path / "nowhere")


def test_corrupted_manifest_json_is_refused(written):
    path = written[0]
    text = (path / MANIFEST).read_text()
    (path / MANIFEST).write_text(text[: len(text) // 2])
    with pytest.raises(StimulusSetError, match="not valid JSON.*corrupted; regenerate the set"):
        load_set(path)


def test_malformed_manifests_and_unmerged_shards_name_the_fix(written, tmp_path):
    """Valid JSON of the wrong shape raised a bare KeyError ('png') or TypeError (rows: null); a folder of shards not yet
    merged was "not a stimulus set (was it written by stimuli.write_set?)"."""
    path = written[0]
    info = json.loads((path / MANIFEST).read_text())
    for broken in ({**info, "rows": None}, {**info, "rows": [{k: v for k, v in info["rows"][0].items() if k != "png"}] + info["rows"][1:]},
                   {**info, "tensors": {"sha256": "x"}}):
        (path / MANIFEST).write_text(json.dumps(broken))
        with pytest.raises(StimulusSetError, match=r"is malformed: the manifest is corrupted; regenerate the set"):
            load_set(path)
    (tmp_path / "big" / "shards" / "shard-000-of-002").mkdir(parents=True)
    with pytest.raises(IncompleteSetError, match=r"holds the shards of a stimulus set, not merged yet: .*python -m stimuli merge out="):
        load_set(tmp_path / "big")


def test_modified_or_truncated_tensors_are_refused(written):
    path = written[0]
    data = bytearray((path / TENSORS).read_bytes())
    data[-5] ^= 0xFF
    (path / TENSORS).write_bytes(bytes(data))
    with pytest.raises(StimulusSetError, match="does not match the SHA-256.*modified or truncated; regenerate"):
        load_set(path)
    (path / TENSORS).unlink()
    with pytest.raises(StimulusSetError, match="tensors.safetensors is missing"):
        load_set(path)


def test_missing_or_modified_png_is_refused(written):
    path = written[0]
    png = path / "images" / "t0000.png"
    png.write_bytes(png.read_bytes() + b"x")
    with pytest.raises(StimulusSetError, match="t0000.png does not match the SHA-256"):
        load_set(path)
    load_set(path, verify_pngs=False)  # the tensors are intact
    png.unlink()
    with pytest.raises(StimulusSetError, match="t0000.png is missing"):
        load_set(path, verify_pngs=False)


def _edit_manifest(path, edit):
    info = json.loads((path / MANIFEST).read_text())
    edit(info)
    (path / MANIFEST).write_text(json.dumps(info))


def test_shape_mismatch_bad_links_and_versions_are_refused(written):
    path = written[0]
    _edit_manifest(path, lambda info: info.update(image_shape=[3, 16, 16]))
    with pytest.raises(StimulusSetError, match=r"images have shape \(9, 3, 8, 8\), the manifest says \(9, 3, 16, 16\)"):
        load_set(path)
    _edit_manifest(path, lambda info: info.update(image_shape=[3, 8, 8], n_images=8))
    with pytest.raises(StimulusSetError, match="the manifest says"):
        load_set(path)
    _edit_manifest(path, lambda info: (info.update(n_images=9), info["rows"][-1].update(seed_id="t0099.seed.noise")))
    with pytest.raises(StimulusSetError, match=r"seed_id links to ids that are not in the set: \['t0099.seed.noise'\]"):
        load_set(path)
    _edit_manifest(path, lambda info: info.update(format_version=99))
    with pytest.raises(StimulusSetError, match="format version 99"):
        load_set(path)


def test_a_shard_is_refused_unless_asked_for(tmp_path):
    images, manifest, curve = small_set()
    path = write_set(tmp_path / "s", images, manifest, kind="inversion", curve_steps=[0, 1, 2], loss_curve=curve,
                     shard={"index": 1, "count": 3, "n_images": 27}, preview=False)
    with pytest.raises(IncompleteSetError, match="shard 1 of 3.*merge the shards first"):
        load_set(path)
    assert load_set(path, allow_shard=True).shard == {"index": 1, "count": 3, "n_images": 27}


def test_write_set_refuses_bad_input(tmp_path):
    images, manifest, _ = small_set()
    with pytest.raises(ValueError, match="one row per image"):
        write_set(tmp_path / "x", images[:-1], manifest, kind="k")
    with pytest.raises(ValueError, match="ids repeat"):
        write_set(tmp_path / "x", images, manifest.assign(id=["a"] * len(manifest)), kind="k")
    with pytest.raises(ValueError, match="file-name safe"):
        write_set(tmp_path / "x", images, manifest.assign(id=[f"../{i}" for i in range(len(manifest))]), kind="k")
    with pytest.raises(ValueError, match="unknown roles"):
        write_set(tmp_path / "x", images, manifest.assign(role="distractor"), kind="k")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        write_set(tmp_path / "x", images * 2, manifest, kind="k")
    assert not (tmp_path / "x" / MANIFEST).exists()


def test_images_a_png_cannot_hold_are_refused_before_an_existing_set_is_touched(written):
    path, images, manifest, _ = written
    with pytest.raises(ValueError, match="1 or 3 channels"):
        write_set(path, torch.cat([images, images[:, :1]], dim=1), manifest, kind="inversion")  # RGBA
    assert len(load_set(path)) == len(images)  # the manifest was deleted first: the old set no longer loaded


def test_rewriting_a_set_without_a_preview_drops_the_old_one(written):
    path, images, manifest, curve = written
    write_set(path, images, manifest, kind="inversion", preview=True)
    assert (path / "preview.png").is_file()
    write_set(path, 1 - images, manifest, kind="inversion", preview=False)
    assert not (path / "preview.png").exists()  # it showed the previous images


def test_rewriting_a_set_drops_pngs_of_removed_images(written):
    path, images, manifest, curve = written
    write_set(path, images[:3], manifest.iloc[:3].reset_index(drop=True), kind="inversion", preview=False)
    assert sorted(p.name for p in (path / "images").iterdir()) == ["t0000.png", "t0001.png", "t0002.png"]
    assert len(load_set(path)) == 3


def test_the_preview_title_names_the_models_not_only_the_folder(tmp_path, monkeypatch):
    """measure writes every model's set to a folder called ``set``: all previews were titled "inversion: set"."""
    from stimuli import preview, sets

    titles = []
    monkeypatch.setattr(preview, "write_preview", lambda path, images, manifest, title="": titles.append(title))
    images, manifest = torch.rand(2, 3, 8, 8), pd.DataFrame({"id": ["t0", "t0.result.noise"], "role": ["target", "result"]})
    write_set(tmp_path / "robust" / "set", images, manifest, kind="inversion", parameters={"model": {"name": "robust", "layer": "features"}})
    write_set(tmp_path / "pair", images, manifest, kind="controversial",
              parameters={"models": {"A": {"name": "standard", "layer": None}, "B": {"name": "robust", "layer": "features"}}})
    write_set(tmp_path / "plain", images, manifest, kind="custom")
    assert titles == ["inversion: robust at features (set)", "controversial: standard vs robust at features (pair)", "custom: plain"]
    assert sets._preview_title("inversion", tmp_path, {"model": "not a mapping"}) == f"inversion: {tmp_path.name}"
