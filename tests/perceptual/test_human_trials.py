"""The model-vs-human trial reader, writer and image-folder loader (perceptual.human_trials) on files the tests write,
and the reader on the shared real trials when they are there."""
from __future__ import annotations

import csv
import math

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from perceptual.decisions import TRIAL_TABLE_COLUMNS, trial_table
from perceptual.human_trials import (
    MVH_COLUMNS,
    SINGLE_CONDITION,
    TrialDataError,
    classify_image_folder,
    has_image_folder,
    read_image_folder,
    read_trials,
    source_image,
    texture_category,
    write_trials,
)
from perceptual.metrics import SIXTEEN_CLASS_IMAGENET_INDICES, SIXTEEN_CLASS_NAMES

from ..conftest import MVH_RAW

HEADER = "subj,Session,trial,rt,object_response,category,condition,imagename"


@pytest.fixture(scope="session")
def mvh_raw():
    """The shared model-vs-human raw trials; skipped cleanly where ../shared is absent."""
    if not MVH_RAW.is_dir():
        pytest.skip(f"model-vs-human raw trials not found at {MVH_RAW}")
    return MVH_RAW


def write_csv(path, lines, header=HEADER):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


def test_source_image_keys_observers_as_the_benchmark_does():
    """model-vs-human's get_short_imagename: ImageNet's n0…_… pair, else the last '_' field; a bare name is its own key."""
    assert source_image("0001_cl_s01_cr_oven_40_n04111531_14126.png") == "n04111531_14126.png"
    assert source_image("0042_cl_dnn_cr_oven_40_n04111531_14126.png") == "n04111531_14126.png"
    assert source_image("0042_cl_dnn_cr_oven_00_n04111531_14126.png") == "n04111531_14126.png"  # the middle field does not matter
    assert source_image("0003_eid_s02_1-10-10_car_10_n1_2.png") == "2.png"  # "n1" is not an ImageNet id
    assert source_image("0001_s5n_s01_0_bird_00_bird3-bird2.png") == "bird3-bird2.png"
    assert source_image("bird3-bird2.png") == "bird3-bird2.png"
    with pytest.raises(ValueError, match="not a model-vs-human image name"):
        source_image("oven_1.png")
    assert texture_category("0002_s5n_s01_0_bird_00_bird2-clock3.png") == "clock"
    assert texture_category("0001_s5n_s01_0_bird_00_bird3-bird2.png") == "bird"


def test_reads_trials_into_the_trial_table(tmp_path):
    write_csv(tmp_path / "colour" / "colour_subject-01_session_1.csv", [
        "subject-01,1,1,0.8,oven,oven,cr,0001_cl_s01_cr_oven_40_n01000001_1.png",
        "subject-01,1,2,0.6,cat,bear,cr,0002_cl_s01_cr_bear_40_n02000002_2.png",
        "subject-01,1,3,NaN,na,car,bw,0003_cl_s01_bw_car_40_n03000003_3.png",
    ])
    write_csv(tmp_path / "colour" / "colour_subject-02_session_1.csv", [
        "subject-02,1,1,0.7,bear,bear,cr,0001_cl_s02_cr_bear_40_n02000002_2.png",
    ], header=HEADER.replace("Session", "session"))
    table, report = read_trials(tmp_path)
    assert list(table.columns[:len(TRIAL_TABLE_COLUMNS)]) == list(TRIAL_TABLE_COLUMNS)
    assert report.ok and report.files == 2 and report.rows == 4 and report.kept == 4 and report.unanswered == 1
    assert table["dataset"].unique().tolist() == ["colour"]
    assert table["image_id"].tolist() == ["n01000001_1.png", "n02000002_2.png", "n03000003_3.png", "n02000002_2.png"]
    assert table["correct"].tolist() == [True, False, False, True]  # the unanswered trial counts wrong
    assert math.isnan(table["rt"].iloc[2]) and table["rt"].iloc[0] == 0.8
    assert table["session"].tolist() == [1, 1, 1, 1] and table["trial"].tolist() == [1, 2, 3, 1]
    only, _ = read_trials(tmp_path / "colour" / "colour_subject-02_session_1.csv")
    assert only["subject"].tolist() == ["subject-02"] and only["dataset"].tolist() == ["colour"]
    with pytest.raises(ValueError, match=r"no trials for experiment\(s\) \['edge'\]"):
        read_trials(tmp_path, experiments=["edge"])
    with pytest.raises(ValueError, match=r"no trials for experiment\(s\) \['edge'\]"):  # one name: ['d', 'e', 'g'] before
        read_trials(tmp_path, experiments="edge")
    assert len(read_trials(tmp_path, experiments="colour")[0]) == 4


