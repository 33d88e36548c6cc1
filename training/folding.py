"""Batch norm folded into the preceding convolution, for the eval-mode forward passes of attacks.

In eval mode a ``Conv2d`` followed by a ``BatchNorm2d`` is one affine map of the convolution's
output: ``gamma * (conv(x) + b - mean) / sqrt(var + eps) + beta``, i.e. a convolution with weight
``W * s`` and bias ``(b - mean) * s + beta``, where ``s = gamma / sqrt(var + eps)`` (the folding of
Jacob et al. 2018, section 3.2, and of ``torch.fx.experimental.optimization.fuse``). PGD, TRADES and
MART attack the model in eval mode for every step of every batch; on the folded network each step
skips the batch norm's forward and backward passes (about 7% of an attack step for the CIFAR ResNet18
on a CPU; fewer kernel launches on a GPU) and computes the same function up to float rounding.

Unlike ``torch.fx.experimental.optimization.fuse``, which copies the model and folds its weights
once, :func:`eval_view` shares the live parameters, so one view serves a whole training run. Its
folded weights are cached until a source tensor's version counter moves. Some in-place updates move
none (batch norm's running-statistics update, SGD's fused kernel, CUDA graph replays), so
:func:`training.attacks.attack_mode` drops the cache on entry (:func:`forget_folded_weights`): each
attack folds the model as it is then. The view is for gradients with respect to the *input* (attacks): its folded weights
are computed without autograd, so no gradient reaches the folded convolutions and batch norms
through it (layers left as they are, such as the final linear layer, are the model's own).

Models that ``torch.fx`` cannot trace, or without a ``Conv2d`` -> ``BatchNorm2d`` pair, are returned
unchanged. Only pairs whose convolution output feeds nothing but the batch norm are folded.
"""
from __future__ import annotations

import weakref

import torch
from torch import Tensor, fx, nn

from invert.validation import check_images

from .models import Classifier


class FoldedConvBatchNorm(nn.Module):
    """``bn(conv(x))`` for an eval-mode ``bn``, computed as one convolution with folded weights.

    ``conv`` and ``bn`` are the model's own modules (shared, not copied); the folded weight and bias
    are cached until one of their source tensors changes.
    """

    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d):
        super().__init__()
        if not isinstance(conv, nn.Conv2d) or not _foldable(bn):
            raise TypeError(f"need an nn.Conv2d and an nn.BatchNorm2d with running statistics, got {type(conv).__name__} and "
                            f"{type(bn).__name__} (track_running_stats=False batch norms always use batch statistics)")
        if bn.num_features != conv.out_channels:
            raise ValueError(f"the batch norm has {bn.num_features} channels but the convolution outputs {conv.out_channels}")
        self.conv, self.bn = conv, bn
        self._key: tuple | None = None
        self._folded: tuple[Tensor, Tensor] | None = None

    def _sources(self) -> list[Tensor]:
        conv, bn = self.conv, self.bn
        tensors = [conv.weight, bn.running_mean, bn.running_var]
        return tensors + [t for t in (conv.bias, bn.weight, bn.bias) if t is not None]

    def folded(self) -> tuple[Tensor, Tensor]:
        """The folded (weight, bias), recomputed after any in-place update of the sources (under
        ``torch.compile``, on every call: the compiler traces the arithmetic, not the cache)."""
        if torch.compiler.is_compiling():
            return self._fold()
        key = tuple((t.data_ptr(), t._version, t.dtype) for t in self._sources())
        if key != self._key:
            self._folded, self._key = self._fold(), key
        return self._folded

    def forget(self) -> None:
        """Drop the cached folded weights: the next call refolds (after in-place updates that bump no version counter)."""
        self._key = self._folded = None

    def _fold(self) -> tuple[Tensor, Tensor]:
        conv, bn = self.conv, self.bn
        dtype = torch.promote_types(conv.weight.dtype, torch.float32)  # fold bf16/fp16 weights in fp32
        with torch.no_grad():
            scale = torch.rsqrt(bn.running_var.to(dtype) + bn.eps)
            if bn.weight is not None:
                scale = scale * bn.weight.to(dtype)
            bias = -bn.running_mean.to(dtype) * scale
            if conv.bias is not None:
                bias = bias + conv.bias.to(dtype) * scale
            if bn.bias is not None:
                bias = bias + bn.bias.to(dtype)
            weight = conv.weight.to(dtype) * scale.view(-1, 1, 1, 1)
            # Keep the convolution's dtype and memory format (channels-last kernels stay channels-last).
            channels_last = conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
            layout = torch.channels_last if channels_last else torch.contiguous_format
            return weight.to(conv.weight.dtype).contiguous(memory_format=layout), bias.to(conv.weight.dtype)

    def forward(self, x: Tensor) -> Tensor:
        if self.bn.training:
            raise RuntimeError("FoldedConvBatchNorm computes eval-mode batch norm; put the model in eval mode first")
        weight, bias = self.folded()
        return self.conv._conv_forward(x, weight, bias)


