"""Where and how the benchmarks record their results: ``benchmarks/results/<name>_<device>.json``."""
from __future__ import annotations

import platform
import re
from pathlib import Path

import torch

from training.io import atomic_write_json

RESULTS = Path(__file__).resolve().parent / "results"


def device_slug(device: torch.device) -> str:
    """``cpu``, or the GPU's name in lower case (``nvidia-h100-80gb-hbm3``), so results from different cards do not collide."""
    if torch.device(device).type != "cuda":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")


def device_name(device: torch.device) -> str:
    """What ran the benchmark, for its JSON: the GPU's name, or the CPU model and torch's thread count."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    match = None
    if Path("/proc/cpuinfo").is_file():
        match = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
    model = match.group(1).strip() if match else platform.processor()
    return f"{model or 'cpu'} ({torch.get_num_threads()} threads)"


def environment(device: torch.device) -> dict:
    """What every benchmark report starts with: the device and the versions."""
    return {"device": device_name(device), "torch": torch.__version__, "python": platform.python_version()}


def args_config(args) -> dict:
    """A benchmark's command-line arguments as JSON-ready values (paths as strings), for its report's ``config``."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def comparison_report(device: torch.device, args, median: dict[str, float], results: dict, agreement: dict, *,
                      reference: str) -> dict:
    """The report of a benchmark that times ``ours`` against ``reference`` on the same work: the environment, the
    arguments, each contender's ``results``, how far their outputs ``agreement``, and the speed ratio (``median``
    seconds per call: the reference's over ours)."""
    return {**environment(device), "config": args_config(args), "results": results, "agreement": agreement,
            "ratios": {f"ours / {reference} (speed)": median[reference] / median["ours"]}}


def write_result(report: dict, name: str, device: torch.device, out: Path | None = None) -> Path:
    """Write ``report`` atomically (to ``out``, or the default file for ``name`` and ``device``) and say where."""
    path = Path(out) if out else RESULTS / f"{name}_{device_slug(device)}.json"
    atomic_write_json(path, report)
    print(f"wrote {path}")
    return path
