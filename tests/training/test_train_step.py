"""``train.cuda_graph``: the training step as one function over static buffers (``training.step``).

On the CPU, ``cuda_graph=true`` runs the captured step's structure eagerly (static input, label and learning-rate
buffers, in-place running sums, autocast without its cache); these tests check that it trains exactly like the eager
step, bit for bit, through the scheduler's learning-rate changes, and so does the capture mode with the step recorded
once and replayed (``record_once``, the CPU's stand-in for a CUDA graph). The gpu-marked tests check the replayed graph
against the eager step on CUDA.
"""
from __future__ import annotations

import contextlib
import logging

import pytest
import torch

import training.step as step_module
import training.trainer as trainer_module
from training.attacks import ThreatModel, attack_mode
from training.folding import eval_view, forget_folded_weights
from training.models import build_model
from training.optim import ConfigError
from training.recipes import FastATRecipe, PGDRecipe, StandardRecipe
from training.step import WARMUP_STEPS, TrainStep, graph_blocker, resolve_step_mode
from training.trainer import train

from ..conftest import record_once, refusing_host_reads

# Two epochs of 3 full batches (120 images, batch 32: the last 24 are dropped, as every epoch does), a learning rate
# that changes at every step (cosine after a one-epoch warm-up).
SHORT = ["train.epochs=2", "data_limit.train=120", "train.schedule.name=cosine", "train.schedule.warmup_epochs=1",
         "train.eval.every=0", "train.eval.final_subset=0"]
PGD = ["train=pgd", "train.attack.steps=2"]


def assert_same_training(a, b) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()  # weights and batch-norm statistics
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key
    timing = ("epoch_seconds", "epoch_cpu_seconds", "images_per_second")
    logged_a, logged_b = ([{k: v for k, v in h.items() if k not in timing} for h in r.summary["history"]] for r in (a, b))
    assert logged_a == logged_b and {"train_loss", "train_acc", "lr"} <= logged_a[0].keys()


class RecordedCaptureStep(TrainStep):
    """The capture mode on the CPU: warm-up steps run as they are, then the step is recorded once with ``record_once``
    (tests/conftest.py, the CPU's stand-in for ``torch.cuda.graph``) and the recording replayed for every later batch."""

    def __init__(self, *args, mode: str = "eager", **kwargs):
        super().__init__(*args, mode=mode, **kwargs)
        if mode == "static":  # what train.cuda_graph=true resolves to off CUDA
            self.mode = "capture"

    def _warm_up(self) -> None:
        self.step(self._inputs, self._labels)

    def _capture(self):
        optimizer_state = (t for state in self.optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor))
        writes = [*self.forward.state_dict(keep_vars=True).values(), *self.sums.values(), *optimizer_state]
        return record_once(lambda: self.step(self._inputs, self._labels), writes)


def record_the_training_step(monkeypatch) -> None:
    """From here on ``train.cuda_graph=true`` records the step after one warm-up step, so that the replays cross an
    epoch boundary (the running sums zeroed in place) and every scheduler step."""
    monkeypatch.setattr(trainer_module, "TrainStep", RecordedCaptureStep)
    monkeypatch.setattr(step_module, "WARMUP_STEPS", 1)


@pytest.mark.parametrize("recipe", [
    PGD,
    [*PGD, "train.attack.norm=linf", "train.attack.eps=8/255", "train.attack_fold_bn=false"],
    ["train=standard"],
    ["train=trades", "train.attack.steps=2", "train.augment.enabled=false"],
    ["train=mart", "train.attack.steps=2", "train.precision=bf16", "train.channels_last=true"],
], ids=["pgd-l2-folded", "pgd-linf-unfolded", "standard", "trades", "mart-bf16-channels-last"])
def test_the_graph_structured_step_trains_exactly_like_the_eager_step(make_config, monkeypatch, recipe):
    eager = train(make_config(*recipe, *SHORT, "train.cuda_graph=false", run="eager"))
    static = train(make_config(*recipe, *SHORT, "train.cuda_graph=true", run="static"))
    assert eager.summary["cuda_graph"] == "eager" and static.summary["cuda_graph"] == "static"
    assert len(static.summary["history"]) == 2 and static.summary["history"][1]["step"] == 6
    assert_same_training(eager, static)
    # One warm-up step, then the step recorded and replayed for the other five batches (a Python number frozen in the
    # recording, such as a learning rate, the attack's radius or a batch-norm fold cached across steps, would change
    # the weights).
    record_the_training_step(monkeypatch)
    recorded = train(make_config(*recipe, *SHORT, "train.cuda_graph=true", run="recorded"))
    assert recorded.summary["cuda_graph"] == "capture"
    assert_same_training(eager, recorded)


