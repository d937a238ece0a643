"""Incremental detokenization with stop strings, and chat-template prompts."""

from __future__ import annotations

from dataclasses import dataclass

from foretell.errors import ForetellError

# End-of-turn markers used by chat models whose config names only the end-of-text token.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "</s>")


def stop_token_ids(tokenizer, config_eos: tuple[int, ...]) -> set[int]:
    ids = set(config_eos)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    vocab = tokenizer.get_vocab()
    special = set(getattr(tokenizer, "all_special_tokens", []))
    for t in END_OF_TURN_TOKENS:
        if t in vocab and t in special | set(getattr(tokenizer, "added_tokens_encoder", {})):
            ids.add(vocab[t])
    return ids


def encode_prompt(tokenizer, prompt: str | list[dict], chat: bool) -> list[int]:
    """Token ids for a raw prompt, or for chat messages through the model's chat template."""
    if isinstance(prompt, list) or chat:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        if not getattr(tokenizer, "chat_template", None):
            raise ForetellError("this model's tokenizer has no chat template; pass --no-chat for a raw prompt")
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = prompt
    # The template already holds the special tokens; adding them again would double the BOS.
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ForetellError("the prompt is empty")
    return ids


@dataclass
class TextStream:
    """Turns a growing token list into text deltas, holding back what a stop string may still claim."""

    tokenizer: object
    stop: tuple[str, ...] = ()
    emitted: int = 0  # characters already handed out
    text: str = ""
    stopped: bool = False

    def update(self, tokens: list[int]) -> str:
        full = self.tokenizer.decode(tokens, skip_special_tokens=True)
        for s in self.stop:
            at = full.find(s)
            if at != -1:
                full, self.stopped = full[:at], True
        self.text = full
        end = len(full)
        if not self.stopped:
            if full.endswith("\ufffd"):  # an incomplete multi-byte character
                end -= 1
            end -= max((_partial_stop(full, s) for s in self.stop), default=0)
        delta = full[self.emitted : max(end, self.emitted)]
        self.emitted += len(delta)
        return delta

    def flush(self) -> str:
        delta = self.text[self.emitted :]
        self.emitted = len(self.text)
        return delta


def _partial_stop(text: str, stop: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of stop."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