def test_a_csv_saved_with_a_byte_order_mark_reads_alike(tmp_path):
    """Excel's "CSV UTF-8" starts with a byte-order mark: it was refused as missing ['subj']."""
    path = write_csv(tmp_path / "colour" / "colour_subject-01_session_1.csv", ["subject-01,1,1,0.8,oven,oven,cr,0001_cl_s01_cr_oven_40_n01000001_1.png"])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    table, report = read_trials(tmp_path)
    assert report.ok and table["subject"].tolist() == ["subject-01"]


def test_every_problem_is_reported_by_file_kind_and_count(tmp_path):
    bad = write_csv(tmp_path / "colour" / "colour_subject-01_session_1.csv", [
        "subject-01,1,1,0.8,oven,oven,cr,0001_cl_s01_cr_oven_40_n01000001_1.png",       # good
        "subject-01,1,2,0.8,oven,oven,cr",                                       # malformed: 7 fields
        "subject-01,1,x,0.8,oven,oven,cr,0003_cl_s01_cr_oven_40_n03000003_3.png",       # malformed: trial
        "subject-01,1,4,fast,oven,oven,cr,0004_cl_s01_cr_oven_40_n4_4.png",      # malformed: rt
        "subject-01,1,5,0.8,oven,zebra,cr,0005_cl_s01_cr_zebra_40_n5_5.png",     # unknown category
        "subject-01,1,6,0.8,zebra,oven,cr,0006_cl_s01_cr_oven_40_n6_6.png",      # unknown response
        "subject-01,1,7,0.8,oven,oven,cr,0007_cl_s01_bw_oven_40_n7_7.png",       # condition differs from imagename
        "subject-01,1,8,0.8,cat,cat,cr,0008_cl_s01_cr_cat_40_n8_8.png",          # duplicate trial (with the next)
        "subject-01,1,8,0.8,dog,dog,cr,0009_cl_s01_cr_dog_40_n9_9.png",
        "subject-01,1,10,0.8,car,car,cr,0010_cl_s01_cr_oven_40_n01000001_1.png",         # duplicate image of line 2
        "subject-01,1,11,0.8,car,car,bw,0011_cl_s01_bw_car_40_n11_11.png",       # good
    ])
    with pytest.raises(TrialDataError) as caught:
        read_trials(tmp_path)
    report = caught.value.report
    assert report.counts() == {"malformed row": 3, "unknown category": 1, "unknown response": 1,
                               "imagename condition differs from condition": 1, "duplicate trial": 1, "duplicate image": 1}
    assert all(p.file == str(bad) for p in report.problems)
    assert "malformed row × 3" in str(caught.value) and "line 3: 7 fields" in str(caught.value)
    table, report = read_trials(tmp_path, strict=False)
    # kept: line 2 and 12 are good but line 2 shares its image with line 11, so both of those go; line 12 remains
    assert table["trial"].tolist() == [11]
    assert report.rows == 11 and report.kept == 1


def test_an_empty_session_or_trial_is_a_malformed_row(tmp_path):
    """They key the duplicate-trial check: an empty one crashed the reader with int('')."""
    write_csv(tmp_path / "colour" / "colour_subject-01_session_1.csv", [
        "subject-01,,1,0.8,oven,oven,cr,0001_cl_s01_cr_oven_40_n01000001_1.png",
        "subject-01,1,,0.8,oven,oven,cr,0002_cl_s01_cr_oven_40_n02000002_2.png",
        "subject-01,1,3,0.8,oven,oven,cr,0003_cl_s01_cr_oven_40_n03000003_3.png",
    ])
    with pytest.raises(TrialDataError, match="malformed row × 2"):
        read_trials(tmp_path)
    table, report = read_trials(tmp_path, strict=False)
    assert table["trial"].tolist() == [3] and report.counts() == {"malformed row": 2}


