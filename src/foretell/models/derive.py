"""Smaller models derived from a target, sharing its tokenizer (a draft where no family member exists)."""

from __future__ import annotations

from dataclasses import replace

from foretell.models.transformer import Transformer


def truncated_copy(target: Transformer, num_layers: int) -> Transformer:
    """The target's embedding, first `num_layers` decoder layers, final norm and output layer."""
    if not 1 <= num_layers <= target.config.num_hidden_layers:
        raise ValueError(f"num_layers must be in 1..{target.config.num_hidden_layers}, got {num_layers}")
    config = replace(target.config, num_hidden_layers=num_layers)
    draft = Transformer(config).to(device=target.device, dtype=target.dtype)
    keep = {k: v for k, v in target.state_dict().items() if not k.startswith("layers.") or int(k.split(".")[1]) < num_layers}
    draft.load_state_dict(keep, strict=not config.tie_word_embeddings)
    if config.tie_word_embeddings:
        draft.lm_head.weight = draft.embed_tokens.weight
    return draft.eval().requires_grad_(False)
