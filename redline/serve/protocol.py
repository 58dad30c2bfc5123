"""OpenAI's request bodies read and checked, and its response and error shapes.

A request is checked whole before anything is queued; a bad one raises APIError, which the server answers as
OpenAI does: {"error": {"message", "type", "param", "code"}} with a 4xx status. Fields redline does not implement
are refused when they ask for something (echo, tools, penalties, ...), and ignored when they change nothing
(user, metadata, ...).
"""

from __future__ import annotations

import codecs
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redline.inference.sampling import SamplingParams

MAX_STOP_STRINGS = 4  # as OpenAI's API
MAX_N = 16
MAX_TOP_LOGPROBS = 20  # as OpenAI's chat API (its completions API stops at 5)


class APIError(Exception):
    """An error answered as OpenAI's API answers it."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


@dataclass
class Job:
    """One request, checked: its prompts (text or token ids) and how to continue them."""

    kind: str  # "chat" or "completion"
    prompts: list  # each a str (to tokenize) or a list of token ids
    max_tokens: int | None  # None: up to the context
    sampling: SamplingParams
    stop: tuple[str, ...]
    n: int
    stream: bool
    include_usage: bool
    max_tokens_name: str = "max_tokens"
    """The field max_tokens came from (max_completion_tokens, the newer name, or max_tokens), for errors."""
    continuous_usage: bool = False
    """stream_options.continuous_usage_stats (as vLLM has it): every chunk carries the usage so far, and a chunk is
    sent whenever tokens reach the host, text or not (load generators time tokens with it)."""
    messages: list[dict] | None = None  # chat: the conversation, rendered by the server
    logprobs: int | None = None
    """Give each generated token's log-probability and this many most likely alternatives (None: none)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to those tokens' logits before each token is chosen (OpenAI's logit_bias)."""
    penalties: tuple[float, float] = (0.0, 0.0)
    """(presence_penalty, frequency_penalty), OpenAI's: each token's logit lowered by the first once it has been
    generated and by the second for every time it has."""
    echo: bool = False
    """Completions: the response's text starts with the prompt's (and with logprobs, so do its logprobs)."""


# fields that ask for something redline does not do: (name, the value that asks for nothing)
_REFUSED = {
    "suffix": (None, ""), "best_of": (None, 1), "tools": (None, []), "functions": (None, []), "tool_choice": (None, "none"),
    "function_call": (None, "none"), "audio": (None,), "prediction": (None,),
}
_REFUSED_IN_CHAT = {**_REFUSED, "echo": (None, False)}  # completions take echo (completion_job)


def _number(body: Mapping, name: str, default, lo: float, hi: float, integer: bool = False):
    value = body.get(name)
    if value is None:
        return default
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not lo <= value <= hi:
        what = "an integer" if integer else "a number"
        raise bad(f"{name} must be {what} in [{lo}, {hi}], got {value!r}", name)
    return value


def _stop(body: Mapping) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad(f"stop must be a string or a list of strings, got {stop!r}", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise bad(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}", "stop")
    return tuple(s for s in stops if s)


def _common(body: Mapping, kind: str, least_tokens: int = 1, defaults: Mapping | None = None) -> dict:
    """What chat and completion requests share. defaults: the model's recommended temperature, top_p and top_k
    (its generation_config.json) for a request that leaves them out, as vLLM serves them; else OpenAI's."""
    defaults = defaults or {}
    for name, harmless in (_REFUSED_IN_CHAT if kind == "chat" else _REFUSED).items():
        if name in body and body[name] not in harmless:
            raise bad(f"{name} is not supported by this server (redline serve); leave it out", name,
                      "unsupported_parameter")
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise bad("response_format other than text is not supported by this server", "response_format",
                  "unsupported_parameter")
    # both may come (max_tokens is the older name); each is checked, and max_completion_tokens wins
    max_tokens = _number(body, "max_tokens", None, least_tokens, 2**31, integer=True)
    if body.get("max_completion_tokens") is not None:
        max_tokens = _number(body, "max_completion_tokens", None, least_tokens, 2**31, integer=True)
    if max_tokens is None and kind == "completion":
        max_tokens = 16  # OpenAI's default for completions; chat goes on up to the context
    seed = _number(body, "seed", None, -2**63, 2**63 - 1, integer=True)
    # top_k is not OpenAI's; vLLM and llama.cpp's servers take it (-1 or 0: off), and clients send it as an extra
    top_k = _number(body, "top_k", defaults.get("top_k", 0), -1, 2**31, integer=True)
    sampling = SamplingParams(temperature=float(_number(body, "temperature", defaults.get("temperature", 1.0), 0, 2)),
                              top_p=float(_number(body, "top_p", defaults.get("top_p", 1.0), 0, 1)), seed=seed,
                              top_k=max(top_k, 0))
    if sampling.top_p == 0:
        raise bad("top_p must be > 0 (1 = off)", "top_p")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise bad(f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise bad("stream_options is only allowed when stream is true", "stream_options")
    options = options or {}
    if not isinstance(options, Mapping):
        raise bad("stream_options must be an object", "stream_options")
    for name in ("include_usage", "continuous_usage_stats"):
        if not isinstance(options.get(name, False), bool):
            raise bad(f"stream_options.{name} must be true or false, got {options[name]!r}", "stream_options")
    bias = body.get("logit_bias") or {}
    if not isinstance(bias, Mapping):
        raise bad("logit_bias must be an object mapping token ids to numbers in [-100, 100]", "logit_bias")
    pairs = []
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()) or isinstance(value, bool) \
                or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise bad(f"logit_bias maps token ids to numbers in [-100, 100], got {key!r}: {value!r}", "logit_bias")
        pairs.append((int(key), float(value)))
    penalties = tuple(float(_number(body, name, 0.0, -2, 2)) for name in ("presence_penalty", "frequency_penalty"))
    return {"max_tokens": max_tokens, "sampling": sampling,
            "max_tokens_name": "max_completion_tokens" if body.get("max_completion_tokens") is not None
            else "max_tokens", "stop": _stop(body), "penalties": penalties,
            "logit_bias": tuple(pairs),
            "n": _number(body, "n", 1, 1, MAX_N, integer=True), "stream": bool(stream),
            "include_usage": bool(options.get("include_usage", False)),
            "continuous_usage": bool(options.get("continuous_usage_stats", False))}


def _content(message: Mapping, i: int) -> str:
    """A message's text: a string, or a list of text parts (joined); anything else is refused."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"messages[{i}].content: only text parts are supported, got {part!r}",
                          f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


ROLES = ("system", "user", "assistant")  # those redline/chat/render.py renders
ALIASES = {"developer": "system"}  # OpenAI's newer name for the system message (as vLLM reads it)


def chat_job(body: Mapping, defaults: Mapping | None = None) -> Job:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    plain = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        role = ALIASES.get(role, role) if isinstance(role, str) else None
        if role not in ROLES:
            raise bad(f"messages[{i}] must be an object with a role in {', '.join(ROLES + tuple(ALIASES))}",
                      f"messages[{i}]")
        content = _content(message, i)
        if not content.strip():
            raise bad(f"messages[{i}] has empty content; give it some text", f"messages[{i}].content")
        plain.append({"role": role, "content": content})
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad(f"logprobs must be true or false, got {logprobs!r}", "logprobs")
    top = _number(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS, integer=True)
    if top is not None and not logprobs:
        raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    return Job(kind="chat", prompts=[None], messages=plain, logprobs=(top or 0) if logprobs else None,
               **_common(body, "chat", defaults=defaults))


def completion_job(body: Mapping, defaults: Mapping | None = None) -> Job:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompts = [list(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) and p for p in prompt):
        prompts = [list(p) for p in prompt]
    else:
        raise bad("prompt must be a non-empty string, list of strings, or list of token ids", "prompt")
    if any(p == "" for p in prompts):
        raise bad("prompt is empty; give some text", "prompt")
    echo = body.get("echo", False)
    if echo is not None and not isinstance(echo, bool):
        raise bad(f"echo must be true or false, got {echo!r}", "echo")
    logprobs = _number(body, "logprobs", None, 0, MAX_TOP_LOGPROBS, integer=True)
    # max_tokens 0 with echo and logprobs: score the prompt alone (OpenAI's legacy completions allowed it, as
    # evaluation harnesses use it)
    job = Job(kind="completion", prompts=prompts, logprobs=logprobs, echo=bool(echo),
              **_common(body, "completion", 0 if echo and logprobs is not None else 1, defaults))
    if len(prompts) * job.n > MAX_N:
        raise bad(f"prompts × n must be at most {MAX_N}, got {len(prompts)} × {job.n}", "n")
    return job


# -- responses ---------------------------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    """OpenAI's usage object; cached_tokens: prompt tokens not computed for this request (prefix reuse), given as
    OpenAI gives its prompt caching's, in prompt_tokens_details."""
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def response(job: Job, rid: str, model: str, texts: list[str], reasons: list[str], use: dict,
             logprobs: list[dict | None] | None = None) -> dict:
    """The whole (not streamed) response; logprobs: each choice's logprobs object (completion_logprobs or
    chat_logprobs), or None."""
    created = int(time.time())
    logprobs = logprobs or [None] * len(texts)
    if job.kind == "chat":
        choices = [{"index": i, "message": {"role": "assistant", "content": t}, "logprobs": lp,
                    "finish_reason": r} for i, (t, r, lp) in enumerate(zip(texts, reasons, logprobs))]
        return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": choices,
                "usage": use, "system_fingerprint": None}
    choices = [{"index": i, "text": t, "logprobs": lp, "finish_reason": r}
               for i, (t, r, lp) in enumerate(zip(texts, reasons, logprobs))]
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": use, "system_fingerprint": None}


def chunk(job: Job, rid: str, model: str, index: int, text: str | None = None, reason: str | None = None,
          role: bool = False, use: dict | None = None, progress: dict | None = None,
          logprobs: dict | None = None) -> dict:
    """One streamed chunk: a choice's new text, its finish reason, its opening role (chat), or (use given) the
    closing usage chunk with no choices. progress: the usage so far (continuous usage stats); logprobs: the new
    tokens' logprobs object."""
    created = int(time.time())
    obj = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
    out: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": None}
    if use is not None:
        out.update(choices=[], usage=use)
        return out
    if job.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text is not None:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": reason}
    out["choices"] = [choice]
    if progress is not None:
        out["usage"] = progress
    elif job.include_usage:
        out["usage"] = None
    return out


class TextOffsets:
    """Where each token of a choice starts in its text, in characters (completions' text_offset), from the tokens'
    bytes in order: a token that starts inside a character (a UTF-8 character whose bytes span tokens) starts where
    that character does. Counted as the text decodes (errors replaced, as the tokenizers decode)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.chars = 0

    def advance(self, data: bytes) -> int:
        """The offset of a token with these bytes; the next one starts after them."""
        start = self.chars
        self.chars += len(self._decoder.decode(data))
        return start


def completion_logprobs(entries: list[tuple], token_text, token_bytes, offsets: TextOffsets) -> dict:
    """OpenAI's completions logprobs object for generated tokens: entries (token id, logprob, [(id, logprob) of the
    most likely]) in order; token_text(id) -> the token's text alone, token_bytes(id) -> its bytes; offsets: the
    choice's TextOffsets, advanced over these tokens."""
    tokens = [token_text(t) for t, _, _ in entries]
    text_offset = [offsets.advance(token_bytes(t)) for t, _, _ in entries]
    tops = []
    for _, _, top in entries:  # keyed by text: of tokens with the same text (bytes of one character), the likeliest
        tops.append({})
        for t, lp in top:
            tops[-1].setdefault(token_text(t), lp)
    return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries], "top_logprobs": tops,
            "text_offset": text_offset}