def test_a_file_that_mixes_experiments_or_subjects_is_refused_whole(tmp_path):
    write_csv(tmp_path / "edge" / "edge_subject-01_session_1.csv", [
        "subject-01,1,1,0.8,oven,oven,0,0001_edg_s01_0_oven_00_oven1.png",
        "subject-01,1,2,0.8,oven,oven,0,0002_sif_s01_0_oven_00_oven2.png",
        "subject-01,1,3,0.8,oven,oven,0,0003_sif_s01_0_oven_00_oven3.png",
    ])
    write_csv(tmp_path / "edge" / "edge_subject-02_session_1.csv", [
        "subject-02,1,1,0.8,oven,oven,0,0001_edg_s02_0_oven_00_oven1.png",
        "subject-03,1,2,0.8,oven,oven,0,0002_edg_s03_0_oven_00_oven2.png",
    ])
    write_csv(tmp_path / "edge" / "edge_subject-04_session_1.csv", ["subject-04,1,1,0.8,oven,oven,0,0001_edg_s04_0_oven_00_oven1.png"])
    with pytest.raises(TrialDataError) as caught:
        read_trials(tmp_path)
    kinds = {(p.file.rsplit("/", 1)[-1], p.kind): p for p in caught.value.report.problems}
    assert kinds[("edge_subject-01_session_1.csv", "file mixes experiments")].examples == ("tag 'sif' × 2, tag 'edg' × 1",)
    assert ("edge_subject-02_session_1.csv", "file mixes subjects") in kinds
    table, report = read_trials(tmp_path, strict=False)
    assert table["subject"].tolist() == ["subject-04"] and report.rows == 6 and report.kept == 1


def test_a_subject_in_two_files_is_reported(tmp_path):
    line = "subject-01,1,1,0.8,oven,oven,0,0001_edg_s01_0_oven_00_oven1.png"
    write_csv(tmp_path / "edge" / "a.csv", [line])
    write_csv(tmp_path / "edge" / "b.csv", [line])
    with pytest.raises(TrialDataError, match="subject's trials in several files × 2"):
        read_trials(tmp_path)


def test_an_image_a_subject_saw_again_in_another_session_is_reported(tmp_path):
    """Two sessions that repeat an image of one condition give the subject two answers to it: the pair metrics match
    answers by image, so the repeat is a problem of the files, named before any analysis."""
    write_csv(tmp_path / "edge" / "edge_subject-01_session_1.csv", [
        "subject-01,1,1,0.8,oven,oven,0,0001_edg_s01_0_oven_00_oven1.png",
        "subject-01,1,2,0.8,cat,cat,0,0002_edg_s01_0_cat_00_cat1.png",
    ])
    write_csv(tmp_path / "edge" / "edge_subject-01_session_2.csv", ["subject-01,2,1,0.7,bear,oven,0,0001_edg_s01_0_oven_00_oven1.png"])
    with pytest.raises(TrialDataError, match=r"image seen twice in several files × 2 \(e.g. subject subject-01, condition 0, image oven1.png\)"):
        read_trials(tmp_path)
    table, report = read_trials(tmp_path, strict=False)
    assert table["image_id"].tolist() == ["cat1.png"] and report.kept == 1


def test_missing_columns_name_the_file(tmp_path):
    write_csv(tmp_path / "edge" / "a.csv", ["subject-01,1,1,oven,oven,0,x"], header="subj,session,trial,object_response,category,condition,imagename")
    with pytest.raises(TrialDataError, match=r"a.csv: missing columns × 1 \(e.g. missing \['rt'\]"):
        read_trials(tmp_path)


def test_a_file_that_is_not_utf8_is_a_problem_of_that_file(tmp_path):
    """A Latin-1 export crashed the whole read with a bare codec error that named no file, under strict=false too."""
    good = write_csv(tmp_path / "colour" / "colour_subject-01_session_1.csv", ["subject-01,1,1,0.8,oven,oven,cr,0001_cl_s01_cr_oven_40_n01000001_1.png"])
    bad = tmp_path / "colour" / "colour_subject-02_session_1.csv"
    bad.write_bytes((HEADER + "\nsubject-02,1,1,0.8,oven,oven,cr,0001_cl_s02_cr_oven_40_n01000001_caf\xe9.png\n").encode("latin-1"))
    with pytest.raises(TrialDataError, match=r"colour_subject-02_session_1.csv: not UTF-8 text × 1 \(e.g. byte \d+: invalid .*CSV UTF-8"):
        read_trials(tmp_path)
    table, report = read_trials(tmp_path, strict=False)
    assert table["subject"].tolist() == ["subject-01"] and not report.ok and str(good) not in str(report)