def test_the_recorded_replay_catches_a_learning_rate_passed_as_a_python_number(make_config, monkeypatch):
    """The stand-in's own check: with SGD's learning rate left a Python number (not the device tensor the step fills),
    a replay keeps the recorded rate while the scheduler moves on, and the weights differ from eager training."""
    eager = train(make_config("train=standard", *SHORT, "train.cuda_graph=false", run="eager"))
    monkeypatch.setattr(step_module, "_device_learning_rate", lambda optimizer, rates: contextlib.nullcontext())
    record_the_training_step(monkeypatch)
    recorded = train(make_config("train=standard", *SHORT, "train.cuda_graph=true", run="recorded"))
    assert [h["lr"] for h in recorded.summary["history"]] == [h["lr"] for h in eager.summary["history"]]
    assert not all(torch.equal(a, b) for a, b in zip(eager.model.parameters(), recorded.model.parameters()))


def test_cuda_graph_is_an_execution_setting_a_resumed_run_may_change(make_config):
    whole = train(make_config(*PGD, *SHORT, run="whole"))
    first = train(make_config(*PGD, *SHORT, "train.cuda_graph=true", "stop_after_epochs=1", run="split"))
    assert not first.completed
    resumed = train(make_config(*PGD, *SHORT, "train.cuda_graph=false", "resume=true", run="split"))
    assert_same_training(whole, resumed)


def _tiny_pgd(mode: str):
    torch.manual_seed(0)
    model = build_model("small_cnn", "digits", width=8)
    recipe = PGDRecipe(model, ThreatModel("l2", 1.0, steps=2)).train()
    optimizer = torch.optim.SGD(recipe.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.7 ** step)
    return recipe, scheduler, TrainStep(recipe, optimizer, device=torch.device("cpu"), bf16=None, mode=mode)


@pytest.mark.parametrize("recipe", [PGD, [*PGD, "train.attack.norm=linf", "train.attack.eps=8/255", "train.attack_bn=train"],
                                    ["train=trades", "train.attack.steps=2"], ["train=mart", "train.attack.steps=2"]],
                         ids=["pgd-l2", "pgd-linf-train-bn", "trades", "mart"])
def test_the_capturable_recipes_step_never_reads_a_tensor_on_the_host(make_config, monkeypatch, recipe):
    """The CPU's proxy for "capturable": after the first step (which creates the running sums and the folded view),
    the step function reads no tensor value into Python."""
    original, calls = TrainStep.step, []

    def guarded(self, inputs, labels):
        calls.append(1)
        with refusing_host_reads("the training step") if len(calls) > 1 else contextlib.nullcontext():
            original(self, inputs, labels)

    monkeypatch.setattr(TrainStep, "step", guarded)
    train(make_config(*recipe, *SHORT, "train.epochs=1", "train.cuda_graph=true"))
    assert len(calls) == 3


def test_the_host_read_check_catches_a_recipe_that_reads_its_loss():
    class Syncing(StandardRecipe):
        def forward(self, inputs, labels):
            loss, stats = super().forward(inputs, labels)
            return loss, {**stats, "loss_copy": torch.tensor(float(loss.detach()))}

    model = build_model("small_cnn", "digits", width=8)
    step = TrainStep(Syncing(model).train(), torch.optim.SGD(model.parameters(), lr=0.1), device=torch.device("cpu"), bf16=None, mode="static")
    x, y = torch.rand(4, 3, 8, 8), torch.randint(0, 10, (4,))
    step(x, y)
    with pytest.raises(AssertionError, match="the training step read a tensor on the host .Tensor.__float__."), refusing_host_reads("the training step"):
        step(x, y)


