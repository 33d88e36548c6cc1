"""The batched runner: best-iterate tracking, batch independence, convergence, the two-model and
class objectives, early stopping, and every error path."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import invert.engine as engine_module
from invert import (
    ClassControversialLoss,
    ControversialLoss,
    Engine,
    InversionLoss,
    InvertConfig,
    NonFiniteLossError,
    Objective,
    TwoWayControversialLoss,
    clamp01,
    invert_batch,
    noise_images,
    random_start_l2,
)
from invert.validation import in_hot_loop

from ..conftest import record_once, refusing_host_reads

QUICK = dict(progress=False, log_every=10)


@pytest.fixture
def inversion(tiny_representation, wave_images):
    """(objective, seeds) for 4 wave targets and 4 noise seeds, 16x16."""
    return InversionLoss(tiny_representation(), wave_images(4)), noise_images(4, (3, 16, 16), seed=1)


class CountingObjective(Objective):
    """Wraps an objective; counts the rows it evaluates and whether it ran inside hot_loop()."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner, self.rows, self.hot = inner, 0, []

    def forward(self, x, items=None, step=0):
        self.rows += x.shape[0]
        self.hot.append(in_hot_loop())
        return self.inner(x, items, step)


def test_best_loss_never_increases_and_matches_the_returned_images(inversion):
    objective, seeds = inversion
    result = invert_batch(objective, seeds, steps=60, step_size=1.0, **QUICK)  # eta 1 overshoots: not monotone
    assert result.curve_steps == [0, 10, 20, 30, 40, 50, 60]
    assert (result.loss_curve.diff(dim=0) <= 0).all()
    torch.testing.assert_close(result.loss_curve[0], result.initial_loss)
    torch.testing.assert_close(result.loss_curve[-1], result.best_loss)
    assert (result.best_loss < result.initial_loss).all()
    torch.testing.assert_close(objective(result.images), result.best_loss, atol=1e-6, rtol=1e-5)
    assert torch.equal(result.steps_used, torch.full((4,), 60))


def test_keep_best_off_returns_the_last_iterate(inversion):
    objective, seeds = inversion
    settings = dict(steps=30, step_size=3.0, **QUICK)  # steps this large overshoot: the last is not the best
    best = invert_batch(objective, seeds, **settings)
    last = invert_batch(objective, seeds, keep_best=False, **settings)
    torch.testing.assert_close(objective(last.images), last.best_loss, atol=1e-6, rtol=1e-5)
    assert (best.best_loss <= last.best_loss).all() and (best.best_loss < last.best_loss).any()


def test_an_item_gives_the_same_result_alone_and_inside_any_batch(inversion):
    objective, seeds = inversion
    settings = dict(steps=25, stepper="adam", step_size=0.05, transform_robust=True, transform_samples=2, **QUICK)
    together = invert_batch(objective, seeds, **settings)
    split = invert_batch(objective, seeds, micro_batch=3, **settings)
    torch.testing.assert_close(split.images, together.images, atol=1e-5, rtol=0)
    # Item 2 alone: an objective holding only its target, seeds drawn for that item alone.
    alone_objective = InversionLoss(objective.representation, target_features=objective.target_features[2:3])
    alone = Engine(**settings).run(alone_objective, noise_images(1, (3, 16, 16), seed=1, first_item=2), item_offset=2)
    torch.testing.assert_close(alone.images[0], together.images[2], atol=1e-5, rtol=0)
    torch.testing.assert_close(alone.best_loss[0], together.best_loss[2], atol=1e-6, rtol=1e-5)


def test_a_tiny_model_is_inverted_from_noise(inversion):
    objective, seeds = inversion
    result = invert_batch(objective, seeds, steps=200, step_size=0.1, **QUICK)
    assert (result.initial_loss > 0.4).all()
    assert (result.best_loss < 0.1).all(), result.best_loss


@pytest.mark.parametrize(
    "settings",
    [
        dict(stepper="adam", step_size=0.01),
        dict(stepper="adam", step_size=0.05, parametrization="sigmoid"),
        dict(stepper="l2", step_size=0.5, parametrization="fourier"),
        dict(stepper="linf", step_size=0.005),
        dict(stepper="l2", step_size=0.1, precision="bf16", channels_last=True),
        dict(stepper="l2", step_size=0.1, tv_weight=0.1, lp_weight=0.1, lp_p=2.0),
        dict(stepper="l2", step_size=1.0, step_schedule="cosine"),
    ],
    ids=["adam", "sigmoid", "fourier", "linf", "bf16-channels-last", "priors", "cosine-l2"],
)
def test_every_stepper_and_parametrization_makes_progress(inversion, settings):
    objective, seeds = inversion
    result = invert_batch(objective, seeds, steps=40, **settings, **QUICK)
    assert (result.best_loss < 0.8 * result.initial_loss).all(), (settings, result.best_loss, result.initial_loss)
    assert result.images.min() >= 0 and result.images.max() <= 1


def test_channels_last_leaves_the_callers_model_as_it_was(tiny_representation, wave_images):
    """The run converts the weights for its duration only: a later chunk's targets, computed with the caller's
    model, are then what a fresh process computes (resumed and sharded sets equal a single run)."""
    representation = tiny_representation()
    layouts = {name: t.is_contiguous() for name, t in list(representation.named_parameters()) + list(representation.named_buffers())}
    assert any(t.dim() == 4 for t in representation.parameters())
    targets, seeds = wave_images(4), noise_images(4, (3, 16, 16), seed=1)
    fresh = invert_batch(InversionLoss(tiny_representation(), targets[2:]), seeds[2:], steps=5, channels_last=True, **QUICK)
    invert_batch(InversionLoss(representation, targets[:2]), seeds[:2], steps=5, channels_last=True, **QUICK)
    after = {name: t.is_contiguous() for name, t in list(representation.named_parameters()) + list(representation.named_buffers())}
    assert after == layouts
    second = invert_batch(InversionLoss(representation, targets[2:]), seeds[2:], steps=5, channels_last=True, **QUICK)
    assert torch.equal(second.images, fresh.images) and torch.equal(second.best_loss, fresh.best_loss)


