"""`redline generate`: complete prompts with a checkpoint through the KV-cache engine.

Prompts come from --prompt (one or more), --prompt-file (one prompt a line, or a .jsonl of {"prompt": ...};
`-` reads stdin), or piped stdin. With --chat each prompt is a user message (after --system, if given), rendered
by the checkpoint's chat template (redline/chat/render.py) and answered until the end of the assistant's turn.
Text streams to stdout as it is generated; --stream False (or --no-stream) batches
the prompts instead; --jsonl writes one JSON object per prompt.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import tyro

from redline.inference.runtime import RuntimeOptions


@dataclass
class GenerateConfig:
    checkpoint: str | None = None
    """A checkpoint folder or a run directory (its newest checkpoint). Required."""
    prompt: tuple[str, ...] = ()
    """Prompts to complete, each a separate generation."""
    prompt_file: str | None = None
    """A text file with one prompt a line, or a .jsonl with a "prompt" field per line; `-` reads stdin."""
    prompt_per_line: bool = True
    """For a text prompt file or stdin: each non-empty line is a prompt (off: the whole file is one prompt)."""
    max_new_tokens: int = 128
    """Most tokens to generate per prompt."""
    temperature: float | None = None
    """Sampling temperature (0: greedy). None: the model's generation_config.json (an imported model's), else 0.8."""
    top_k: int | None = None
    """Sample among the k most likely tokens (0: all). None: the model's generation_config.json, else 50."""
    top_p: float | None = None
    """Nucleus sampling: the smallest set of tokens whose probability reaches top_p (1: off). None: the model's
    generation_config.json, else 1."""
    repetition_penalty: float | None = None
    """> 1 discourages repeating tokens of the prompt and the output (1: off). None: the model's
    generation_config.json, else 1."""
    seed: int = 0
    """Sampling seed (the same prompts, batch size and seed give the same output)."""
    stop: tuple[str, ...] = ()
    """Stop strings: a completion ends before the first one it produces."""
    stop_at_eot: bool = True
    """End a completion at the end-of-text token."""
    chat: bool = False
    """Each prompt is a user message, rendered with the checkpoint's chat template (its Jinja template, or redline's
    own after `redline sft`); the completion is the assistant's reply, ended by the end of its turn."""
    system: str | None = None
    """--chat only: a system message before each prompt."""
    prepend_eot: bool = False
    """Start each prompt with the end-of-text token (training documents follow one; allows an empty prompt)."""
    truncate: bool = False
    """Cut a prompt that does not fit (with max_new_tokens) from the left instead of stopping with an error."""
    batch_size: int = 16
    """Prompts per batch when not streaming."""
    stream: bool = True
    """Print text as it is generated, one prompt at a time (off: batches of batch_size, printed when done)."""
    echo_prompt: bool = True
    """Print each prompt before its completion (text output only)."""
    jsonl: str | None = None
    """Write one JSON object per prompt (prompt, completion, token counts, finish reason) to this file; `-`: stdout."""
    tokenizer: str | None = None
    """Tokenizer override (bytes, gpt2, a tokenizer.json or folder); it must be the checkpoint's own."""
    runtime: tyro.conf.OmitArgPrefixes[RuntimeOptions] = field(default_factory=RuntimeOptions)
    """Device, precision, compilation and CUDA graphs."""

    def validate(self) -> None:
        from redline.durable import check_output_file
        from redline.errors import UserError
        from redline.inference.sampling import sampling_from

        sampling_from(self, SAMPLING_DEFAULTS)[0].validate()
        if self.jsonl and self.jsonl != "-":
            check_output_file(self.jsonl, "--jsonl")
        if self.max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.batch_size < 1:
            raise UserError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.prompt and self.prompt_file:
            raise UserError("give prompts either with --prompt or with --prompt-file, not both")


# redline's sampling where neither the command line nor the model's generation_config.json sets it
SAMPLING_DEFAULTS = {"temperature": 0.8, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0}

# the booleans that also take --no-NAME (a bare --NAME is config.parse's)
BOOL_FLAGS = ("prompt-per-line", "stop-at-eot", "prepend-eot", "truncate", "stream", "echo-prompt", "chat")


