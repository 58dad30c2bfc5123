"""Text in, text out: prompt encoding with length checks, stop strings, and streaming that never prints half a
character or the beginning of a stop string."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redline.errors import UserError
from redline.inference.engine import InferenceEngine
from redline.inference.sampling import SamplingParams


@dataclass
class Completion:
    prompt: str
    text: str
    """The generated text, cut before a stop string."""
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    """"eot" (a stop token), "stop" (a stop string) or "length" (max_new_tokens)."""
    prompt_truncated: bool = False


class IncrementalText:
    """Decodes a growing list of token ids and releases only final text.

    Held back: a trailing U+FFFD (a UTF-8 character split across tokens) and any tail that could be the start
    of a stop string. Once a stop string appears, the text is cut before it and `stopped` is set.
    """

    def __init__(self, tokenizer, stop_strings: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop_strings = [s for s in stop_strings if s]
        self._longest_stop = max(map(len, self.stop_strings), default=0)
        self.ids: list[int] = []
        self.released = 0  # characters of the full text handed out so far
        self.stopped = False
        self.final_tokens: int | None = None  # tokens up to the one that completed a stop string
        # decode(ids) kept as settled text + a short window's new text, so each add decodes O(new tokens), not the
        # whole list (a server's 64 streams × hundreds of tokens add up): the window starts a chunk before the new
        # tokens, because decoding a tail alone is not safe for every tokenizer (SentencePiece drops a leading
        # space), and its text must begin with that chunk's text as decoded before, else the whole list is decoded
        # (the prefix/read offsets of Hugging Face text-generation-inference's decode_token)
        self._settled = ""  # decode(ids[:_read])
        self._prefix = self._read = 0
        self._prefix_text = ""  # decode(ids[_prefix:_read])

    def text(self) -> str:
        ids, decode, prefix_text = self.ids, self.tokenizer.decode, self._prefix_text
        window = decode(ids[self._prefix:])
        if not window.startswith(prefix_text):  # the context decodes differently: start again from the top
            self._settled, self._prefix, self._read, self._prefix_text = "", 0, 0, ""
            window, prefix_text = decode(ids), ""
        full = self._settled + window[len(prefix_text):]
        if not full.endswith("\ufffd"):  # a whole character at the end: settle it, the new tokens become the context
            read = self._read
            self._prefix_text = decode(ids[read:])
            self._settled, self._prefix, self._read = full, read, len(ids)
        return full

    def add(self, ids: Sequence[int]) -> str:
        """Append token ids; returns the newly final text ("" if none)."""
        if self.stopped:
            return ""
        self.ids.extend(ids)
        full = self.text()
        released = self.released
        if self.stop_strings:
            start = max(0, released - self._longest_stop)
            hits = [i for i in (full.find(s, start) for s in self.stop_strings) if i >= 0]
            if hits:
                cut = min(hits)
                self.stopped, self.final_tokens = True, len(self.ids)
                out = full[released:cut]
                self.released = max(released, cut)
                return out
        end = len(full)
        while end > released and full[end - 1] == "\ufffd":
            end -= 1
        for s in self.stop_strings:  # hold back the longest tail that might grow into a stop string
            # a tail of k chars (1 <= k < len(s)) that begins s begins with s[0]: only those starts are tried,
            # leftmost (longest) first
            i = full.find(s[0], end - min(len(s) - 1, end - released), end) if end > released else -1
            while i >= 0:
                if s.startswith(full[i:end]):
                    end = i
                    break
                i = full.find(s[0], i + 1, end)
        out = full[released:end]
        self.released = end
        return out

    def finish(self) -> str:
        """Whatever was held back at the end (a stop string that never completed, a broken character)."""
        if self.stopped:
            return ""
        full = self.text()
        out = full[self.released:]
        self.released = len(full)
        return out

    def final_text(self) -> str:
        """The whole generated text, cut before the first stop string."""
        full = self.text()
        return full[: self.released] if self.stopped else full


def prompt_ids(tokenizer, text: str) -> list[int]:
    """A prompt's token ids: `tokenizer.encode_prompt` where the tokenizer has it (it adds the special tokens an
    imported model expects, e.g. Llama's BOS), else plain `encode`."""
    encode = getattr(tokenizer, "encode_prompt", None)
    return list(encode(text)) if encode is not None else list(tokenizer.encode(text))


def stop_token_ids(tokenizer) -> list[int]:
    """The token ids that end a generation: `tokenizer.stop_ids` (an imported model's EOS ids) where the
    tokenizer has them, else its end-of-text token."""
    return list(getattr(tokenizer, "stop_ids", None) or [tokenizer.eot_id])