class _Linear(Objective):
    """<a, x> per item: a constant gradient, so L2 steps are collinear and their lengths add up."""

    def __init__(self, direction):
        super().__init__()
        self.register_buffer("direction", direction)

    def forward(self, x, items=None, step=0):
        return (x * self.direction).flatten(1).sum(1)


@pytest.mark.parametrize("schedule", ["constant", "cosine", "linear"])
def test_the_step_schedule_runs_over_the_configured_steps(schedule):
    # eta * sum_t f(t / steps): steps for constant, (steps + 1) / 2 for cosine and linear decay over all steps.
    steps, eta = 30, 0.002
    seeds = torch.full((2, 3, 4, 4), 0.5)
    direction = torch.randn(3, 4, 4)
    result = invert_batch(_Linear(direction), seeds, steps=steps, step_size=eta, step_schedule=schedule, keep_best=False, **QUICK)
    expected = eta * (steps if schedule == "constant" else (steps + 1) / 2)
    moved = torch.linalg.vector_norm((result.images - seeds).flatten(1), dim=1)
    torch.testing.assert_close(moved, torch.full((2,), expected), rtol=1e-4, atol=1e-6)


def test_controversial_objective_moves_model_2_and_keeps_model_1(tiny_representation, wave_images):
    g1, g2 = tiny_representation(0), tiny_representation(1)
    origins = wave_images(3)
    # Both norms have zero gradient at x = x0, so start a little away from the origins.
    start = clamp01(random_start_l2(origins, 0.5, generator=torch.Generator().manual_seed(0)))
    loss = ControversialLoss(g1, g2, origins, lam=0.1)
    result = invert_batch(loss, start, steps=150, step_size=0.3, **QUICK)
    kept = InversionLoss(g1, origins)(result.images)
    moved = InversionLoss(g2, origins)(result.images)
    assert (kept < 0.05).all(), kept
    assert (moved > 0.3).all() and (moved > 10 * kept).all(), (moved, kept)
    assert (moved > 5 * InversionLoss(g2, origins)(start)).all()


def test_class_controversial_objective_makes_two_models_disagree(tiny_classifier):
    model1, model2 = tiny_classifier(0), tiny_classifier(1)
    seeds = noise_images(4, (3, 16, 16), seed=3)
    class1, class2 = torch.tensor([0, 1, 2, 0]), torch.tensor([1, 2, 0, 2])
    loss = ClassControversialLoss(model1, model2, class1, class2)
    result = invert_batch(loss, seeds, steps=100, stepper="adam", step_size=0.05, parametrization="sigmoid", **QUICK)
    with torch.no_grad():
        assert torch.equal(model1(result.images).argmax(1), class1)
        assert torch.equal(model2(result.images).argmax(1), class2)


class RippledQuadratic(Objective):
    """A per-sample loss with no coupling between samples at all (elementwise, then a row mean), so that
    results are bit-identical whatever the batch looks like: a bowl around each target plus a ripple
    that makes fixed-size normalised steps stall and resume, as on real representations."""

    def __init__(self, targets: torch.Tensor):
        super().__init__()
        self.register_buffer("targets", targets)

    def forward(self, x, items=None, step=0):
        target = self.targets if items is None else self.targets[items]
        return ((x - target) ** 2 + 0.02 * torch.sin(40 * x)).flatten(1).mean(1)


@pytest.fixture
def rippled(wave_images):
    """(objective, seeds): 6 items whose best losses stall at different steps."""
    return RippledQuadratic(wave_images(6)), noise_images(6, (3, 16, 16), seed=4)


def stop_step_by_the_rule(curve: torch.Tensor, patience: int, rtol: float) -> list[int]:
    """The early-stopping rule restated from its definition, on an unstopped run's per-step best-loss curve:
    an item stops at the first step k where no step in (k - patience, k] improved the best loss by more than
    rtol relative to the best loss at the last such improvement."""
    stops = []
    for column in curve.T.tolist():
        reference, since, stop = column[0], 0, len(column) - 1
        for k in range(1, len(column)):
            if reference - column[k] > rtol * abs(reference):
                reference, since = column[k], k
            if k - since >= patience:
                stop = k
                break
        stops.append(stop)
    return stops


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["compacting", "masked"])
def test_early_stopping_freezes_an_item_once_its_best_loss_stalls_for_patience_steps(rippled, cuda_graph):
    objective, seeds = rippled
    counting = CountingObjective(objective)
    settings = dict(step_size=0.5, progress=False, log_every=1, cuda_graph=cuda_graph)
    full = invert_batch(objective, seeds, steps=150, **settings)
    stopped = invert_batch(counting, seeds, steps=150, patience=15, rtol=1e-3, **settings)
    expected = stop_step_by_the_rule(full.loss_curve, patience=15, rtol=1e-3)
    assert stopped.steps_used.tolist() == expected
    assert max(expected) < 150 and len(set(expected)) > 1, expected  # the test stops items, at different steps
    # A frozen item returns exactly what the unstopped run held at its stopping step, and its curve stays flat.
    items = torch.arange(6)
    assert torch.equal(stopped.best_loss, full.loss_curve[stopped.steps_used, items])
    assert torch.equal(stopped.loss_curve[:, 0][expected[0]:], stopped.best_loss[0].expand(151 - expected[0]))
    for item in range(6):
        alone = invert_batch(objective, seeds, steps=expected[item], **settings)
        assert torch.equal(stopped.images[item], alone.images[item])
    if not cuda_graph:  # compacting: frozen items leave the batch, so far fewer rows are evaluated than 6 x 151
        assert counting.rows < 0.9 * 6 * 151
    # The work the device did, next to the steps that counted: every step of the unstopped run; with early stopping at
    # least the steps used, and no more than the rows the objective saw (each step scores its iterate in its forward).
    loop = "masked" if cuda_graph else "eager"
    assert full.loop == stopped.loop == loop and full.item_steps_computed == 6 * 150
    assert stopped.steps_used.sum() <= stopped.item_steps_computed <= counting.rows
    if cuda_graph:  # fixed shapes: the whole batch steps until its last item freezes
        assert stopped.item_steps_computed % 6 == 0 and stopped.item_steps_computed >= 6 * max(expected)


