"""`redline chat`: talk to a checkpoint in a prompt loop, replies streamed as they are generated.

A model with a chat template (an imported one: tokenizer_config.json's) gets the conversation rendered by it, as
transformers' apply_chat_template renders it, and a reply ends at the model's stop tokens (its EOS ids). Without
one the conversation is plain text, each message followed by a newline, and a reply also ends at a blank line.
Either way a --stop string or max_new_tokens ends it too. The oldest turns are dropped when the conversation no
longer fits in the context.
Commands: /reset forgets the conversation, /exit (or Ctrl-D) leaves.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import tyro

from redline.inference.runtime import RuntimeOptions


@dataclass
class ChatConfig:
    checkpoint: str | None = None
    """A checkpoint folder or a run directory (its newest checkpoint). Required."""
    max_new_tokens: int = 256
    """Most tokens per reply."""
    temperature: float = 0.8
    """Sampling temperature (0: greedy)."""
    top_k: int | None = 50
    """Sample among the k most likely tokens (None or 0: all)."""
    top_p: float = 0.95
    """Nucleus sampling threshold (1: off)."""
    repetition_penalty: float = 1.1
    """> 1 discourages repeating tokens of the conversation (1: off)."""
    seed: int | None = None
    """Sampling seed (None: different replies each run)."""
    stop: tuple[str, ...] | None = None
    """Stop strings that end a reply (None: a blank line for a plain-text conversation, none with a chat template)."""
    prepend_eot: bool = True
    """Plain text only: start the conversation with the end-of-text token, as training documents do."""
    prompt_marker: str = "> "
    """Printed before each of your messages (when stdin is a terminal)."""
    tokenizer: str | None = None
    """Tokenizer override; it must be the checkpoint's own."""
    runtime: tyro.conf.OmitArgPrefixes[RuntimeOptions] = field(default_factory=RuntimeOptions)
    """Device, precision, compilation and CUDA graphs."""

    def validate(self) -> None:
        from redline.errors import UserError
        from redline.inference.sampling import SamplingParams

        SamplingParams(self.temperature, self.top_k, self.top_p, self.repetition_penalty, self.seed).validate()
        if self.max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


class History:
    """The conversation as (message, reply) turns, rendered with the tokenizer's chat template (or as plain text
    where it has none) and trimmed to fit the context."""

    def __init__(self, tokenizer, budget: int, prepend_eot: bool):
        from redline.chat import template_for

        self.tokenizer, self.budget, self.prepend_eot = tokenizer, budget, prepend_eot
        self.template = template_for(tokenizer) if getattr(tokenizer, "chat_template", None) else None
        self.turns: list[tuple[str, str]] = []

    def render(self, turns: list[tuple[str, str]], message: str) -> str:
        return "".join(f"{m}\n{r}\n" for m, r in turns) + f"{message}\n"

    def encode(self, turns: list[tuple[str, str]], message: str) -> list[int]:
        if self.template is None:
            head = [self.tokenizer.eot_id] if self.prepend_eot else []
            return head + self.tokenizer.encode(self.render(turns, message))
        messages = [{"role": role, "content": text} for m, r in turns for role, text in (("user", m), ("assistant", r))]
        text = self.template.render([*messages, {"role": "user", "content": message}], add_generation_prompt=True)
        return self.tokenizer.encode_with_specials(text)  # special tokens written by the template are those tokens

    def prompt_ids(self, message: str) -> tuple[list[int], int, bool]:
        """Token ids for the next reply: (ids, turns dropped, message cut). Oldest turns go first."""
        dropped = 0
        while True:
            ids = self.encode(self.turns[dropped:], message)
            if len(ids) <= self.budget or dropped == len(self.turns):
                break
            dropped += 1
        self.turns = self.turns[dropped:]
        if len(ids) > self.budget:  # the message alone is too long: keep its end
            return ids[-self.budget:], dropped, True
        return ids, dropped, False


def main(argv: list[str]) -> int:
    from redline.config import parse
    from redline.inference.runtime import expand_bool_flags, load_generator
    from redline.inference.sampling import SamplingParams

    argv, bare = expand_bool_flags(argv, ("prepend-eot",))
    cfg = parse(ChatConfig, argv, prog="redline chat", description=__doc__.strip(), default=ChatConfig(),
                bare_flags=bare)
    generator, _ = load_generator(cfg.checkpoint, cfg.tokenizer, cfg.runtime)
    ctx = generator.engine.cfg.context_len
    if cfg.max_new_tokens >= ctx:
        from redline.errors import UserError

        raise UserError(f"max_new_tokens={cfg.max_new_tokens} leaves no room for the conversation in the model's "
                        f"context_len {ctx}; lower it")
    history = History(generator.tokenizer, ctx - cfg.max_new_tokens, cfg.prepend_eot)
    sampling = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p, cfg.repetition_penalty, cfg.seed)
    stop = cfg.stop if cfg.stop is not None else (() if history.template else ("\n\n",))
    interactive = sys.stdin.isatty()
    if interactive:
        mode = "The model's chat template" if history.template else "Plain text (the model has no chat template)"
        print(f"redline chat: {cfg.checkpoint} (context {ctx} tokens, {generator.engine.describe()['device']}). "
              f"{mode}. /reset forgets, /exit leaves.", file=sys.stderr)
    while True:
        try:
            message = input(cfg.prompt_marker if interactive else "")
        except EOFError:
            break
        if message.strip() in ("/exit", "/quit"):
            break
        if message.strip() == "/reset":
            history.turns = []
            print("(conversation forgotten)", file=sys.stderr)
            continue
        if not message.strip():
            continue
        ids, dropped, cut = history.prompt_ids(message)
        if dropped:
            print(f"(dropped the {dropped} oldest turn(s) to fit the context)", file=sys.stderr)
        if cut:
            print("(your message is longer than the context; only its end was kept)", file=sys.stderr)
        completion = generator.generate(
            [message], cfg.max_new_tokens, sampling, stop_strings=stop,
            on_text=lambda row, text: print(text, end="", flush=True), encoded=[(ids, cut)],
        )[0]
        print(flush=True)
        history.turns.append((message, completion.text))
    return 0