def _snippet(text: str, n: int = 30) -> str:
    one_line = text.replace("\n", " ")
    return repr(one_line if len(one_line) <= n else one_line[:n] + "…")


class TextGenerator:
    """An InferenceEngine plus a tokenizer: strings in, Completions out, optionally streamed."""

    def __init__(self, engine: InferenceEngine, tokenizer):
        self.engine, self.tokenizer = engine, tokenizer
        if tokenizer.vocab_size > engine.cfg.vocab_size:
            raise UserError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                            f"{engine.cfg.vocab_size}; use the tokenizer the model was trained with")

    def encode_chat(self, messages, renderer, max_new_tokens: int, truncate: bool = False,
                    index: int = 0) -> tuple[list[int], bool]:
        """Token ids of a conversation rendered for the assistant's reply (redline/chat/render.py), and whether
        they were cut from the left to fit the context."""
        ids = renderer.prompt(messages)
        return self._fit(ids, max_new_tokens, truncate, index, messages[-1]["content"])

    def encode_prompt(self, text: str, max_new_tokens: int, truncate: bool = False,
                      prepend_eot: bool = False, index: int = 0) -> tuple[list[int], bool]:
        """Token ids of a prompt and whether they were cut from the left to fit the context."""
        ids = ([self.tokenizer.eot_id] if prepend_eot else []) + prompt_ids(self.tokenizer, text)
        return self._fit(ids, max_new_tokens, truncate, index, text)

    def _fit(self, ids: list[int], max_new_tokens: int, truncate: bool, index: int, text: str):
        ctx = self.engine.cfg.context_len
        limit = ctx - max_new_tokens
        if max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if limit < 1:
            raise UserError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's "
                            f"context_len {ctx}; lower max_new_tokens")
        if not ids:
            raise UserError(f"prompt {index} is empty; give some text, or pass --prepend-eot to generate "
                            f"from the end-of-text token alone")
        if len(ids) > limit:
            if not truncate:
                raise UserError(
                    f"prompt {index} {_snippet(text)} is {len(ids)} tokens; with max_new_tokens={max_new_tokens} "
                    f"that exceeds the model's context_len {ctx}. Shorten it, lower max_new_tokens, or pass "
                    f"--truncate to keep its last {limit} tokens"
                )
            return ids[-limit:], True
        return ids, False

    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int,
        sampling: SamplingParams | None = None,
        stop_strings: Sequence[str] = (),
        stop_at_eot: bool = True,
        truncate: bool = False,
        prepend_eot: bool = False,
        on_text: Callable[[int, str], None] | None = None,
        encoded: Sequence[tuple[list[int], bool]] | None = None,
        stop_tokens: Sequence[int] | None = None,
    ) -> list[Completion]:
        """Complete each prompt (one batch). on_text(row, text) streams final text as it is decided.
        encoded: the prompts already through `encode_prompt` or `encode_chat` ((ids, truncated) pairs).
        stop_tokens: the token ids that end a completion (None: the end-of-text token when stop_at_eot; a chat
        renderer's `stop_ids` end the assistant's turn)."""
        if encoded is None:
            encoded = [self.encode_prompt(p, max_new_tokens, truncate, prepend_eot, i) for i, p in enumerate(prompts)]
        pairs = list(encoded)
        decoders = [IncrementalText(self.tokenizer, stop_strings) for _ in prompts]

        def on_tokens(row: int, ids: list[int]) -> bool:
            new = decoders[row].add(ids)
            if new and on_text is not None:
                on_text(row, new)
            return decoders[row].stopped

        needs_text = bool(stop_strings) or on_text is not None
        results = self.engine.generate(
            [ids for ids, _ in pairs], max_new_tokens, sampling,
            stop_tokens=(stop_tokens if stop_tokens is not None else
                         stop_token_ids(self.tokenizer) if stop_at_eot else ()),
            on_tokens=on_tokens if needs_text else None,
        )
        completions = []
        for row, (prompt, (ids, cut), res) in enumerate(zip(prompts, pairs, results)):
            dec = decoders[row]
            if not needs_text:
                dec.add(res.tokens)
            elif on_text is not None:
                rest = dec.finish()
                if rest:
                    on_text(row, rest)
            reason = {"stop_token": "eot", "stop": "stop", "length": "length"}[res.finish_reason]
            completions.append(Completion(
                prompt=prompt, text=dec.final_text(), prompt_tokens=len(ids),
                completion_tokens=dec.final_tokens if dec.stopped else len(res.tokens),
                finish_reason="stop" if dec.stopped else reason, prompt_truncated=cut,
            ))
        return completions