def chat_logprobs(entries: list[tuple], token_text, token_bytes) -> dict:
    """OpenAI's chat logprobs object (choices[i].logprobs) for entries as completion_logprobs takes them: each
    token's text alone and its bytes (from which a client rebuilds characters split over tokens)."""
    def one(token: int, lp: float) -> dict:
        return {"token": token_text(token), "logprob": lp, "bytes": list(token_bytes(token))}

    return {"content": [{**one(t, lp), "top_logprobs": [one(u, l) for u, l in top]} for t, lp, top in entries],
            "refusal": None}


class TextChunks:
    """The JSON of one streamed response's text chunks, the same as chunk(job, rid, model, index, text=...,
    progress=usage(...)) gives (its `created` fixed at the stream's start, as OpenAI's chunks share theirs), built
    from the fixed parts around the new text instead of a dict dumped whole at every chunk: a server streaming to
    many clients builds one of these per client per group of tokens."""

    _INDEX, _TEXT, _PROMPT, _DONE, _TOTAL = -7_770_001, "\x00text\x00", -7_770_002, -7_770_003, -7_770_004

    def __init__(self, job: Job, rid: str, model: str):
        self.job, self.rid, self.model = job, rid, model
        progress = ({"prompt_tokens": self._PROMPT, "completion_tokens": self._DONE, "total_tokens": self._TOTAL}
                    if job.continuous_usage else None)
        whole = json.dumps(chunk(job, rid, model, self._INDEX, text=self._TEXT, progress=progress), ensure_ascii=False)
        marks = [str(self._INDEX), json.dumps(self._TEXT)]
        marks += [str(self._PROMPT), str(self._DONE), str(self._TOTAL)] if progress else []
        self.usage = progress is not None
        self.parts: list[str] | None = []
        if any(whole.count(mark) != 1 for mark in marks):  # a model or id spelling a mark: dump each chunk whole
            self.parts = None
            return
        for mark in marks:  # in the order they appear: the choice's index, its text, then the usage
            head, whole = whole.split(mark, 1)
            self.parts.append(head)
        self.parts.append(whole)

    def __call__(self, index: int, text: str, prompt_tokens: int = 0, completion_tokens: int = 0) -> str:
        p = self.parts
        if p is None:
            progress = usage(prompt_tokens, completion_tokens) if self.usage else None
            return json.dumps(chunk(self.job, self.rid, self.model, index, text=text, progress=progress),
                              ensure_ascii=False)
        out = [p[0], str(index), p[1], json.dumps(text, ensure_ascii=False), p[2]]
        if self.usage:
            out += [str(prompt_tokens), p[3], str(completion_tokens), p[4], str(prompt_tokens + completion_tokens),
                    p[5]]
        return "".join(out)
