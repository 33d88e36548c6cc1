"""The benchmarks still run end to end at toy sizes and write their JSON (speed itself is never asserted)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_benchmark(script: str, out: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--out", str(out), *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


def test_observer_benchmark_compares_equal_distances(tmp_path):
    report = run_benchmark("bench_observer.py", tmp_path / "observer.json", "--images", "10", "--loop-images", "4", "--threads", "1")
    assert report["results"]["ours"]["pairs"] == 45 and report["results"]["lpips-loop"]["pairs"] == 6
    # The comparison is only meaningful because both compute the same distances.
    assert report["agreement"]["max_abs_difference_vs_batched"] < 1e-5
    assert report["agreement"]["max_abs_difference_vs_loop"] < 1e-5
    assert set(report["ratios"]) == {"ours / lpips-batched", "ours / lpips-loop"}


@pytest.mark.slow
def test_training_benchmark_runs_every_contender(tmp_path):
    report = run_benchmark("bench_training.py", tmp_path / "training.json", "--images", "64", "--batch-size", "32", "--epochs", "1",
                           "--repeats", "1", "--pgd-steps", "1", "--threads", "1")
    assert set(report["results"]) == {f"{m}/{r}" for m in ("standard", "pgd") for r in ("ours", "robustness", "dataloader", "kernels")}
    assert all(r["images_per_second"] > 0 for r in report["results"].values())
    assert "pgd: ours / robustness" in report["ratios"]