def read_prompts(cfg: GenerateConfig) -> list[str]:
    from redline.errors import UserError

    if cfg.prompt:
        return list(cfg.prompt)
    source = cfg.prompt_file
    if source is None:
        if sys.stdin.isatty():
            raise UserError("no prompt: give --prompt TEXT, --prompt-file FILE, or pipe text on stdin")
        source = "-"
    from redline.data.sources import NotUTF8, decode_utf8_file

    fix = "prompts must be UTF-8 text: convert the file (e.g. `iconv -f latin1 -t utf-8 FILE`)"
    if source == "-":
        raw = getattr(sys.stdin, "buffer", None)  # a text-only stream (no bytes underneath) is already decoded
        text = NotUTF8("strict", fix).decode(raw.read(), "stdin") if raw is not None else sys.stdin.read()
        name = "stdin"
    else:
        path = Path(source)
        if not path.is_file():
            raise UserError(f"prompt file {source} not found")
        text, name = decode_utf8_file(path, fix), source
    if source.endswith(".jsonl"):
        prompts = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                prompts.append(obj["prompt"] if isinstance(obj, dict) else None)
            except (ValueError, KeyError):
                prompts.append(None)
            if not isinstance(prompts[-1], str):
                raise UserError(f"{name} line {n} is not a JSON object with a string \"prompt\" field")
    elif cfg.prompt_per_line:
        prompts = [line for line in text.splitlines() if line.strip()]
    else:
        prompts = [text]
    if not prompts:
        raise UserError(f"{name} holds no prompt (it is empty or only blank lines)")
    return prompts


def main(argv: list[str]) -> int:
    from redline.config import parse
    from redline.inference.runtime import checkpoint_sampling, expand_bool_flags, load_generator

    argv = expand_bool_flags(argv, BOOL_FLAGS)
    cfg = parse(GenerateConfig, argv, prog="redline generate", description=__doc__.strip(), default=GenerateConfig())
    prompts = read_prompts(cfg)
    generator, _ = load_generator(cfg.checkpoint, cfg.tokenizer, cfg.runtime)
    sampling = checkpoint_sampling(cfg, SAMPLING_DEFAULTS, "redline generate")
    # every prompt is checked before any generation starts
    stop_tokens = None
    if cfg.chat:
        from redline.chat.render import check_messages, renderer_for

        renderer = renderer_for(generator.tokenizer)
        system = [{"role": "system", "content": cfg.system}] if cfg.system else []
        encoded = [generator.encode_chat(check_messages(system + [{"role": "user", "content": p}],
                                                        need_assistant=False, where=f"prompt {i}"),
                                         renderer, cfg.max_new_tokens, cfg.truncate, i)
                   for i, p in enumerate(prompts)]
        stop_tokens = list(renderer.stop_ids) + ([generator.tokenizer.eot_id] if cfg.stop_at_eot else [])
    else:
        encoded = [generator.encode_prompt(p, cfg.max_new_tokens, cfg.truncate, cfg.prepend_eot, i)
                   for i, p in enumerate(prompts)]
    for i, (_, cut) in enumerate(encoded):
        if cut:
            print(f"redline generate: prompt {i} was cut from the left to fit the context", file=sys.stderr)

    to_stdout_json = cfg.jsonl == "-"
    stream = cfg.stream and not to_stdout_json
    batch = 1 if stream else cfg.batch_size
    total_tokens, total_s = 0, 0.0
    jsonl_file = None
    if cfg.jsonl and not to_stdout_json:
        # each record appended whole (durable.append_line): a full disk is one line, and the records
        # written before it stay readable, with no torn last line
        from redline.durable import append_line, write_atomic

        jsonl_file = write_atomic(cfg.jsonl, "")
    for start in range(0, len(prompts), batch):
        chunk, chunk_encoded = prompts[start:start + batch], encoded[start:start + batch]
        if stream:
            if start:
                print("\n---")
            if cfg.echo_prompt:
                print(chunk[0], end="", flush=True)
        completions = generator.generate(
            chunk, cfg.max_new_tokens, sampling, stop_strings=cfg.stop, stop_at_eot=cfg.stop_at_eot,
            on_text=(lambda row, text: print(text, end="", flush=True)) if stream else None, encoded=chunk_encoded,
            stop_tokens=stop_tokens,
        )
        total_tokens += sum(c.completion_tokens for c in completions)
        total_s += generator.engine.last.total_s
        for j, c in enumerate(completions):
            record = {"index": start + j, "prompt": c.prompt, "completion": c.text,
                      "prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                      "finish_reason": c.finish_reason, "prompt_truncated": c.prompt_truncated}
            if to_stdout_json:
                print(json.dumps(record, ensure_ascii=False), flush=True)
            elif not stream:
                if start + j:
                    print("\n---")
                print((c.prompt if cfg.echo_prompt else "") + c.text, flush=True)
            if jsonl_file is not None:
                append_line(jsonl_file, json.dumps(record, ensure_ascii=False), sync=False)
    if stream:
        print(flush=True)
    if total_s > 0:
        print(f"redline generate: {len(prompts)} prompt(s), {total_tokens} tokens in {total_s:.2f} s "
              f"({total_tokens / total_s:.1f} tokens/s, {generator.engine.describe()})", file=sys.stderr)
    return 0
