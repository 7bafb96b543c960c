"""The operator census's diffusers models (`tools/op_census.py`): tiny UNet, transformer and VAE
blocks with the inputs a pipeline passes them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Make = Callable[[], tuple[Any, dict[str, Any]]]


def _model(name: str, **config: Any) -> Any:
    """A diffusers model class built from `config`, in eval mode."""
    import diffusers

    return getattr(diffusers, name)(**config).eval()


def _unet() -> tuple[Any, dict[str, Any]]:
    import torch

    model = _model(
        "UNet2DConditionModel",
        sample_size=16,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=16,
    )
    return model, {
        "sample": torch.randn(1, 4, 16, 16),
        "timestep": torch.tensor([10]),
        "encoder_hidden_states": torch.randn(1, 7, 32),
    }


def _vae() -> tuple[Any, dict[str, Any]]:
    import torch

    model = _model(
        "AutoencoderKL",
        block_out_channels=(32, 64),
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        norm_num_groups=16,
    )
    return model, {"sample": torch.randn(1, 3, 32, 32)}


def _sd3() -> tuple[Any, dict[str, Any]]:
    import torch

    model = _model(
        "SD3Transformer2DModel",
        sample_size=16,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=32,
        caption_projection_dim=32,
        pooled_projection_dim=16,
        out_channels=4,
        pos_embed_max_size=32,
    )
    return model, {
        "hidden_states": torch.randn(1, 4, 16, 16),
        "encoder_hidden_states": torch.randn(1, 7, 32),
        "pooled_projections": torch.randn(1, 16),
        "timestep": torch.tensor([10]),
    }


def _flux() -> tuple[Any, dict[str, Any]]:
    import torch

    model = _model(
        "FluxTransformer2DModel",
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=16,
        axes_dims_rope=(4, 6, 6),
    )
    return model, {
        "hidden_states": torch.randn(1, 64, 16),
        "encoder_hidden_states": torch.randn(1, 7, 32),
        "pooled_projections": torch.randn(1, 16),
        "timestep": torch.tensor([0.5]),
        "img_ids": torch.zeros(64, 3),
        "txt_ids": torch.zeros(7, 3),
    }


def _dit() -> tuple[Any, dict[str, Any]]:
    import torch

    model = _model(
        "DiTTransformer2DModel",
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        num_layers=2,
        sample_size=8,
        patch_size=2,
        num_embeds_ada_norm=10,
    )
    return model, {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "timestep": torch.tensor([3]),
        "class_labels": torch.tensor([1]),
    }


def diffusers_jobs() -> list[tuple[str, Make]]:
    """``(name, make)`` of every diffusers model of the census."""
    return [
        ("diffusers:UNet2DConditionModel", _unet),
        ("diffusers:AutoencoderKL", _vae),
        ("diffusers:SD3Transformer2DModel", _sd3),
        ("diffusers:FluxTransformer2DModel", _flux),
        ("diffusers:DiTTransformer2DModel", _dit),
    ]