def test_a_batch_of_another_shape_runs_the_same_function_eagerly():
    generator = torch.Generator().manual_seed(1)
    sizes = [8, 8, 8, 5, 8]  # a short batch, then the static shape again
    batches = [(torch.rand(n, 3, 8, 8, generator=generator), torch.randint(0, 10, (n,), generator=generator)) for n in sizes]
    runs = {}
    for mode in ("eager", "static"):
        recipe, scheduler, step = _tiny_pgd(mode)
        step.start_epoch()
        for i, (x, y) in enumerate(batches):
            torch.manual_seed(100 + i)  # the attack's random start
            step(x, y)
            scheduler.step()
        runs[mode] = (recipe, step)
    (eager, eager_step), (static, static_step) = runs["eager"], runs["static"]
    assert all(torch.equal(p, q) for p, q in zip(eager.state_dict().values(), static.state_dict().values()))
    assert eager_step.sums.keys() == {"loss", "acc"}
    assert all(torch.equal(eager_step.sums[k], static_step.sums[k]) for k in eager_step.sums)
    # the optimizer's groups keep a Python learning rate between steps (for the scheduler and checkpoints)
    assert isinstance(static_step.optimizer.param_groups[0]["lr"], float)
    assert static_step.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.7 ** len(sizes))


def test_momentum_buffers_are_given_their_parameters_layout_before_the_fused_kernel_runs(make_config):
    """A run saved in the default memory format and resumed channels-last: SGD's fused kernel walks memory in order,
    so a buffer in the other layout would be updated with the wrong entries."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(conv.parameters(), lr=0.1, momentum=0.9)
    buffer = torch.randn(conv.weight.shape)  # contiguous, as a checkpoint of a contiguous model holds it
    optimizer.state[conv.weight]["momentum_buffer"] = buffer.clone()
    conv.weight.grad = torch.randn_like(conv.weight)  # the bias has no gradient and no buffer: SGD skips it
    expected = conv.weight.detach() - 0.1 * (0.9 * buffer + conv.weight.grad)
    TrainStep(lambda x, y: (conv(x).sum(), {}), optimizer, device=torch.device("cpu"), bf16=None)
    moved = optimizer.state[conv.weight]["momentum_buffer"]
    assert moved.stride() == conv.weight.stride() and torch.equal(moved, buffer)
    optimizer.param_groups[0]["fused"] = True  # the kernel the step uses
    optimizer.step()
    torch.testing.assert_close(conv.weight.detach(), expected, rtol=1e-6, atol=1e-6)
    # end to end: an epoch without channels-last, resumed with it
    train(make_config(*PGD, *SHORT, "train.channels_last=false", "stop_after_epochs=1", run="layout"))
    resumed = train(make_config(*PGD, *SHORT, "train.channels_last=true", "resume=true", run="layout"))
    assert resumed.completed and all(torch.isfinite(p).all() for p in resumed.model.parameters())


class _LateBranch(torch.nn.Module):
    """A second head that joins the loss only from the second step on (a branch switched on later)."""

    def __init__(self):
        super().__init__()
        self.first, self.second, self.use_second = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3), False

    def forward(self, inputs):
        return self.first(inputs) + (self.second(inputs) if self.use_second else 0)


@pytest.mark.parametrize("settings", [dict(momentum=0.9), dict(momentum=0.9, weight_decay=5e-4, nesterov=True),
                                      dict(momentum=0.9, dampening=0.3, weight_decay=1e-3), dict(momentum=0.5, maximize=True, weight_decay=1e-3)])
def test_a_parameter_whose_first_gradient_comes_late_steps_as_with_sgds_default_kernel(settings):
    """The fused kernel failed on a missing momentum buffer once the others existed; SGD starts it at the gradient."""
    torch.manual_seed(0)
    inputs, labels = torch.randn(16, 6), torch.randint(0, 3, (16,))
    models = [_LateBranch(), _LateBranch()]
    models[1].load_state_dict(models[0].state_dict())
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, **settings) for m in models]
    second_before = models[0].second.weight.detach().clone()
    fused = TrainStep(lambda x, y: (torch.nn.functional.cross_entropy(models[0](x), y), {}), optimizers[0], device=torch.device("cpu"), bf16=None)
    for step in range(4):
        for model in models:
            model.use_second = step >= 2
        fused(inputs, labels)
        optimizers[1].zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(models[1](inputs), labels).backward()
        optimizers[1].step()
    assert not torch.equal(models[0].second.weight, second_before)  # the late branch did train
    for ours, reference in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)


def test_the_summary_says_capture_only_where_a_graph_was_captured(make_config, monkeypatch):
    """A run with no more batches than the warm-up's was summarised as "capture" though nothing was captured."""
    record_the_training_step(monkeypatch)
    monkeypatch.setattr(step_module, "WARMUP_STEPS", 100)  # more than the run's 6 batches
    short = train(make_config(*PGD, *SHORT, "train.cuda_graph=true", run="short"))
    assert short.summary["cuda_graph"] == "static"