def _foldable(bn: nn.Module) -> bool:
    return isinstance(bn, nn.BatchNorm2d) and bn.track_running_stats and bn.running_mean is not None


def _check_module(module) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"expected a torch.nn.Module (a model), got {type(module).__name__}")


def fold_batch_norms(module: nn.Module) -> tuple[nn.Module, int]:
    """An FX rewrite of ``module`` with every foldable Conv2d -> BatchNorm2d pair replaced by a
    :class:`FoldedConvBatchNorm` (sharing the original modules), and the number of pairs folded.
    Returns ``(module, 0)`` unchanged when the module cannot be traced or has nothing to fold."""
    _check_module(module)
    try:
        graph_module = fx.symbolic_trace(module)
    except Exception:  # data-dependent control flow, unsupported ops: run the model as it is
        return module, 0
    modules = dict(graph_module.named_modules())
    folded = 0
    for node in list(graph_module.graph.nodes):
        if node.op != "call_module" or not _foldable(modules.get(node.target)):
            continue
        source = node.args[0] if node.args else None
        if not (isinstance(source, fx.Node) and source.op == "call_module" and isinstance(modules.get(source.target), nn.Conv2d)):
            continue
        if len(source.users) != 1:  # the raw convolution output is used elsewhere too
            continue
        name = f"folded_{folded}"
        graph_module.add_submodule(name, FoldedConvBatchNorm(modules[source.target], modules[node.target]))
        with graph_module.graph.inserting_before(node):
            replacement = graph_module.graph.call_module(name, source.args, source.kwargs)
        node.replace_all_uses_with(replacement)
        graph_module.graph.erase_node(node)
        graph_module.graph.erase_node(source)
        folded += 1
    if not folded:
        return module, 0
    graph_module.graph.lint()
    graph_module.recompile()
    return graph_module, folded


class FoldedClassifier(nn.Module):
    """A :class:`~training.models.Classifier`'s eval-mode function with batch norm folded (see the
    module docstring). Takes [0, 1] images like the classifier; the classifier must be in eval mode."""

    def __init__(self, model: Classifier):
        super().__init__()
        if not isinstance(model, Classifier):
            raise TypeError(f"FoldedClassifier needs a training.models.Classifier (build_model(...)), got {type(model).__name__}; "
                            "fold_batch_norms(module) folds any traceable module")
        self.normalize = model.normalize
        self.net, self.folded_pairs = fold_batch_norms(model.net)

    def forward(self, x: Tensor) -> Tensor:
        check_images(x, "model input", channels=3)  # skipped inside hot_loop(), like Classifier's
        return self.net(self.normalize(x))


# One view per model, dropped with the model. Values never reference their key (a view holds the
# model's submodules, not the model; an unfoldable model is marked, not stored), or it would never be freed.
_VIEWS: "weakref.WeakKeyDictionary[nn.Module, object]" = weakref.WeakKeyDictionary()
_UNFOLDED = object()


def eval_view(model: nn.Module) -> nn.Module:
    """The module to attack when ``model`` is in eval mode: its folded view when ``model`` is a
    :class:`Classifier` with foldable pairs, else ``model`` itself. Cached per model.

    A Classifier subclass with a ``forward`` of its own (such as ``InputQuantised``) is attacked as it is: the
    view computes ``net(normalize(x))`` and would drop what that forward adds."""
    _check_module(model)
    view = _VIEWS.get(model)
    if view is None:
        plain = isinstance(model, Classifier) and type(model).forward is Classifier.forward
        view = FoldedClassifier(model) if plain else None
        view = view if view is not None and view.folded_pairs else _UNFOLDED
        _VIEWS[model] = view
    return model if view is _UNFOLDED else view


def forget_folded_weights(model: nn.Module) -> None:
    """Make ``model``'s eval view (if it has one) refold its weights on its next call (see :meth:`FoldedConvBatchNorm.forget`)."""
    view = _VIEWS.get(model)
    if isinstance(view, nn.Module):
        for module in view.modules():
            if isinstance(module, FoldedConvBatchNorm):
                module.forget()


__all__ = ["FoldedClassifier", "FoldedConvBatchNorm", "eval_view", "fold_batch_norms", "forget_folded_weights"]