def test_written_model_decisions_read_back_and_match_humans(tmp_path):
    classes = list(SIXTEEN_CLASS_NAMES)
    ids = ["n01000001_1.png", "n02000002_2.png", "n03000003_3.png"]
    labels = [classes.index("oven"), classes.index("bear"), classes.index("car")]
    model = trial_table("resnet50", "colour", "cr", ids, labels, [labels[0], classes.index("cat"), labels[2]], classes)
    path = write_trials(model, tmp_path / "colour" / "colour_resnet50_session_1.csv")
    rows = list(csv.reader(path.open()))
    assert tuple(rows[0]) == MVH_COLUMNS
    assert rows[2] == ["resnet50", "1", "2", "NaN", "cat", "bear", "cr", "0002_cl_dnn_cr_n02000002_2.png"]
    write_csv(tmp_path / "colour" / "colour_subject-01_session_1.csv", [
        "subject-01,1,1,0.8,oven,oven,cr,0001_cl_s01_cr_bear_40_n02000002_2.png".replace("oven,oven", "bear,bear"),
    ])
    table, report = read_trials(tmp_path)
    assert report.ok
    back = table[table["subject"] == "resnet50"].reset_index(drop=True)
    pd.testing.assert_frame_equal(back[list(TRIAL_TABLE_COLUMNS)], model.astype({"image_id": object}), check_dtype=False)
    human = table[table["subject"] == "subject-01"]
    assert human["image_id"].tolist() == ["n02000002_2.png"] and human["image_id"].iloc[0] in set(back["image_id"])
    # written again from what was read, the file is the same (imagename and trial columns are kept)
    again = write_trials(back, tmp_path / "again.csv")
    assert again.read_text() == path.read_text()
    # so is the session: a table read from session 2 writes session 2
    later = write_trials(back.assign(session=2), tmp_path / "later.csv")
    assert {r[1] for r in list(csv.reader(later.open()))[1:]} == {"2"}
    assert {r[1] for r in list(csv.reader(write_trials(model, tmp_path / "s3.csv", session=3).open()))[1:]} == {"3"}
    with pytest.raises(ValueError, match="session=3 contradicts the table's own session column"):
        write_trials(back, tmp_path / "x.csv", session=3)


def test_toolkit_conditions_with_underscores_round_trip(tmp_path):
    """The toolkit's conditions (``low_pass=40``) contain '_': the row's condition finds the source image whole."""
    classes = list(SIXTEEN_CLASS_NAMES)
    table = trial_table("resnet50", "compare", "low_pass=40", ["17", "n01440764_3.png"], [0, 1], [0, 2], classes)
    path = write_trials(table, tmp_path / "compare" / "compare_resnet50_session_1.csv")
    assert [r[-1] for r in csv.reader(path.open())][1:] == ["0001_compare_dnn_low_pass=40_17", "0002_compare_dnn_low_pass=40_n01440764_3.png"]
    back, report = read_trials(tmp_path / "compare", categories=classes)
    assert report.ok and back["condition"].tolist() == ["low_pass=40"] * 2 and back["image_id"].tolist() == ["17", "n01440764_3.png"]
    assert source_image("0001_compare_dnn_low_pass=40_17", "low_pass=40") == source_image("0001_compare_dnn_low_pass=40_17") == "17"


def test_the_writer_refuses_image_ids_the_benchmark_key_would_cut(tmp_path):
    classes = list(SIXTEEN_CLASS_NAMES)
    table = trial_table("resnet50", "compare", "cr", ["img_3.png", "img_4.png"], [0, 1], [0, 2], classes)
    with pytest.raises(ValueError, match=r"image_id\(s\) \['img_3.png', 'img_4.png'\] would not read back"):
        write_trials(table, tmp_path / "x.csv")
    assert not (tmp_path / "x.csv").exists()