def test_cuda_graph_settings_are_checked_and_what_blocks_capture_is_named(make_config, tmp_path, caplog):
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match="false, true or auto"):
        resolve_step_mode("always", cpu, None)
    assert resolve_step_mode(False, cpu, None) == "eager"
    assert resolve_step_mode("auto", cpu, None) == "eager"  # nothing to capture off CUDA
    assert resolve_step_mode(True, cpu, None) == "static"
    assert resolve_step_mode("auto", torch.device("cuda"), None) == "capture"

    model = build_model("small_cnn", "digits", width=8)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    fast = FastATRecipe(model, ThreatModel("linf", 8 / 255, steps=1))
    assert "guard" in graph_blocker(fast, sgd, compiled=False, world_size=1)
    standard = StandardRecipe(model)
    assert graph_blocker(standard, sgd, compiled=False, world_size=1) is None
    assert "compile" in graph_blocker(standard, sgd, compiled=True, world_size=1)
    assert "DistributedDataParallel" in graph_blocker(standard, sgd, compiled=False, world_size=2)
    assert "Adam" in graph_blocker(standard, torch.optim.Adam(model.parameters()), compiled=False, world_size=1)

    # true: refused with the reason before the run directory is made; auto: the eager step, and an info line says why
    with pytest.raises(ConfigError, match="cuda_graph=true, but the fast_at recipe cannot be captured: its catastrophic"):
        train(make_config("train=fast_at", *SHORT, "train.cuda_graph=true", run="refused"))
    assert not (tmp_path / "refused").exists()
    with caplog.at_level(logging.INFO, logger="training.step"):
        result = train(make_config("train=simclr", "train.epochs=1", "train.batch_size=32", "train.probe.epochs=1",
                                   "train.schedule.warmup_epochs=0", "train.eval.every=0", "train.eval.final_subset=0", "train.cuda_graph=auto", run="auto"))
    assert result.summary["cuda_graph"] == "eager"
    assert "runs eagerly, because the simclr recipe cannot be captured" in caplog.text
    with pytest.raises(ConfigError, match="cuda_graph must be false, true or auto"):
        train(make_config("train=standard", "train.cuda_graph=sometimes", run="typo"))