@pytest.mark.parametrize(
    "settings",
    [
        dict(step_size=0.5, patience=10, rtol=1e-3),
        dict(step_size=0.5, loss_threshold=0.06, keep_best=False),
        dict(stepper="adam", step_size=0.1, patience=5, rtol=3e-2, micro_batch=4),
        dict(step_size=0.5, steps=0),
    ],
    ids=["patience", "threshold-last-iterate", "adam-micro-batches", "zero-steps"],
)
def test_the_graph_structured_loop_gives_the_eager_loops_results_bit_for_bit(rippled, settings):
    # cuda_graph=True off CUDA runs the very loop a CUDA graph replays (fixed shapes, finished items masked) without
    # the graph: the graph-free fallback. It must equal the eager loop (finished items compacted away) exactly.
    objective, seeds = rippled
    settings = {"steps": 60, **settings, **QUICK}
    eager = invert_batch(objective, seeds, cuda_graph=False, **settings)
    masked = invert_batch(objective, seeds, cuda_graph=True, **settings)
    if settings["steps"]:
        assert (eager.steps_used < 60).any()  # some items finish early
    for field in ("images", "best_loss", "initial_loss", "last_loss", "steps_used", "loss_curve"):
        assert torch.equal(getattr(masked, field), getattr(eager, field)), field


def _capture_cases(kind: str, tiny_representation, tiny_classifier, wave_images):
    """(objective, starts) of each kind the stimulus sets hand the engine, on 16x16 images."""
    origins = wave_images(4)
    starts = noise_images(4, (3, 16, 16), seed=2)
    if kind == "inversion-resnet18-fake-relu":  # the paper's network through the toolkit's wrapper (the capture blocker)
        from training import Representation, build_model

        torch.manual_seed(0)
        return InversionLoss(Representation(build_model("resnet18", "cifar10", width=4), fake_relu=True), origins), starts
    if kind == "two-way-controversial":
        first_keeps = torch.tensor([True, True, False, False])
        return TwoWayControversialLoss(tiny_representation(0), tiny_representation(1), origins, first_keeps, lam=0.1), starts
    return ClassControversialLoss(tiny_classifier(0), tiny_classifier(1), torch.tensor([0, 1, 2, 0]), torch.tensor([1, 2, 0, 2])), starts


@pytest.mark.parametrize("kind", ["inversion-resnet18-fake-relu", "two-way-controversial", "class-controversial"])
@pytest.mark.parametrize(
    "settings",
    [
        dict(step_size=0.5, patience=3, rtol=1e-3, loss_threshold=0.05, stop_at_bounds=True),
        dict(stepper="adam", step_size=0.05, step_schedule="cosine", parametrization="sigmoid", tv_weight=0.1, lp_weight=0.1,
             transform_robust=True, transform_samples=2),
        dict(stepper="linf", step_size=0.01, step_schedule="linear", parametrization="fourier", precision="bf16", channels_last=True,
             keep_best=False),
    ],
    ids=["l2-paper-early-stopping", "adam-cosine-priors-transforms", "linf-fourier-bf16-channels-last"],
)
def test_the_step_a_cuda_graph_captures_reads_no_tensor_on_the_host(kind, settings, tiny_representation, tiny_classifier, wave_images,
                                                                    monkeypatch):
    """The CPU's proxy for "capturable" (``refusing_host_reads``): with ``cuda_graph=True`` every step, the first
    included, reads no tensor value into Python and makes no value-dependent shape, for every objective, stepper,
    parametrisation, schedule, prior and precision. ``make test-gpu`` captures for real."""
    objective, starts = _capture_cases(kind, tiny_representation, tiny_classifier, wave_images)
    original, calls = engine_module._Runner.step, []

    def guarded(self, w, step):
        calls.append(1)
        with refusing_host_reads("the engine's step"):
            original(self, w, step)

    monkeypatch.setattr(engine_module._Runner, "step", guarded)
    result = invert_batch(objective, starts, steps=6, cuda_graph=True, log_every=2, progress=False, **settings)
    assert len(calls) == 6 and torch.isfinite(result.best_loss).all()


@contextlib.contextmanager
def recorded_capture():
    """The engine's capture loop on the CPU, each micro-batch's step recorded once and replayed (``record_once``, the
    CPU's stand-in for ``torch.cuda.graph``); yields the list of recordings made."""
    recordings = []

    def capture(runner, w, step):
        writes = [*(t for t in vars(w).values() if isinstance(t, torch.Tensor)), *w.state.values(), step]
        recordings.append(record_once(lambda: runner.step(w, step), writes))
        return recordings[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_module, "_graph_mode", lambda cfg, device: "capture")
        patch.setattr(engine_module._Runner, "_capture", capture)
        yield recordings


