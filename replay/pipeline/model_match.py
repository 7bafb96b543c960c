"""Whether the model to export takes its recorded calls, and what differs when it does not.

torch.export of a model that is not the one its calls were recorded from (3 layers where the
recorded cache holds 2, a wider hidden size) fails deep inside the model, with an error that
names neither ("IndexError: list index out of range"). Before a group is exported, the model
runs once in eager mode on the group's most frequent recorded call (`eager_failure`): when that
fails, torch.export cannot succeed either, the group is not exported, and its error says what
differs where the model's config tells (`differences`): the recorded cache's layer count,
key/value heads or head size against the config's, or a cache longer than the model's
positions, each naming the argument.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from capture.pytree import nodes
from replay.check.checking import first_line
from replay.inputs.exportgroup import ExportGroup

__all__ = ["eager_failure", "differences"]

_LAYER = re.compile(r"^(?P<stack>.*)\.key_cache\[(?P<index>\d+)\]$")
"""A cache leaf holding one layer's keys (``kwargs['past_key_values'].key_cache[3]``; an
encoder-decoder cache's ``....self_attention_cache.key_cache[3]``)."""


def eager_failure(model: Any, group: ExportGroup) -> str | None:
    """Why the model cannot run the group's most frequent recorded call, or None when it can.

    Args:
        model: The eager model to export.
        group: One call group of its recordings.

    Returns:
        None when the eager forward runs; else one line: what differs between the model and
        the recording (`differences`) when its config tells, and the eager error.

    Example:
        >>> eager_failure(tiny_llama(num_hidden_layers=3), inputs.group("decode"))  # doctest: +SKIP
        'the model does not match the recorded calls: past_key_values holds 2 layers in them, ...'
    """
    sizes = group.recorded()[0][0]
    try:
        with nodes.register_flattening_functions(), torch.no_grad():
            args, kwargs = group.recorded_call(sizes)
            model(*args, **kwargs)
    except Exception as e:  # the model cannot take the call: said below, torch.export skipped
        error = f"{type(e).__name__}: {first_line(e)}"
        found = differences(model, group)
        if found:
            return (
                f"the model does not match the recorded calls: {'; '.join(found)} (its eager "
                f"forward fails on them: {error}); export the model they were recorded from"
            )
        return (
            f"the model's eager forward fails on the group's rebuilt recorded call ({error}), "
            "so torch.export was not tried: the call capture rebuilds is not one the model "
            "accepts (values it does not record), or the model is not the recorded one"
        )
    return None


def _text_config(model: Any) -> Any:
    """The config of the model's decoder (a multimodal or encoder-decoder model's text side)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return config
    try:
        return config.get_text_config(decoder=True)
    except TypeError:  # a transformers version whose get_text_config takes no decoder flag
        return config.get_text_config()


def _config_int(config: Any, *names: str) -> tuple[int, str] | None:
    """The first of `names` the config sets to an int, with its name."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value, f"config.{name}"
    return None


def differences(model: Any, group: ExportGroup) -> list[str]:
    """What the model's config says that the group's recorded cache contradicts.

    Each difference names the argument: its layer count, key/value heads or head size in the
    recorded calls against the config's, or the longest recorded cache against the config's
    ``max_position_embeddings``. Empty when the model has no config or the calls no cache.

    Example:
        >>> decode = inputs.group("decode")  # doctest: +SKIP
        >>> differences(tiny_llama(num_hidden_layers=3), decode)[0]  # doctest: +SKIP
        'past_key_values holds 2 layers in the recorded calls, the model has 3 (config.n...)'
    """
    config = _text_config(model)
    if config is None:
        return []
    stacks: dict[tuple[str, str], dict[int, Any]] = {}
    for leaf in group.structure.leaves:
        match = _LAYER.match(leaf.path)
        if match is not None and leaf.argument is not None:
            key = (leaf.argument, match["stack"])
            stacks.setdefault(key, {})[int(match["index"])] = leaf
    if not stacks:
        return []
    signatures = [sizes for sizes, _ in group.recorded()]
    layers = _config_int(config, "num_decoder_layers", "decoder_layers", "num_hidden_layers")
    heads = _config_int(config, "num_key_value_heads", "num_attention_heads")
    attention_heads = _config_int(config, "num_attention_heads")
    hidden = _config_int(config, "hidden_size")
    head_dim = _config_int(config, "head_dim")
    if head_dim is None and hidden is not None and attention_heads:
        head_dim = (hidden[0] // attention_heads[0], f"{hidden[1]} / {attention_heads[1]}")
    positions = _config_int(config, "max_position_embeddings")
    found: list[str] = []
    for argument in dict.fromkeys(argument for argument, _ in stacks):
        # One stack per argument: an encoder-decoder cache's self-attention one (its
        # cross-attention one has the encoder's length and the same layers).
        names = sorted((s for a, s in stacks if a == argument), key=lambda s: "cross" in s)
        by_layer = stacks[(argument, names[0])]
        if layers is not None and len(by_layer) != layers[0]:
            found.append(
                f"{argument} holds {len(by_layer)} layers in the recorded calls, the model has "
                f"{layers[0]} ({layers[1]})"
            )
        leaf = by_layer[min(by_layer)]
        if leaf.rank != 4 or leaf.dim_offset is None:
            continue
        axis = leaf.dim_offset  # (batch, key/value heads, length, head size)
        for expected, offset, what in ((heads, 1, "key/value heads"), (head_dim, 3, "head size")):
            value = int(signatures[0][axis + offset])
            if expected is not None and value != expected[0]:
                found.append(
                    f"{leaf.path} has a {what} of {value} in the recorded calls, the model's "
                    f"{expected[1]} is {expected[0]}"
                )
        longest = max(int(sizes[axis + 2]) for sizes in signatures)
        if positions is not None and longest >= positions[0]:
            found.append(
                f"{argument} reaches a cache length of {longest} in the recorded calls, the "
                f"model has {positions[0]} positions ({positions[1]})"
            )
    return found