@pytest.mark.parametrize("update", ["fused-sgd", "batch-norm-statistics"])
def test_every_attack_refolds_weights_that_changed_without_a_version_bump(update):
    """SGD's fused kernel (which the training step uses), batch norm's running-statistics update and CUDA graph
    replays change tensors in place without bumping their version counters, so the folded view's cache cannot see
    the change: ``attack_mode`` refolds on entry."""
    torch.manual_seed(0)
    model = build_model("small_cnn", "digits", width=8)
    x = torch.rand(4, 3, 8, 8)
    with attack_mode(model) as view:
        before = view(x)
    if update == "fused-sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5, fused=True)
        model.train()(x).square().sum().backward()
        optimizer.step()
    else:
        with torch.no_grad():
            model.train()(x ** 3)
    model.eval()
    assert not torch.allclose(eval_view(model)(x), model(x), atol=1e-4)  # the bare view's cache holds the old fold
    with attack_mode(model) as view:
        torch.testing.assert_close(view(x), model(x), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(view(x), before)
    forget_folded_weights(model)
    torch.testing.assert_close(eval_view(model)(x), model(x), rtol=1e-5, atol=1e-5)


# --- CUDA ---------------------------------------------------------------------------------------------------------


@pytest.fixture()
def deterministic_cudnn():
    previous = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous


@pytest.mark.gpu
@pytest.mark.parametrize("settings, tolerance", [
    (["train=pgd", "train.precision=fp32"], 1e-4),
    (["train=pgd", "train.precision=bf16", "train.channels_last=true"], 2e-2),
    (["train=trades", "train.attack.norm=l2", "train.attack.eps=0.5", "train.precision=fp32"], 1e-4),
], ids=["pgd-fp32", "pgd-bf16-channels-last", "trades-l2-fp32"])
def test_the_captured_step_trains_like_the_eager_step_on_cuda(make_config, deterministic_cudnn, settings, tolerance):
    # 8 steps per epoch, so most are replays (WARMUP_STEPS eager warm-up steps come first); a cosine learning rate.
    common = [*settings, "device=cuda", "train.epochs=2", "data_limit.train=256", "train.schedule.name=cosine",
              "train.attack.steps=3", "train.eval.every=1", "train.eval.subset=32", "train.eval.final_subset=64"]
    eager = train(make_config(*common, "train.cuda_graph=false", run="eager"))
    captured = train(make_config(*common, "train.cuda_graph=true", run="captured"))
    assert captured.summary["cuda_graph"] == "capture" and eager.summary["cuda_graph"] == "eager" and 256 // 32 > WARMUP_STEPS
    # Deterministic cuDNN and the same kernels replayed: equal but for the order of floating-point reductions, which
    # cuDNN may choose differently with the graph's memory pool (fp32: tight); bf16 rounds any such difference coarsely.
    # A stale learning rate or a stale batch-norm fold inside the graph moves weights by ~1e-3.
    for (key, a), b in zip(eager.model.state_dict().items(), captured.model.state_dict().values()):
        torch.testing.assert_close(b.float(), a.float(), rtol=tolerance, atol=tolerance, msg=key)
    for a, b in zip(eager.summary["history"], captured.summary["history"]):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=tolerance, abs=tolerance)
        assert b["train_acc"] == pytest.approx(a["train_acc"], abs=1 / 256 + 1e-9) and b["lr"] == a["lr"]
    # evaluation after replayed epochs (its attack refolds batch norm on entry) sees the same model
    for key in ("clean_accuracy", "robust_accuracy"):
        assert captured.summary[key] == pytest.approx(eager.summary[key], abs=2 / 64 + 1e-9), key


@pytest.mark.gpu
def test_a_step_that_syncs_with_the_host_fails_capture_with_the_reason_or_falls_back():
    device = torch.device("cuda")

    class Syncing(StandardRecipe):
        def forward(self, inputs, labels):
            loss, stats = super().forward(inputs, labels)
            if float(loss) < 0:  # a host sync: not capturable
                raise AssertionError
            return loss, stats

    def make(strict: bool) -> TrainStep:
        torch.manual_seed(0)
        model = build_model("small_cnn", "digits", width=8).to(device)
        recipe = Syncing(model).train()
        optimizer = torch.optim.SGD(recipe.parameters(), lr=0.1, momentum=0.9)
        return TrainStep(recipe, optimizer, device=device, bf16=None, mode="capture", strict=strict)

    x, y = torch.rand(8, 3, 8, 8, device=device), torch.randint(0, 10, (8,), device=device)
    strict = make(True)
    for _ in range(WARMUP_STEPS):
        strict(x, y)
    with pytest.raises(RuntimeError, match="capturing the training step as a CUDA graph failed"):
        strict(x, y)
    lenient = make(False)
    for _ in range(WARMUP_STEPS + 2):
        lenient(x, y)
    assert lenient.mode == "static" and not lenient.captured
    assert float(lenient.sums["loss"]) > 0