@pytest.mark.parametrize(
    "kind, settings",
    [
        ("inversion-resnet18-fake-relu",  # the paper's inversion as the engine runs it fastest (bf16, channels-last)
         dict(step_size=0.5, patience=3, rtol=1e-3, loss_threshold=0.05, stop_at_bounds=True, precision="bf16", channels_last=True)),
        ("two-way-controversial", dict(stepper="adam", step_size=0.05, step_schedule="cosine", parametrization="sigmoid", tv_weight=0.1,
                                       lp_weight=0.1, transform_robust=True, transform_samples=2)),
        ("class-controversial", dict(stepper="linf", step_size=0.01, step_schedule="linear", parametrization="fourier", keep_best=False)),
    ],
    ids=["inversion-l2-paper-early-stopping-bf16", "two-way-adam-cosine-priors-transforms", "class-linf-fourier"],
)
def test_the_step_recorded_once_and_replayed_gives_the_graph_free_loops_results(kind, settings, tiny_representation, tiny_classifier,
                                                                               wave_images):
    """What capture assumes, on the CPU: the step recorded once (Python values baked in, as a CUDA graph bakes them)
    and replayed for every later step gives the graph-free masked loop's results bit for bit, schedules, per-item
    random transformations and early stopping included. Two micro-batches: each is recorded once. (The host-read
    test above covers every kind with every setting; each pairing here has its own objective, stepper, schedule
    and parametrisation.)"""
    objective, starts = _capture_cases(kind, tiny_representation, tiny_classifier, wave_images)
    run = dict(steps=12, cuda_graph=True, log_every=3, micro_batch=2, progress=False, **settings)
    masked = invert_batch(objective, starts, **run)
    with recorded_capture() as recordings:
        replayed = invert_batch(objective, starts, **run)
    assert len(recordings) == 2
    for field in ("images", "best_loss", "initial_loss", "last_loss", "steps_used", "loss_curve"):
        assert torch.equal(getattr(replayed, field), getattr(masked, field)), field


def test_a_failed_capture_is_not_tried_again_for_every_micro_batch(inversion):
    """Under cuda_graph='auto' a capture that failed was attempted again for each micro-batch: three warm-up steps, a
    synchronize, a warning (and, on some torch releases, a memory pool never released) every time."""
    objective, seeds = inversion
    attempts = []

    def failing_capture(runner, w, step):
        attempts.append(w.rows.numel())
        return None  # what capture_cuda_graph returns after a failure that cuda_graph='auto' allows

    run = dict(steps=4, cuda_graph="auto", micro_batch=1, progress=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_module, "_graph_mode", lambda cfg, device: "capture")
        patch.setattr(engine_module._Runner, "_capture", failing_capture)
        fallen_back = invert_batch(objective, seeds, **run)
    assert len(seeds) > 1 and attempts == [1]
    assert fallen_back.loop == "masked"  # every micro-batch ran the graph-free masked loop
    masked = invert_batch(objective, seeds, **{**run, "cuda_graph": True})
    assert torch.equal(fallen_back.images, masked.images)


def test_the_recorded_replay_catches_a_step_that_keeps_state_in_python(inversion):
    """The stand-in's own check: an objective that counts its calls in Python (a value a CUDA graph would freeze at
    capture) runs fine eagerly, and its recorded replay differs."""
    objective, seeds = inversion

    class CountingInPython(Objective):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x, items=None, step=0):
            self.calls += 1
            return objective(x) * (1 + 0.1 * self.calls)

    run = dict(steps=6, cuda_graph=True, keep_best=False, progress=False)
    masked = invert_batch(CountingInPython(), seeds, **run)
    with recorded_capture():
        replayed = invert_batch(CountingInPython(), seeds, **run)
    assert not torch.equal(replayed.last_loss, masked.last_loss)


def test_the_host_read_proxy_catches_value_reads_and_value_dependent_shapes():
    x = torch.randn(6)
    reads = (lambda: x.sum().item(), lambda: float(x[0]), lambda: bool(x.max() > 0), lambda: x[x > 0], lambda: torch.nonzero(x),
             lambda: x.masked_select(x > 0), lambda: torch.unique(x), lambda: torch.nn.functional.one_hot(x.abs().long(), 9))
    for read in reads:
        with pytest.raises(AssertionError, match="the step"), refusing_host_reads():
            read()
    with refusing_host_reads():  # what a captured step may do: fixed shapes, values stay on the device
        torch.where(x > 0, x, 0.0).clamp(0, 1).sum()
        x.index_select(0, torch.tensor([0, 2]))


@pytest.mark.parametrize("items, free_mib, expected", [(1000, 64, 334), (1000, 4096, 1000), (1000, 1, 1), (1, 4096, 1)],
                         ids=["budget-bound", "all-items", "at-least-one", "a-single-item"])
