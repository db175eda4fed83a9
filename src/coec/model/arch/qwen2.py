"""Qwen2: the common layout with q/k/v biases always present (sliced with their rows), no o_proj
or MLP bias slot, an explicit head_dim."""

from __future__ import annotations

from coec.model.arch.base import Adapter


class Qwen2Adapter(Adapter):
    families = ("qwen2",)
    model_type = "qwen2"
    qkv_bias = "always"
    note = "q/k/v biases, explicit head_dim"
