"""Jinja chat templates, rendered as transformers' `apply_chat_template` renders them.

A model's chat template (tokenizer_config.json's `chat_template`, or chat_template.jinja) is a Jinja program that
turns a list of messages into the model's prompt text. It is untrusted code from a model repository, so it runs in
jinja2's immutable sandbox, with exactly the environment transformers gives it, so that the same messages give the
same text:
- `trim_blocks` and `lstrip_blocks` on, the `loopcontrols` extension (break / continue), and the
  `{% generation %}...{% endgeneration %}` block that marks the assistant's part of a rendering;
- `tojson` that does not escape HTML and takes `indent`, `separators`, `sort_keys` and `ensure_ascii`;
- the globals `raise_exception(message)` (the template refuses a conversation), `strftime_now(format)` (today's
  date, which Llama 3.x templates print), `dict` and a `namespace` that refuses underscore names;
- the variables `messages`, `tools`, `documents`, `add_generation_prompt`, the tokenizer's special tokens
  (`bos_token`, `eos_token`, ...) and any extra keyword the caller passes (e.g. `enable_thinking`);
- messages with keys set to None lose those keys (many templates test `'content' in message`).

    template = ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"})
    text = template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    text, spans = template.render_with_generation_spans(messages)   # character spans of {% generation %} blocks
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from redline.errors import UserError

Message = Mapping[str, Any]


def _require_jinja():
    try:
        import jinja2
    except ImportError:
        raise UserError("chat templates need jinja2: pip install 'redline[interop]' (or jinja2 alone)") from None
    return jinja2


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    # jinja2's own tojson escapes <, >, & and ' for HTML, which would change the prompt text
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _build_environment():
    """The sandboxed environment every template is compiled in (built once: the extension and namespace classes
    need jinja2, which is imported lazily)."""
    jinja2 = _require_jinja()
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    spans_var: ContextVar[list | None] = ContextVar("generation_spans", default=None)

    class GenerationBlock(Extension):
        """`{% generation %}body{% endgeneration %}` renders body and, while spans are being recorded, notes its
        (start, end) character offsets in the output."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_mark", [jinja2.nodes.ContextReference()]), [], [],
                                          body).set_lineno(lineno)

        def _mark(self, context, caller) -> str:
            text = caller()
            recording = spans_var.get()
            if recording is not None:
                # the output so far is what the template emitted before this block: its length is the offset
                start = len("".join(recording[0]))
                recording[1].append((start, start + len(text)))
            return text

    class SafeNamespace(jinja2.utils.Namespace):
        """A `namespace()` whose attributes cannot be dunder names (no way to CPython internals)."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                SafeNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            SafeNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template may not set the attribute {name!r}")

    class DictGlobal:
        """`dict(...)` and `dict.fromkeys(...)` without the rest of the type."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=_strftime_now, dict=DictGlobal(),
                       namespace=SafeNamespace)
    return env, spans_var


_ENVIRONMENT = None


def _environment():
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        _ENVIRONMENT = _build_environment()
    return _ENVIRONMENT


def _plain(value: Any) -> Any:
    """JSON-like data only (str, numbers, bools, None, lists, tuples, dicts), so the sandbox sees no object with
    methods of its own; anything else becomes a placeholder naming its type, as transformers does."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for base in (bool, str, int, float):  # subclasses (enums, numpy scalars) back to the base type
        if isinstance(value, base):
            return base(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


def normalize_messages(messages: Sequence[Message]) -> list[dict]:
    """Plain dict copies of the messages without None values; a clear error for anything that is no message."""
    if not messages:
        raise UserError("the conversation is empty; give at least one message")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise UserError(f"message {i} is not an object with a role and content: {message!r}")
        out.append(_plain({k: v for k, v in message.items() if v is not None}))
    return out


class ChatTemplate:
    """One compiled chat template with the special tokens it may read."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None):
        jinja2 = _require_jinja()
        env, self._spans_var = _environment()
        try:
            self._template = env.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise UserError(f"the chat template does not parse: {e.message} (line {e.lineno})") from None
        self.source = source
        self.special_tokens = dict(special_tokens or {})

    def _variables(self, messages, add_generation_prompt, tools, documents, extra) -> dict:
        return {**self.special_tokens, **_plain(dict(extra)), "messages": normalize_messages(messages),
                "tools": _plain(tools), "documents": _plain(documents),
                "add_generation_prompt": add_generation_prompt}

    def _render(self, variables: dict) -> str:
        jinja2 = _require_jinja()
        try:
            return self._template.render(**variables)
        except jinja2.exceptions.TemplateError as e:  # raise_exception(...) and runtime errors of the template
            raise UserError(f"the chat template refused the conversation: {e}") from None

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False,
               tools: list | None = None, documents: list | None = None, **extra) -> str:
        """The prompt text for `messages`; add_generation_prompt appends the start of an assistant turn."""
        return self._render(self._variables(messages, add_generation_prompt, tools, documents, extra))

    def render_with_generation_spans(self, messages: Sequence[Message], add_generation_prompt: bool = False,
                                     tools: list | None = None, documents: list | None = None,
                                     **extra) -> tuple[str, list[tuple[int, int]]]:
        """(text, [(start, end), ...]): the rendering and the character spans of its {% generation %} blocks
        (the assistant's text in templates written for training; none in templates without such blocks)."""
        variables = self._variables(messages, add_generation_prompt, tools, documents, extra)
        pieces: list[str] = []
        spans: list[tuple[int, int]] = []
        token = self._spans_var.set((pieces, spans))
        jinja2 = _require_jinja()
        try:
            # generate() yields the output piece by piece, so a block sees everything emitted before it
            for piece in self._template.generate(**variables):
                pieces.append(piece)
        except jinja2.exceptions.TemplateError as e:
            raise UserError(f"the chat template refused the conversation: {e}") from None
        finally:
            self._spans_var.reset(token)
        return "".join(pieces), spans


def template_for(tokenizer) -> ChatTemplate:
    """The chat template a tokenizer carries, with its special tokens; a clear error when it has none."""
    source = getattr(tokenizer, "chat_template", None)
    if not source:
        raise UserError("this tokenizer has no chat template; import a model that has one (tokenizer_config.json's "
                        "chat_template) or give a template")
    specials = tokenizer.special_tokens_map() if hasattr(tokenizer, "special_tokens_map") else {}
    return ChatTemplate(source, specials)
