"""`redline chat`: talk to a checkpoint in a prompt loop, replies streamed as they are generated.

The conversation is rendered by the checkpoint's chat template (redline/chat/render.py: an imported model's Jinja
template, or redline's own chat tokens after `redline sft`), and a reply ends at the end of the assistant's turn.
A checkpoint with neither (a pretrained model) gets plain text, each message followed by a newline, which the model
continues. A reply also ends at a --stop string or max_new_tokens. The oldest turns are dropped when the
conversation no longer fits in the context.
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
    max_new_tokens: int | None = None
    """Most tokens per reply (None: 256, or half the model's context where that is shorter)."""
    temperature: float | None = None
    """Sampling temperature (0: greedy). None: the model's generation_config.json (an imported model's), else 0.8."""
    top_k: int | None = None
    """Sample among the k most likely tokens (0: all). None: the model's generation_config.json, else 50."""
    top_p: float | None = None
    """Nucleus sampling threshold (1: off). None: the model's generation_config.json, else 0.95."""
    repetition_penalty: float | None = None
    """> 1 discourages repeating tokens of the conversation (1: off). None: the model's generation_config.json,
    else 1.1."""
    seed: int | None = None
    """Sampling seed (None: different replies each run)."""
    stop: tuple[str, ...] = ("\n\n",)
    """Stop strings that end a reply (the default ends a plain-text reply at a blank line; with a chat template the
    end of the turn ends it, and the default is not applied)."""
    system: str | None = None
    """A system message at the start of the conversation (with a chat template)."""
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
        from redline.inference.sampling import sampling_from

        sampling_from(self, SAMPLING_DEFAULTS)[0].validate()
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


# redline's sampling where neither the command line nor the model's generation_config.json sets it
SAMPLING_DEFAULTS = {"temperature": 0.8, "top_k": 50, "top_p": 0.95, "repetition_penalty": 1.1}
DEFAULT_REPLY_TOKENS = 256


class History:
    """The conversation as (message, reply) turns, rendered by the chat renderer (or as plain text without one) and
    trimmed to fit the context."""

    def __init__(self, tokenizer, budget: int, prepend_eot: bool, renderer=None, system: str | None = None):
        self.tokenizer, self.budget, self.prepend_eot = tokenizer, budget, prepend_eot
        self.renderer, self.system = renderer, system
        self.turns: list[tuple[str, str]] = []

    def render(self, turns: list[tuple[str, str]], message: str) -> str:
        return "".join(f"{m}\n{r}\n" for m, r in turns) + f"{message}\n"

    def messages(self, turns: list[tuple[str, str]], message: str) -> list[dict]:
        out = [{"role": "system", "content": self.system}] if self.system else []
        for m, r in turns:
            out += [{"role": "user", "content": m}, {"role": "assistant", "content": r or " "}]
        return out + [{"role": "user", "content": message}]

    def _ids(self, turns: list[tuple[str, str]], message: str) -> list[int]:
        if self.renderer is not None:
            return self.renderer.prompt(self.messages(turns, message))
        head = [self.tokenizer.eot_id] if self.prepend_eot else []
        return head + self.tokenizer.encode(self.render(turns, message))

    def prompt_ids(self, message: str) -> tuple[list[int], int, bool]:
        """Token ids for the next reply: (ids, turns dropped, message cut). Oldest turns go first."""
        dropped = 0
        while True:
            ids = self._ids(self.turns[dropped:], message)
            if len(ids) <= self.budget or dropped == len(self.turns):
                break
            dropped += 1
        self.turns = self.turns[dropped:]
        if len(ids) > self.budget:  # the message alone is too long: keep its end
            return ids[-self.budget:], dropped, True
        return ids, dropped, False


def chat_renderer(tokenizer):
    """The tokenizer's chat renderer, or None when it has no chat template and no chat tokens (plain text)."""
    from redline.chat.render import renderer_for

    if not (getattr(tokenizer, "chat_template", None) or tokenizer.chat_token_ids):
        return None
    return renderer_for(tokenizer)


def main(argv: list[str]) -> int:
    from redline.config import parse
    from redline.inference.runtime import checkpoint_sampling, expand_bool_flags, load_generator

    argv = expand_bool_flags(argv, ("prepend-eot",))
    cfg = parse(ChatConfig, argv, prog="redline chat", description=__doc__.strip(), default=ChatConfig())
    generator, _ = load_generator(cfg.checkpoint, cfg.tokenizer, cfg.runtime)
    ctx = generator.engine.cfg.context_len
    if cfg.max_new_tokens is None:  # a small model's context (tiny's 256) keeps half for the conversation
        cfg.max_new_tokens = min(DEFAULT_REPLY_TOKENS, ctx // 2)
    if cfg.max_new_tokens >= ctx:
        from redline.errors import UserError

        raise UserError(f"max_new_tokens={cfg.max_new_tokens} leaves no room for the conversation in the model's "
                        f"context_len {ctx}; lower it")
    renderer = chat_renderer(generator.tokenizer)
    history = History(generator.tokenizer, ctx - cfg.max_new_tokens, cfg.prepend_eot, renderer, cfg.system)
    stop_strings = cfg.stop if renderer is None or cfg.stop != ChatConfig.stop else ()
    stop_tokens = None if renderer is None else [*renderer.stop_ids, generator.tokenizer.eot_id]
    sampling = checkpoint_sampling(cfg, SAMPLING_DEFAULTS, "redline chat")
    interactive = sys.stdin.isatty()
    if interactive:
        how = f"{renderer.name} chat template" if renderer is not None else "plain text (no chat template)"
        print(f"redline chat: {cfg.checkpoint} (context {ctx} tokens, {generator.engine.describe()['device']}). "
              f"{how}. /reset forgets, /exit leaves.", file=sys.stderr)
    if hasattr(sys.stdin, "reconfigure"):  # bytes that are not UTF-8 read as U+FFFD, not an error mid-conversation
        sys.stdin.reconfigure(errors="replace")
    while True:
        try:
            message = input(cfg.prompt_marker if interactive else "")
        except EOFError:
            break
        # bytes that are not UTF-8 reach Python as lone surrogates, which no tokenizer takes: as U+FFFD instead
        message = message.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
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
            [message], cfg.max_new_tokens, sampling, stop_strings=stop_strings,
            on_text=lambda row, text: print(text, end="", flush=True), encoded=[(ids, cut)], stop_tokens=stop_tokens,
        )[0]
        print(flush=True)
        history.turns.append((message, completion.text))
    return 0