def test_the_writer_refuses_what_the_format_cannot_hold(tmp_path):
    classes = list(SIXTEEN_CLASS_NAMES)
    two = pd.concat([trial_table(s, "colour", "cr", ["a.png"], [0], [0], classes) for s in ("m1", "m2")])
    with pytest.raises(ValueError, match="one file holds one subject"):
        write_trials(two, tmp_path / "x.csv")
    with pytest.raises(ValueError, match="conditions must not be empty"):
        write_trials(trial_table("m", "colour", "", ["a.png"], [0], [0], classes), tmp_path / "x.csv")
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \[.dataset."):
        write_trials(pd.DataFrame({"subject": ["m"]}), tmp_path / "x.csv")
    assert not (tmp_path / "x.csv").exists()


class OneHotImageNet(torch.nn.Module):
    """Logits that put all weight on one ImageNet class chosen by the image's mean red value (a toy classifier)."""

    def __init__(self, by_red: dict[int, int]):
        super().__init__()
        self.by_red = by_red

    def forward(self, x):
        assert x.min() >= 0 and x.max() <= 1 and x.shape[1:] == (3, 8, 8)
        logits = torch.zeros(len(x), 1000)
        for i, red in enumerate((x[:, 0].mean(dim=(1, 2)) * 255).round().long().tolist()):
            logits[i, self.by_red[red]] = 50.0
        return logits


def test_image_folder_is_classified_through_the_16_class_mapping(tmp_path):
    folder = tmp_path / "colour" / "dnn" / "session-1"
    folder.mkdir(parents=True)
    names = {"0001_cl_dnn_cr_oven_40_n01000001_1.png": 10, "0002_cl_dnn_bw_bear_40_n02000002_2.png": 20, "0003_cl_dnn_cr_car_40_n03000003_3.png": 30}
    for name, red in names.items():
        Image.fromarray(np.full((16, 16, 3), red, dtype=np.uint8)).save(folder / name)
    listing = read_image_folder(tmp_path, "colour")
    assert listing["condition"].tolist() == ["cr", "bw", "cr"] and listing["category"].tolist() == ["oven", "bear", "car"]
    # red 10 → ImageNet 766 (oven), red 20 → 404 (airplane), red 30 → 511 (car)
    model = OneHotImageNet({10: SIXTEEN_CLASS_IMAGENET_INDICES["oven"][0], 20: 404, 30: SIXTEEN_CLASS_IMAGENET_INDICES["car"][1]})
    table = classify_image_folder(model, tmp_path, "colour", subject="toy", size=8, batch_size=2)
    assert table["response"].tolist() == ["oven", "airplane", "car"]
    assert table["correct"].tolist() == [True, False, True]
    assert table["image_id"].tolist() == ["n01000001_1.png", "n02000002_2.png", "n03000003_3.png"]
    path = write_trials(table, tmp_path / "out" / "colour" / "colour_toy_session_1.csv")
    assert [r[-1] for r in csv.reader(path.open())][1:] == list(names)  # the benchmark's own image names
    (folder / "0004_cl_dnn_cr_zebra_40_n4.png").write_bytes((folder / "0001_cl_dnn_cr_oven_40_n01000001_1.png").read_bytes())
    (folder / "badname.png").write_bytes(b"")
    with pytest.raises(ValueError, match=r"2 image name\(s\).*zebra.*badname.png"):
        read_image_folder(tmp_path, "colour")
    with pytest.raises(FileNotFoundError, match="dnn/session-1"):
        read_image_folder(tmp_path, "edge")


def test_the_benchmarks_own_model_files_for_class_folder_experiments_join_the_humans(tmp_path):
    """model-vs-human writes models' cue-conflict, edge and silhouette decisions (class folders, no sessions) with
    condition NaN and the bare file name (``ImageNetInfoMapping``); read, they take the humans' condition 0 and meet
    the humans' trials on the benchmark's key, and the shape bias reads the texture class from the bare name."""
    from perceptual.mvh_analysis import pairwise_consistency, shape_bias_table

    write_csv(tmp_path / "cue-conflict" / "cue-conflict_subject-01_session_1.csv", [
        "subject-01,1,1,0.8,bird,bird,0,0001_s5n_s01_0_bird_00_bird3-clock2.png",
        "subject-01,1,2,0.8,cat,cat,0,0002_s5n_s01_0_cat_00_cat1-knife4.png",
    ])
    (tmp_path / "cue-conflict" / "cue-conflict_resnet50_session-1.csv").write_text(
        "subj,session,trial,rt,object_response,category,condition,imagename\n"
        "resnet50,1,1,NaN,clock,bird,NaN,bird3-clock2.png\nresnet50,1,2,NaN,cat,cat,NaN,cat1-knife4.png\n")
    table, report = read_trials(tmp_path)
    assert report.ok, report.describe()
    model = table[table["subject"] == "resnet50"]
    assert model["condition"].tolist() == ["0", "0"] and model["image_id"].tolist() == ["bird3-clock2.png", "cat1-knife4.png"]
    pairs = pairwise_consistency(table, humans=lambda s: s.startswith("subject"))
    assert pairs["n_shared"].tolist() == [2] and pairs["observed_consistency"].tolist() == [0.5]
    bias = shape_bias_table(table, humans=lambda s: s.startswith("subject")).set_index("subject")
    assert bias.loc["resnet50", "shape_bias"] == 0.5 and bias.loc["subject-01", "shape_bias"] == 1.0
    # a bare name with a real condition keeps it; one with '_' is not bare and must parse as the benchmark's
    write_csv(tmp_path / "edge" / "edge_resnet50_session_1.csv", ["resnet50,1,1,NaN,oven,oven,0,oven1.png",
                                                                  "resnet50,1,2,NaN,oven,oven,NaN,oven_2.png"])
    with pytest.raises(TrialDataError, match=r"edge_resnet50_session_1.csv: malformed row × 1 \(e.g. line 3: bad imagename\)"):
        read_trials(tmp_path / "edge")


def test_class_folder_image_layout_is_read(tmp_path):
    """cue-conflict, edge and silhouette come as <experiment>/<class>/<file>.png (model-vs-human's ImageNetInfoMapping)."""
    for category, name, red in (("bird", "bird3-clock2.png", 10), ("oven", "oven1-car2.png", 30)):
        (tmp_path / "cue-conflict" / category).mkdir(parents=True)
        Image.fromarray(np.full((16, 16, 3), red, dtype=np.uint8)).save(tmp_path / "cue-conflict" / category / name)
    assert has_image_folder(tmp_path, "cue-conflict") and not has_image_folder(tmp_path, "edge")
    listing = read_image_folder(tmp_path, "cue-conflict")
    assert listing["category"].tolist() == ["bird", "oven"] and listing["condition"].tolist() == [SINGLE_CONDITION] * 2
    assert listing["image_id"].tolist() == listing["imagename"].tolist() == ["bird3-clock2.png", "oven1-car2.png"]
    model = OneHotImageNet({10: SIXTEEN_CLASS_IMAGENET_INDICES["clock"][0], 30: SIXTEEN_CLASS_IMAGENET_INDICES["oven"][0]})
    table = classify_image_folder(model, tmp_path, "cue-conflict", subject="toy", size=8)
    assert table["response"].tolist() == ["clock", "oven"] and table["correct"].tolist() == [False, True]
    path = write_trials(table, tmp_path / "out" / "cue-conflict" / "cue-conflict_toy_session_1.csv")
    back, report = read_trials(path)
    assert report.ok and back["image_id"].tolist() == ["bird3-clock2.png", "oven1-car2.png"] and back["condition"].tolist() == ["0", "0"]
    (tmp_path / "cue-conflict" / "zebra").mkdir()
    (tmp_path / "cue-conflict" / "oven" / "oven_3.png").write_bytes(b"")
    with pytest.raises(ValueError, match=r"2 problem\(s\).*oven/oven_3.png \(a bare file name has no '_'\); zebra/ \(not one of the 16 classes\)"):
        read_image_folder(tmp_path, "cue-conflict")


def test_the_shared_real_trials_read_without_problems(mvh_raw):
    table, report = read_trials(mvh_raw)
    files = sorted(mvh_raw.glob("*/*.csv"))
    lines = sum(len(f.read_text().strip().splitlines()) - 1 for f in files)
    assert report.ok, report.describe()
    assert report.files == len(files) and report.rows == lines == len(table)
    assert set(table["dataset"]) == {f.parent.name for f in files}
    assert report.unanswered == sum(f.read_text().count(",na,") for f in files)
    # every subject of an experiment and condition saw the same source images, so pairs match fully
    sets = table.groupby(["dataset", "condition", "subject"])["image_id"].agg(frozenset)
    assert (sets.groupby(level=[0, 1]).nunique() == 1).all()