def test_the_cuda_micro_batch_follows_the_measured_memory_model(tiny_representation, wave_images, monkeypatch, items, free_mib, expected):
    """The budget arithmetic of ``measure_micro_batch`` on the CPU, with torch.cuda's memory counters replaced by a
    device whose peak is ``fixed + n * per_sample`` for a probe step of n items: the micro-batch is the largest n with
    ``fixed + n * per_sample <= memory_fraction * (free + cached)`` (gpu tests measure a real one)."""
    from invert.params import make_parametrization
    from invert.steps import make_stepper

    objective = InversionLoss(tiny_representation(), wave_images(16))  # the probes step 8 and 16 items
    mib, fixed, per_sample, base, cached = 2**20, 3 * 2**20, 150 * 2**10, 7 * 2**20, 2**20
    peak = {"bytes": 0}
    original = engine_module._Runner.step

    def step(self, w, step_index):
        peak["bytes"] = base + fixed + w.param.shape[0] * per_sample
        original(self, w, step_index)

    monkeypatch.setattr(engine_module._Runner, "step", step)
    for name, fake in {"synchronize": lambda device=None: None, "reset_peak_memory_stats": lambda device=None: None,
                       "memory_allocated": lambda device=None: base, "max_memory_allocated": lambda device=None: peak["bytes"],
                       "memory_reserved": lambda device=None: base + cached,
                       "mem_get_info": lambda device=None: (free_mib * mib, 80 * 2**30)}.items():
        monkeypatch.setattr(torch.cuda, name, fake)
    runner = engine_module._Runner(InvertConfig(), objective, make_parametrization("pixel", False), make_stepper("l2", 1.0),
                                   torch.device("cpu"), use_bf16=False)
    init = noise_images(items, (3, 16, 16), seed=0)
    budget = 0.8 * (free_mib * mib + cached) - fixed
    assert expected == max(1, min(items, int(budget // per_sample)))  # the case says what it tests
    assert runner.measure_micro_batch(init, memory_fraction=0.8) == expected


def test_the_engine_never_writes_into_the_callers_tensors(rippled):
    objective, seeds = rippled  # the loop updates its buffers in place; they must be its own
    before = seeds.clone()
    invert_batch(objective, seeds, steps=5, cuda_graph=True, **QUICK)
    invert_batch(objective, seeds, steps=5, **QUICK)
    assert torch.equal(seeds, before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_a_low_or_high_precision_start_is_searched_in_float32_and_returned_in_its_dtype(inversion, dtype):
    """The iterate is float32 whatever ``init``'s dtype: a bf16 seed gives the float32 run's result (rounded back to
    bf16), not a search whose steps round away; a float64 seed reaches a float32 model without a dtype error."""
    objective, seeds = inversion
    seeds = seeds.to(dtype)
    settings = dict(steps=30, step_size=0.05, step_schedule="cosine", **QUICK)
    result = invert_batch(objective, seeds, **settings)
    reference = invert_batch(objective, seeds.float(), **settings)
    assert result.images.dtype == dtype
    assert torch.equal(result.images, reference.images.to(dtype))
    assert torch.equal(result.best_loss, reference.best_loss) and result.best_loss.dtype == torch.float32
    # task_loss is the loss of the images returned: rounded to bf16 they moved (about 1 %), and it said the float32 iterate's
    with torch.no_grad():
        torch.testing.assert_close(result.task_loss, objective(result.images.float()), rtol=1e-5, atol=1e-7)


def test_zero_steps_with_a_decaying_schedule_scores_the_starting_images(inversion):
    objective, seeds = inversion
    result = invert_batch(objective, seeds, steps=0, step_schedule="cosine", **QUICK)
    assert torch.equal(result.images, seeds) and (result.steps_used == 0).all()
    torch.testing.assert_close(result.best_loss, result.initial_loss)


def test_loss_threshold_stops_a_sample_at_the_first_step_below_it(inversion):
    objective, seeds = inversion
    free = invert_batch(objective, seeds, steps=100, step_size=0.05, **QUICK)
    threshold = 0.3
    stopped = invert_batch(objective, seeds, steps=100, step_size=0.05, loss_threshold=threshold, **QUICK)
    assert (stopped.best_loss <= threshold).all() and (stopped.steps_used < 100).all()
    # It stopped at the first curve point below the threshold, not later.
    first_below = (free.loss_curve <= threshold).float().argmax(0)
    assert (stopped.steps_used <= torch.tensor(free.curve_steps)[first_below]).all()


def test_the_loop_runs_in_hot_loop_mode_in_eval_with_frozen_weights(wave_images):
    torch.manual_seed(0)
    rep = nn.Sequential(nn.Conv2d(3, 4, 3, 2), nn.BatchNorm2d(4), nn.Dropout(0.5), nn.Flatten())
    objective = InversionLoss(rep, wave_images(2))
    rep.train()
    counting = CountingObjective(objective)
    first = invert_batch(counting, wave_images(2, seed=5), steps=5, **QUICK)
    second = invert_batch(counting, wave_images(2, seed=5), steps=5, **QUICK)
    assert all(counting.hot) and not in_hot_loop()
    torch.testing.assert_close(first.images, second.images)  # dropout off: deterministic
    assert rep.training and all(p.requires_grad for p in rep.parameters())  # restored
    assert all(p.grad is None for p in rep.parameters())


def test_zero_steps_returns_the_seeds(inversion):
    objective, seeds = inversion
    result = invert_batch(objective, seeds, steps=0, **QUICK)
    torch.testing.assert_close(result.images, seeds)
    torch.testing.assert_close(result.best_loss, result.initial_loss)
    assert torch.equal(result.steps_used, torch.zeros(4, dtype=torch.long))


def test_presets_build_engines():
    assert Engine.preset("paper").config == InvertConfig()
    assert Engine.preset("fast", steps=10).config.steps == 10


@pytest.mark.slow
def test_compiled_objective_gives_the_same_result(inversion):
    objective, seeds = inversion
    eager = invert_batch(objective, seeds, steps=20, step_size=0.1, **QUICK)
    compiled = invert_batch(objective, seeds, steps=20, step_size=0.1, compile=True, **QUICK)
    torch.testing.assert_close(compiled.images, eager.images, atol=1e-4, rtol=0)


# ---------------------------------------------------------------- error paths


class NaNForItem(Objective):
    def __init__(self, inner: nn.Module, item: int, from_step: int):
        super().__init__()
        self.inner, self.item, self.from_step = inner, item, from_step

    def forward(self, x, items=None, step=0):
        loss = self.inner(x, items, step)
        bad = (items == self.item) & (torch.as_tensor(step) >= self.from_step)
        return torch.where(bad, torch.full_like(loss, float("nan")), loss)


def test_nan_loss_raises_a_clear_error_naming_the_items(inversion):
    objective, seeds = inversion
    with pytest.raises(NonFiniteLossError, match=r"NaN or Inf for 1 item\(s\) \[2\] by step 20"):
        invert_batch(NaNForItem(objective, item=2, from_step=13), seeds, steps=50, **QUICK)
    with pytest.raises(NonFiniteLossError, match=r"\[2\] by step 50"):  # caught at the end too
        invert_batch(NaNForItem(objective, item=2, from_step=45), seeds, steps=50, **QUICK)


def test_bad_inputs_have_clear_messages(inversion):
    objective, seeds = inversion
    with pytest.raises(ValueError, match=r"init must lie in \[0, 1\].*divide by 255"):
        invert_batch(objective, seeds * 255, steps=1, **QUICK)
    with pytest.raises(ValueError, match=r"init must lie in \[0, 1\].*normalised"):
        invert_batch(objective, seeds - 0.5, steps=1, **QUICK)
    with pytest.raises(ValueError, match=r"init must be 4-D \(N, C, H, W\).*unsqueeze"):
        invert_batch(objective, seeds[0], steps=1, **QUICK)
    with pytest.raises(TypeError, match="init are uint8"):
        invert_batch(objective, (seeds * 255).to(torch.uint8), steps=1, **QUICK)
    with pytest.raises(ValueError, match="the batch has 3 rows but the objective holds 4 targets"):
        invert_batch(lambda x, items=None, step=0: objective(x), seeds[:3], steps=1, **QUICK)

    class Reduced(Objective):
        def forward(self, x, items=None, step=0):
            return objective(x, items).mean()

    with pytest.raises(ValueError, match=r"one loss per sample, shape \(4,\), got \(\).*no \.mean\(\)"):
        invert_batch(Reduced(), seeds, steps=1, **QUICK)
    with pytest.raises(TypeError, match="objective must be callable"):
        invert_batch("loss", seeds, steps=1, **QUICK)
    elsewhere = InversionLoss.from_features(objective.representation, torch.zeros(4, 8, device="meta"))
    with pytest.raises(ValueError, match="objective holds tensors on meta but init is on cpu: move one with .to"):
        invert_batch(elsewhere, seeds, steps=1, **QUICK)
    for offset in (1.5, -1, True):  # 1.5 keyed every item's draws as offset 1 without a word
        with pytest.raises(ValueError, match="item_offset must be a whole number >= 0"):
            Engine(steps=1, **QUICK).run(objective, seeds, item_offset=offset)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(stepper="sgd"), "unknown stepper 'sgd'; choose one of \\['adam', 'l2', 'linf'\\]"),
        (dict(parametrization="wavelet"), "unknown parametrization 'wavelet'"),
        (dict(step_schedule="exp"), "unknown step_schedule 'exp'; choose one of \\['constant', 'cosine', 'linear'\\]"),
        (dict(precision="fp16"), "unknown precision 'fp16'; choose one of \\['fp32', 'bf16', 'auto'\\]"),
        (dict(steps=-1), "steps must be >= 0"),
        (dict(step_size=0.0), "step_size must be a positive finite number"),
        (dict(log_every=0), "log_every must be at least 1"),
        (dict(patience=0), "patience must be at least 1 step"),
        (dict(micro_batch=0), "micro_batch must be at least 1"),
        (dict(memory_fraction=1.5), "memory_fraction must be in \\(0, 1\\]"),
        (dict(cuda_graph="always"), "cuda_graph must be one of \\[False, True, 'auto'\\], got 'always'"),
        (dict(cuda_graph=True, compile=True), "cuda_graph=True and compile=True both want.*compile_mode='reduce-overhead'"),
        (dict(iterations=10), "unknown invert config keys \\['iterations'\\]; valid keys are"),
        (dict(step_size="0.5"), "step_size must be a number, got '0.5'"),  # was an unnamed TypeError from math.isfinite
        (dict(rtol="1e-3"), "rtol must be a number, got '1e-3'"),
        (dict(memory_fraction="0.5"), "memory_fraction must be a number"),
        (dict(adam_betas=("0.9", 0.999)), "adam_betas must be two numbers"),
    ],
)
def test_bad_settings_have_clear_messages(settings, message):
    with pytest.raises(ValueError, match=message):
        Engine(**settings)


def test_counts_of_items_and_starts_must_match(inversion, tiny_representation, wave_images):
    objective, seeds = inversion  # 4 targets
    with pytest.raises(ValueError, match="holds 4 items .targets or origins. but init has 3 starting images"):
        Engine(steps=1, **QUICK).run(objective, seeds[:3])
    five = noise_images(5, (3, 16, 16), seed=2)
    with pytest.raises(ValueError, match="holds 4 items .* but init has 5 starting images"):
        Engine(steps=1, **QUICK).run(objective, five)
    controversial = ControversialLoss(tiny_representation(0), tiny_representation(1), wave_images(3), lam=0.1)
    with pytest.raises(ValueError, match="holds 3 items"):
        Engine(steps=1, **QUICK).run(controversial, seeds)
    # the documented exception: one start is shared by every item
    shared = Engine(steps=3, **QUICK).run(objective, seeds[:1])
    separate = Engine(steps=3, **QUICK).run(objective, seeds[:1].expand(4, -1, -1, -1))
    assert shared.images.shape == (4, 3, 16, 16)
    torch.testing.assert_close(shared.images, separate.images, rtol=0, atol=0)


@pytest.mark.gpu
def test_bf16_autocast_on_cuda_tracks_the_fp32_result(inversion):
    objective, seeds = inversion
    objective, seeds = objective.cuda(), seeds.cuda()
    fp32 = Engine(steps=30, precision="fp32", **QUICK).run(objective, seeds)
    bf16 = Engine(steps=30, precision="auto", **QUICK).run(objective, seeds)  # auto = bf16 on CUDA
    assert bf16.images.dtype == torch.float32 and bf16.best_loss.dtype == torch.float32
    assert (bf16.best_loss < bf16.initial_loss).all()
    assert (bf16.best_loss - fp32.best_loss).abs().max() < 0.1 * fp32.initial_loss.max()


@pytest.mark.gpu
def test_cuda_micro_batch_is_measured_and_never_changes_an_item(inversion):
    objective, seeds = inversion
    objective, seeds = objective.cuda(), seeds.cuda()
    measured = Engine(steps=5, memory_fraction=0.5, **QUICK).run(objective, seeds)
    assert 1 <= measured.micro_batch <= 4
    one_by_one = Engine(steps=5, micro_batch=1, **QUICK).run(objective, seeds)
    torch.testing.assert_close(measured.images, one_by_one.images, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_cuda_progress_reports_arrive_through_pinned_memory_one_report_late(inversion):
    from invert.engine import _HostMirror

    mirror = _HostMirror(torch.device("cuda"))
    assert mirror.lagged
    first = mirror.exchange(torch.arange(3.0, device="cuda"), "a")
    second = mirror.exchange(torch.arange(3.0, device="cuda") + 1, "b")
    assert first is None and second[1] == "a" and second[0].is_pinned()
    assert torch.equal(second[0], torch.arange(3.0)) and mirror.drain()[1] == "b"
    objective, seeds = inversion
    result = Engine(steps=20, log_every=5, progress=False, patience=5, rtol=0.5).run(objective.cuda(), seeds.cuda())
    assert (result.steps_used <= 20).all() and result.images.is_cuda


@pytest.mark.gpu
def test_deterministic_cuda_runs_are_bit_identical(inversion):
    objective, seeds = inversion
    objective, seeds = objective.cuda(), seeds.cuda()
    first = Engine(steps=20, **QUICK).run(objective, seeds)
    again = Engine(steps=20, **QUICK).run(objective, seeds)
    assert torch.equal(first.images, again.images) and torch.equal(first.best_loss, again.best_loss)


@pytest.mark.gpu
def test_compiled_objective_on_cuda_gives_the_same_result(inversion):
    objective, seeds = inversion
    objective, seeds = objective.cuda(), seeds.cuda()
    eager = Engine(steps=5, **QUICK).run(objective, seeds)
    compiled = Engine(steps=5, compile=True, **QUICK).run(objective, seeds)
    torch.testing.assert_close(compiled.images, eager.images, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "settings",
    [dict(), dict(precision="bf16", channels_last=True), dict(stepper="adam", step_size=0.05, transform_robust=True, transform_samples=2),
     dict(stepper="linf", step_size=0.01, parametrization="fourier")],  # its colour matrices once, not inverted in every step
    ids=["fp32", "bf16-channels-last", "adam-transform-robust", "linf-fourier"],
)
def test_the_captured_step_equals_the_uncaptured_step(inversion, settings):
    objective, seeds = inversion
    objective, seeds = objective.cuda(), seeds.cuda()
    settings = {"steps": 30, **settings, **QUICK}
    eager = Engine(cuda_graph=False, **settings).run(objective, seeds)
    captured = Engine(cuda_graph=True, **settings).run(objective, seeds)
    # Deterministic cuDNN and the same batch throughout: the replayed kernels are the eager ones. Except grid_sample's
    # backward (transform_robust), which adds with atomics in no fixed order on CUDA (invert.config's ``deterministic``
    # does not cover it): two eager runs differ in the last bits too, so that case is compared at a tolerance.
    compare = (torch.equal if not settings.get("transform_robust")
               else lambda a, b: a.dtype == b.dtype and torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-4))
    for field in ("images", "best_loss", "initial_loss", "last_loss", "steps_used", "loss_curve"):
        assert compare(getattr(captured, field), getattr(eager, field)), field


@pytest.mark.gpu
@pytest.mark.parametrize("objective_kind", ["inversion", "two-way-controversial"])
def test_the_captured_step_equals_the_uncaptured_step_on_the_papers_path(wave_images, objective_kind):
    """The paper's path: a zoo ResNet18 through Representation with its fake ReLU (which synchronised with the host and
    broke capture before hot_loop), and the controversial set's two-way objective."""
    from training import Representation
    from training.models import build_model

    torch.manual_seed(0)
    representations = [Representation(build_model("resnet18", "cifar10", width=8), fake_relu=True).cuda() for _ in range(2)]
    targets = torch.nn.functional.interpolate(wave_images(4), size=32).cuda()
    objective = (InversionLoss(representations[0], targets) if objective_kind == "inversion"
                 else TwoWayControversialLoss(representations[0], representations[1], targets, torch.tensor([True, False, True, False])))
    seeds = noise_images(4, (3, 32, 32), seed=1).cuda()
    settings = {"steps": 20, "precision": "bf16", "channels_last": True, **QUICK}
    eager = Engine(cuda_graph=False, **settings).run(objective, seeds)
    captured = Engine(cuda_graph=True, **settings).run(objective, seeds)
    for field in ("images", "best_loss", "steps_used"):
        assert torch.equal(getattr(captured, field), getattr(eager, field)), field


@pytest.mark.gpu
def test_captured_items_that_finish_early_are_masked_not_recaptured(inversion, monkeypatch):
    captures = []
    original = engine_module._Runner._capture
    monkeypatch.setattr(engine_module._Runner, "_capture", lambda self, w, step: captures.append(1) or original(self, w, step))
    objective, seeds = inversion
    objective, seeds = objective.cuda(), seeds.cuda()
    settings = dict(steps=200, step_size=0.3, patience=20, rtol=0.07, progress=False, log_every=10)
    captured = Engine(cuda_graph=True, **settings).run(objective, seeds)
    assert len(captures) == 1 and (captured.steps_used < 200).all() and captured.loop == "cuda-graph"
    # The reference: the same masked loop run eagerly on CUDA (the eager default compacts finished items away, and
    # other batch sizes may pick other cuDNN kernels).
    monkeypatch.setattr(engine_module, "_graph_mode", lambda cfg, device: "masked")
    eager = Engine(cuda_graph=True, **settings).run(objective, seeds)
    assert len(captures) == 1 and eager.loop == "masked" and captured.item_steps_computed == eager.item_steps_computed
    for field in ("images", "best_loss", "initial_loss", "last_loss", "steps_used", "loss_curve"):
        assert torch.equal(getattr(captured, field), getattr(eager, field)), field


@pytest.mark.parametrize("models", ["pointwise", "conv"])
def test_both_controversial_directions_in_one_batch_equal_one_batch_per_direction(tiny_representation, wave_images, models):
    from invert import TwoWayControversialLoss

    if models == "pointwise":  # no coupling between rows at all: the results must be identical bit for bit
        g1, g2 = nn.Sequential(nn.Flatten(), nn.Tanh()), nn.Sequential(nn.Flatten(), nn.Softplus(beta=4.0))
    else:  # convolutions: a different batch around a row may change the last bit of a sum
        g1, g2 = tiny_representation(0), tiny_representation(1)
    origins = wave_images(3).repeat_interleave(2, 0)  # 3 origins x 2 restarts
    starts = clamp01(random_start_l2(origins, 0.5, generator=torch.Generator().manual_seed(0)))
    settings = dict(steps=30, step_size=0.3, patience=10, rtol=1e-2, **QUICK)
    ab = invert_batch(ControversialLoss(g1, g2, origins, lam=0.1), starts, **settings)
    ba = invert_batch(ControversialLoss(g2, g1, origins, lam=0.1), starts, **settings)
    first_keeps = torch.tensor([True] * 6 + [False] * 6)
    both = invert_batch(TwoWayControversialLoss(g1, g2, origins.repeat(2, 1, 1, 1), first_keeps, lam=0.1), starts.repeat(2, 1, 1, 1), **settings)
    separate = {field: torch.cat([getattr(ab, field), getattr(ba, field)]) for field in ("images", "best_loss", "steps_used")}
    if models == "pointwise":
        for field, value in separate.items():
            assert torch.equal(getattr(both, field), value), field
    else:
        torch.testing.assert_close(both.images, separate["images"], atol=1e-5, rtol=0)
        torch.testing.assert_close(both.best_loss, separate["best_loss"], atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match=r"first_keeps must be a bool tensor with one entry per origin \(12,\), got torch.int64 \(12,\)"):
        TwoWayControversialLoss(g1, g2, origins.repeat(2, 1, 1, 1), first_keeps.long())


def test_task_loss_is_the_callers_objective_alone_at_the_kept_images():
    """With priors or transformation robustness the engine minimises more than the caller's objective; task_loss is what
    the caller's objective says of the images it returns (an inversion's distance), best_loss itself when neither is on."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16))
    objective = InversionLoss(net, torch.rand(4, 3, 8, 8))
    start = torch.rand(4, 3, 8, 8)
    plain = Engine(InvertConfig(steps=20, step_size=0.5, progress=False)).run(objective, start)
    assert torch.equal(plain.task_loss, plain.best_loss) and plain.task_loss is not plain.best_loss
    for extras in ({"tv_weight": 0.05, "lp_weight": 0.01}, {"transform_robust": True, "transform_samples": 2}):
        result = Engine(InvertConfig(steps=20, step_size=0.5, progress=False, **extras)).run(objective, start)
        with torch.no_grad():
            bare = objective(result.images, torch.arange(4))
        torch.testing.assert_close(result.task_loss, bare)
        assert not torch.allclose(result.task_loss, result.best_loss), extras


def test_a_bf16_runs_task_loss_is_rescored_in_float32():
    """bf16 features of the iterate against float32 targets: the loss at the target itself is ~0.003, not 0."""
    torch.manual_seed(0)
    representation = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.Conv2d(8, 8, 3, 2, 1), nn.Flatten()).eval()
    targets = torch.rand(3, 3, 16, 16)
    result = Engine(InvertConfig(steps=0, precision="bf16", progress=False)).run(InversionLoss(representation, targets), targets)
    assert (result.best_loss > 1e-3).all() and torch.equal(result.task_loss, torch.zeros(3))


def _pooled(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten()).eval()


def test_starting_images_of_another_size_than_the_targets_are_refused(wave_images):
    """A pooled representation gives features of one length at any size: 8 x 8 seeds against 16 x 16 targets ran to the
    end and came back at 8 x 8, without a word."""
    representation, targets, tiny_representation = _pooled(0), wave_images(2), _pooled
    engine = Engine(InvertConfig(steps=2, **QUICK))
    small = noise_images(2, (3, 8, 8), seed=1)
    assert representation(small).shape == representation(targets).shape  # the mismatch the engine must catch
    refusal = r"init's images are 3x8x8 \(C x H x W\) but the objective's targets or origins are 3x16x16: resize or crop the seeds"
    for objective in (InversionLoss(representation, targets), ControversialLoss(representation, tiny_representation(1), targets),
                      TwoWayControversialLoss(representation, tiny_representation(1), targets, torch.tensor([True, False])),
                      InversionLoss.from_features(representation, representation(targets).detach(), image_shape=(3, 16, 16))):
        with pytest.raises(ValueError, match=refusal):
            engine.run(objective, small)
    with pytest.raises(ValueError, match=r"image_shape must be the targets' \(C, H, W\), three whole numbers >= 1, got \(16, 16\)"):
        InversionLoss.from_features(representation, representation(targets).detach(), image_shape=(16, 16))
    unknown = InversionLoss.from_features(representation, representation(targets).detach())  # no shape given: nothing to check
    assert engine.run(unknown, small).images.shape == (2, 3, 8, 8)
    assert engine.run(InversionLoss(representation, targets), noise_images(2, (3, 16, 16), seed=1)).images.shape == (2, 3, 16, 16)


def test_negative_class_indices_are_refused_when_the_objective_is_built(tiny_classifier):
    with pytest.raises(ValueError, match=r"class2 must be class indices >= 0, got \[-1\]"):
        ClassControversialLoss(tiny_classifier(0), tiny_classifier(1), 0, [1, -1])
