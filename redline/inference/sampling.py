"""Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus) and a repetition penalty.

Everything runs on the logits' device with no host synchronisation, so the decode loop can queue many steps
ahead of the GPU. Order of the transforms (as in Hugging Face `generate`): repetition penalty → temperature →
top-k → top-p → sample. Temperature 0 is greedy (argmax, first index on ties, like `GPT.generate`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from redline.errors import UserError
from redline.inference.transfer import to_device


@dataclass
class SamplingParams:
    temperature: float = 0.0
    """0: greedy; otherwise divide the logits by this before sampling."""
    top_k: int | None = None
    """Sample among the k most likely tokens (None or 0: all)."""
    top_p: float = 1.0
    """Sample among the smallest set of tokens whose probability reaches top_p (1: all)."""
    repetition_penalty: float = 1.0
    """> 1 discourages tokens already in the prompt or the output (as in CTRL: positive logits are divided by it,
    negative ones multiplied)."""
    seed: int | None = None
    """Seed of the sampling generator (None: a random one)."""

    def validate(self) -> None:
        if not self.temperature >= 0:  # also catches NaN
            raise UserError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise UserError(f"top_k must be >= 0 (0 or None = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise UserError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# the sampling settings a model's generation_config.json may recommend, and the values each may take
_MODEL_KEYS = {"temperature": lambda v: v >= 0, "top_k": lambda v: v >= 0 and float(v).is_integer(),
               "top_p": lambda v: 0 < v <= 1, "repetition_penalty": lambda v: v > 0}


def model_sampling_defaults(generation_config: dict | None) -> dict:
    """The sampling settings a model's generation_config.json recommends ({"temperature": 0.6, "top_p": 0.95,
    ...}), those of the four redline has and with valid values; as vLLM reads them, `do_sample` is not one (a
    temperature 0 is how to ask for greedy decoding)."""
    out = {}
    for key, ok in _MODEL_KEYS.items():
        value = (generation_config or {}).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and ok(value):
            out[key] = int(value) if key == "top_k" else float(value)
    return out


def sampling_from(options, fallback: dict, model: dict | None = None) -> tuple[SamplingParams, list[str]]:
    """SamplingParams from a command's options (attributes named as fallback's keys, None where not given, and
    `seed`), else the model's recommendation (model_sampling_defaults), else redline's `fallback`; with the names
    taken from the model."""
    model = model or {}
    given = {k: getattr(options, k) for k in fallback}
    from_model = [k for k in fallback if given[k] is None and k in model]
    values = {k: given[k] if given[k] is not None else model.get(k, fallback[k]) for k in fallback}
    return SamplingParams(seed=options.seed, **values), from_model


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    if params.greedy:
        return None
    gen = torch.Generator(device=device)
    if params.seed is None:
        gen.seed()
    else:
        gen.manual_seed(params.seed)
    return gen


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits: (B, V) float; seen: (B, V) bool, True for tokens already in the row's prompt or output."""
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, p: float | torch.Tensor) -> torch.Tensor:
    """Keep the most likely tokens until their cumulative probability reaches p (always at least one); p a number,
    or each row's (B, 1) on the device."""
    if not isinstance(p, torch.Tensor) and p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = F.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # probability mass of the strictly more likely tokens
    sorted_logits = sorted_logits.masked_fill(before >= p, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
                seen: torch.Tensor | None = None) -> torch.Tensor:
    """logits: (B, V), any float dtype -> next token ids (B,) int64."""
    logits = logits.float() if logits.dtype != torch.float64 else logits
    if seen is not None and params.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, seen, params.repetition_penalty)
    if params.greedy:
        return logits.argmax(dim=-1)
    logits = logits / params.temperature
    if params.top_k:
        logits = filter_top_k(logits, params.top_k)
    logits = filter_top_p(logits, params.top_p)
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def draw_rows(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor | None,
              noise: torch.Tensor) -> torch.Tensor:
    """Every row's next token at once, with no host work (it runs inside a captured decode step): logits (B, vocab)
    fp32; temperature (B, 1), 0 for a greedy row (its argmax); top_p (B, 1), +inf where a row filters nothing, or
    None when no row does; noise (B, vocab) Exp(1) draws, filled before the step. A row's token is RowSampler's for
    the same noise: argmax of softmax(filtered logits / temperature) / noise."""
    sampled = temperature > 0  # (B, 1)
    x = logits / torch.where(sampled, temperature, torch.ones_like(temperature))
    if top_p is not None:
        x = filter_top_p(x, top_p)
    drawn = (F.softmax(x, dim=-1) / noise).argmax(dim=-1)
    return torch.where(sampled[:, 0], drawn, logits.argmax(dim=-1))


class RowSampler:
    """The next tokens of several rows of a batch at once, each row with its own temperature, top-k, top-p and
    generator (a server's requests): sample_next's transforms as (rows, vocab) operations, one sort for every row's
    top-p, then one draw of noise for the rows without a generator of their own and one per row with one (a seeded
    request). Every operation is row by row, so a seeded row's tokens do not depend on the other rows. Built once
    per group of steps (its rows and parameters are fixed); no host synchronisation. A repetition penalty is not
    applied (it needs each row's tokens so far), as sample_next applies none without them.

    The draw is torch.multinomial's for one sample (argmax of p / q with q ~ Exp(1): the Gumbel-max trick with the
    exponential taken), written out so that the rows sharing a generator draw together."""

    def __init__(self, rows: list[int], params: list[SamplingParams], generators: list[torch.Generator | None],
                 shared: torch.Generator | None, device: torch.device):
        if any(p.greedy for p in params):
            raise ValueError("RowSampler samples at a temperature > 0; take greedy rows' argmax instead")
        self.rows = to_device(rows, device)  # (R,) rows of the logits it is given
        self.temperature = to_device([p.temperature for p in params], device, torch.float32)[:, None]  # (R, 1)
        # top-p 1 filters nothing (sample_next skips it): +inf, so that rounding in the cumulative sum cannot cut
        self.top_p = to_device([p.top_p if p.top_p < 1 else float("inf") for p in params], device,
                               torch.float32)[:, None]  # (R, 1)
        self.filter_top_p = any(p.top_p < 1 for p in params)
        self.top_k = [p.top_k or 0 for p in params]
        self.k = to_device(self.top_k, device)[:, None]  # (R, 1); 0: off
        self.own = [(i, g) for i, g in enumerate(generators) if g is not None]
        self.shared = shared

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (B, vocab) -> the sampled rows' distributions (R, vocab) fp32, after temperature, top-k, top-p."""
        x = logits.index_select(0, self.rows).float() / self.temperature
        vocab = x.size(-1)
        k_max = max((k for k in self.top_k if 0 < k < vocab), default=0)
        if k_max:  # each row's k-th largest logit (rows without top-k keep everything)
            kth = torch.topk(x, k_max, dim=-1).values.gather(1, (self.k - 1).clamp(0, k_max - 1))  # (R, 1)
            x = x.masked_fill((self.k > 0) & (self.k < vocab) & (x < kth), float("-inf"))
        if self.filter_top_p:
            x = filter_top_p(x, self.top_p)
        return F.softmax(x, dim=-1)

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (B, vocab) -> the sampled rows' next tokens (R,) int64, in `rows` order."""
        probs = self.probabilities(logits)
        noise = torch.empty_like(probs)
        if len(self.own) < noise.size(0):
            noise.exponential_(1, generator=self.shared)
        for i, generator in self.own:
            noise[i].exponential_(1, generator=generator)
        return (probs / noise).argmax(dim=-1)
