"""Real architectures' parameter shapes, built with torch.nn on the meta device: no memory, no download."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ...hooks.traffic import Shape
from .byte_rules import parameter_shapes

__all__ = ["ARCHITECTURES", "architectures"]


def _resnet(blocks: Sequence[int], bottleneck: bool, classes: int = 1000) -> nn.Module:
    """torchvision's ResNet layout (He et al. 2016): the same parameter shapes, in the same order."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)]
    inplanes, expansion = 64, 4 if bottleneck else 1
    for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), blocks)):
        for block in range(count):
            stride, out = (2 if stage and not block else 1), planes * expansion
            if bottleneck:
                convs = [(inplanes, planes, 1, 1), (planes, planes, 3, stride), (planes, out, 1, 1)]
            else:
                convs = [(inplanes, planes, 3, stride), (planes, planes, 3, 1)]
            for c_in, c_out, k, s in convs:
                layers += [nn.Conv2d(c_in, c_out, k, s, k // 2, bias=False), nn.BatchNorm2d(c_out)]
            if stride != 1 or inplanes != out:
                layers += [nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out)]
            inplanes = out
    layers.append(nn.Linear(inplanes, classes))
    return nn.ModuleList(layers)


def _embedding(rows: int, width: int) -> nn.Embedding:
    """An embedding with an uninitialised weight: shapes are all the model needs (normal_ on meta is slow)."""
    return nn.Embedding(rows, width, _weight=torch.empty(rows, width))


def _transformer(vocab: int, positions: int, types: int, width: int, depth: int, qkv_packed: bool,
                 pooler: bool) -> nn.Module:  # fmt: skip
    """BERT's and GPT-2's parameter shapes: embeddings, depth x (attention, MLP, two LayerNorms)."""
    layers: list[nn.Module] = [_embedding(vocab, width), _embedding(positions, width)]
    if types:
        layers += [_embedding(types, width), nn.LayerNorm(width)]
    for _ in range(depth):
        attention = [nn.Linear(width, 3 * width)] if qkv_packed else [nn.Linear(width, width) for _ in range(3)]
        layers += [*attention, nn.Linear(width, width), nn.LayerNorm(width)]
        layers += [nn.Linear(width, 4 * width), nn.Linear(4 * width, width), nn.LayerNorm(width)]
    layers.append(nn.Linear(width, width) if pooler else nn.LayerNorm(width))
    return nn.ModuleList(layers)


#: name -> (builder, what it stands for)
ARCHITECTURES: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "ResNet-18": (lambda: _resnet((2, 2, 2, 2), False), "torchvision resnet18, 1000 classes"),
    "ResNet-50": (lambda: _resnet((3, 4, 6, 3), True), "torchvision resnet50, 1000 classes"),
    "BERT-base": (
        lambda: _transformer(30522, 512, 2, 768, 12, qkv_packed=False, pooler=True),
        "BERT-base uncased encoder with pooler (Devlin et al. 2019)",
    ),
    "GPT-2 small": (
        lambda: _transformer(50257, 1024, 0, 768, 12, qkv_packed=True, pooler=False),
        "GPT-2 124M, output layer tied to the token embedding (Radford et al. 2019); nn.Linear's (out, in) "
        "layout where GPT-2 uses (in, out), which changes no byte count except int8's per-row scales",
    ),
}


def architectures(include_lab_models: bool = True) -> dict[str, list[Shape]]:
    """Parameter shapes of real models, built with torch.nn on the meta device; the lab's models first."""
    out: dict[str, list[Shape]] = {}
    if include_lab_models:
        from ...engine.models import build_task

        for name in ("mlp", "cnn"):
            out[f"digits {name.upper()} (this lab)"] = parameter_shapes(build_task(name, 0).model)
    with torch.device("meta"):
        for name, (build, _) in ARCHITECTURES.items():
            out[name] = parameter_shapes(build())
    return out
