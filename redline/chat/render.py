"""Conversations into token ids and a loss mask: the one renderer of `sft`, `dpo`, `grpo`, `chat`, `generate --chat`.

    renderer = renderer_for(tokenizer)                     # the tokenizer's Jinja template, else redline's own
    out = renderer.render(messages)                        # Rendered(ids, mask): mask on what the model learns
    ids = renderer.prompt(messages)                        # for generation: ends where the assistant's reply starts
    renderer.stop_ids                                      # the tokens that end an assistant turn

The mask is True on the tokens of assistant messages and on the token that ends each assistant turn, and on
nothing else (system and user tokens, role headers and the generation prompt are context, never targets). The
mask is aligned with `ids`: mask[i] says whether ids[i] is a token the model should learn to produce, so a
training example predicts ids[1:] from ids[:-1] with the loss on mask[1:] (`training_example`).

Two templates:
- redline's own (`RedlineTemplate`), for tokenizers redline made (bytes, gpt2, a BPE): four special tokens are
  appended after the vocabulary (`Tokenizer.add_chat_tokens`; the model's embedding grows with them, see
  `resize_vocab`), and a conversation is
      <|endoftext|> <|system|> text <|end|> <|user|> text <|end|> <|assistant|> text <|end|> ...
  built from ids, never from text, so no message can forge a turn boundary.
- an imported model's Jinja chat template (`JinjaRenderer`), rendered as transformers' `apply_chat_template`
  renders it (redline/chat/template.py) and tokenized as it tokenizes the rendering (special tokens written in
  the text are those tokens, nothing added), so ids and text are the same as transformers'. The assistant spans
  come from the template's `{% generation %}` blocks where it has them; otherwise each assistant message's text is
  found in the rendering after the prompt that precedes it (the conversation up to it with the generation prompt),
  and the special token right after it (ChatML's <|im_end|>, Llama 3's <|eot_id|>) is the end of its turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redline.errors import UserError

ROLES = ("system", "user", "assistant")
Message = Mapping[str, Any]


@dataclass(frozen=True)
class Rendered:
    """One rendered conversation: token ids and, for each, whether it is a training target."""

    ids: list[int]
    mask: list[bool]

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def trained_tokens(self) -> int:
        return sum(self.mask)


def check_messages(messages: Any, need_assistant: bool = True, where: str = "the conversation") -> list[dict]:
    """Plain {"role", "content"} copies of a conversation, or a one-line UserError naming what is wrong: not a
    list, an unknown role, empty or non-text content, no assistant turn (need_assistant: for training)."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise UserError(f"{where} is not a non-empty list of messages ({{\"role\": ..., \"content\": ...}})")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise UserError(f"{where}: message {i} is not an object with a role and content")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise UserError(f"{where}: message {i} has role {role!r}; use one of {', '.join(ROLES)}")
        if not isinstance(content, str) or not content.strip():
            raise UserError(f"{where}: message {i} ({role}) has {'empty' if isinstance(content, str) else 'no text'} "
                            f"content; give it some text")
        out.append({"role": role, "content": content})
    if need_assistant and not any(m["role"] == "assistant" for m in out):
        raise UserError(f"{where} has no assistant message: there is nothing to learn from it; add the reply")
    return out


class RedlineTemplate:
    """redline's own chat format, on a tokenizer with its chat tokens (see the module docstring)."""

    name = "redline"

    def __init__(self, tokenizer):
        chat = tokenizer.chat_token_ids
        if not chat:
            raise UserError("this tokenizer has no chat tokens; add them with tokenizer.add_chat_tokens() (`redline "
                            "sft` does this for a model redline pretrained)")
        self.tokenizer = tokenizer
        self.role_ids = {role: chat[f"<|{role}|>"] for role in ROLES}
        self.end_id = chat["<|end|>"]
        # a reply ends at <|end|>; end-of-text too (a model that emits it has left the conversation's format)
        self.stop_ids = [self.end_id, tokenizer.eot_id]

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> Rendered:
        messages = check_messages(messages, need_assistant=False)
        ids, mask = [self.tokenizer.eot_id], [False]  # a conversation starts as a pretraining document does
        for message in messages:
            content = self.tokenizer.encode(message["content"])
            learn = message["role"] == "assistant"
            ids += [self.role_ids[message["role"]], *content, self.end_id]
            mask += [False] + [learn] * len(content) + [learn]
        if add_generation_prompt:
            ids.append(self.role_ids["assistant"])
            mask.append(False)
        return Rendered(ids, mask)

    def prompt(self, messages: Sequence[Message]) -> list[int]:
        return self.render(messages, add_generation_prompt=True).ids


class JinjaRenderer:
    """An imported tokenizer's Jinja chat template (see the module docstring)."""

    name = "jinja"

    def __init__(self, tokenizer, template=None):
        from redline.chat.template import template_for

        if not hasattr(tokenizer, "encode_with_specials_offsets"):
            raise UserError("a Jinja chat template needs a Hugging Face tokenizer (tokenizer.json); this one is "
                            f"{tokenizer.name}")
        self.tokenizer = tokenizer
        self.template = template or template_for(tokenizer)
        self.stop_ids = list(tokenizer.stop_ids)
        self._specials = sorted(self._special_strings(), key=len, reverse=True)

    def _special_strings(self) -> list[str]:
        import json

        data = json.loads(self.tokenizer.hf.to_str())
        return [t["content"] for t in data.get("added_tokens", []) if t.get("special")]

    def text(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        return self.template.render(messages, add_generation_prompt=add_generation_prompt)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> Rendered:
        messages = check_messages(messages, need_assistant=False)
        text, spans = self.template.render_with_generation_spans(messages, add_generation_prompt)
        if not spans:
            spans = self._assistant_spans(messages, text)
        ids, offsets = self.tokenizer.encode_with_specials_offsets(text)
        mask = [any(start <= s < end for start, end in spans) for s, _ in offsets]
        return Rendered(ids, mask)

    def prompt(self, messages: Sequence[Message]) -> list[int]:
        return self.tokenizer.encode_with_specials(self.text(messages, add_generation_prompt=True))

    def _assistant_spans(self, messages: list[dict], text: str) -> list[tuple[int, int]]:
        """Character spans of each assistant message's text and the special token that ends its turn."""
        spans, cursor = [], 0
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prefix = self.text(messages[:i], add_generation_prompt=True) if i else ""
            start = len(prefix) if text.startswith(prefix) else cursor
            content = message["content"].strip()
            found = text.find(content, max(start, cursor))
            if found < 0:
                raise UserError(f"cannot find assistant message {i} in the chat template's rendering (the template "
                                f"rewrites it); use a template with {{% generation %}} blocks")
            end = found + len(content)
            rest = text[end:]
            gap = len(rest) - len(rest.lstrip(" \t\n"))
            for special in self._specials:  # the turn's end token: the first special token after the text
                if rest.startswith(special, gap):
                    end += gap + len(special)
                    break
            spans.append((found, end))
            cursor = end
        return spans


def renderer_for(tokenizer, template: str = "auto"):
    """The renderer of a tokenizer. template: auto (its Jinja chat template if it carries one, else redline's own
    when it has redline's chat tokens), jinja, or redline."""
    if template not in ("auto", "jinja", "redline"):
        raise UserError(f"unknown chat template {template!r}; use auto, jinja or redline")
    if template == "jinja" or (template == "auto" and getattr(tokenizer, "chat_template", None)):
        return JinjaRenderer(tokenizer)
    if template == "redline" or tokenizer.chat_token_ids:
        return RedlineTemplate(tokenizer)
    raise UserError("this checkpoint's tokenizer has no chat template and no chat tokens, so it cannot render a "
                    "conversation; fine-tune it with `redline sft` first (which adds redline's chat tokens), or use a "
                    "model imported with a chat template")


def training_example(rendered: Rendered) -> tuple[list[int], list[int]]:
    """(inputs, targets) of one conversation: targets are the next token where it is trained on, else -1."""
    ids, mask = rendered.ids, rendered.mask
    return ids[:-1], [t if m else -1 for t, m in zip(ids[1:], mask[1:])]


def resize_vocab(model, vocab_size: int):
    """A model whose embedding and head have `vocab_size` rows (padded as its config says), the old rows copied and
    the new token rows set to the mean of the old ones (a neutral start for added tokens, as transformers'
    `resize_token_embeddings` does by default); the model itself when its vocabulary already fits."""
    import dataclasses

    import torch

    from redline.model import GPT

    old = model.cfg.vocab_size
    if vocab_size <= old:
        return model
    if model.cfg.head_vocab:  # the added ids would lie past the head: the model could never end a turn with them
        raise UserError(f"model.head_vocab={model.cfg.head_vocab}: the tokens this adds (ids from {old}) would lie "
                        f"past the model's head, which could never predict them; use a chat template of the model's "
                        f"own tokens")
    cfg = dataclasses.replace(model.cfg, vocab_size=vocab_size)
    device = next(model.parameters()).device
    with torch.device(device):
        grown = GPT(cfg)
    state = model.state_dict()
    with torch.no_grad():
        for name in ("wte.weight", "lm_head.weight"):
            weight = state.pop(name)  # (old padded vocab, C)
            mean = weight[:old].mean(0)
            target = grown.get_parameter(name)
            target[:weight.shape[0]].copy_(weight)
            target[old:vocab_size].copy_(mean)
        grown.load_state_dict(state, strict=False)
    return grown.to(next(model.parameters()).dtype)
