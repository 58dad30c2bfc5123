"""Starting a run from a checkpoint's weights (`TrainConfig.init_from`): continued pretraining of a model redline
trained or imported, and the base that fine-tuning starts from.

    init = InitPoint.read(cfg.init_from)        # the checkpoint: its folder, model config and tokenizer
    cfg = init.configure(cfg)                   # cfg with the checkpoint's architecture (conflicts: one-line error)
    init.check_tokenizer(data_tokenizer, data)  # the data must be tokenized with the checkpoint's tokenizer
    model = GPT(cfg.model)
    load_init_weights(model, init.checkpoint)   # redline/training/checkpoint.py: before converters and wrapping

Only weights come from the checkpoint: the optimizer starts fresh, at step 0, with the run's own schedule, data
and budget. A `--resume` of such a run resumes from its own checkpoints (the init checkpoint is not read again).

Precedence: the architecture (every ModelConfig field, the vocabulary size included) is the checkpoint's. A
different `--preset` is an error, and so is a `model.*` setting that changes the architecture; the settings that
change how the same weights run and train (RUN_FIELDS: dropout, attention backend, chunked cross-entropy) may be
given and apply. Training settings (learning rate, batch, budget) are the run's own.

Context extension: a RoPE model may also be given a longer `model.context_len` with its RoPE changed
(CONTEXT_FIELDS: a higher `rope_theta`, as Llama 3 and Qwen raised theta for long-context training, or
`rope_scaling` yarn / llama3 / linear with its parameters): no weight changes shape, and continued pretraining at
the new length is how such models are extended (YaRN, Peng et al. 2023, fine-tunes a few hundred steps).
Scaling switched on without `model.rope_original_context` takes the checkpoint's context_len as the original.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from redline.errors import UserError
from redline.model import ModelConfig

# ModelConfig fields a run may set on top of the checkpoint's architecture: they change no weight's shape or meaning
RUN_FIELDS = ("dropout", "attn_backend", "ce_chunk_tokens")
# and, for a RoPE model, the context length and RoPE's frequencies: the same weights, at positions further apart
CONTEXT_FIELDS = ("context_len", "rope_theta", "rope_scaling", "rope_factor", "rope_low_freq_factor",
                  "rope_high_freq_factor", "rope_original_context", "rope_beta_fast", "rope_beta_slow",
                  "rope_attention_factor", "rope_truncate", "rope_pair_factors", "rope_long_pair_factors")
DEFAULT_PRESET = "tiny"  # TrainConfig.preset's default: a run that names no preset


@dataclass
class InitPoint:
    """A verified checkpoint whose weights a run starts from."""

    checkpoint: Path
    model: ModelConfig
    preset: str
    tokenizer: object
    tokenizer_identity: str

    @classmethod
    def read(cls, path: str | Path) -> InitPoint:
        from redline.config import TrainConfig, from_dict
        from redline.tokenizer import load_tokenizer
        from redline.training import checkpoint as ckpt_io

        checkpoint = ckpt_io.resolve_checkpoint(path)
        meta = ckpt_io.verify_checkpoint(checkpoint)
        saved = from_dict(TrainConfig, ckpt_io.load_config_dict(checkpoint))
        tokenizer = load_tokenizer(str(checkpoint / "tokenizer"))
        return cls(checkpoint, saved.model, saved.preset, tokenizer, meta.get("tokenizer_identity", tokenizer.identity))

    def configure(self, cfg):
        """A copy of cfg (a TrainConfig) whose model is the checkpoint's, with the run's RUN_FIELDS on top."""
        from redline.presets import PRESETS, get_preset

        if cfg.preset not in (DEFAULT_PRESET, self.preset):
            raise UserError(f"init_from={cfg.init_from} takes the model from its checkpoint ({self.preset}); drop "
                            f"--preset {cfg.preset}")
        # what the run asked for beyond its preset: the fields where its model differs from the preset's own
        base = get_preset(cfg.preset) if cfg.preset in PRESETS else self.model
        model = dataclasses.replace(self.model)
        allowed = RUN_FIELDS + (CONTEXT_FIELDS if self.model.pos_emb == "rope" else ())
        given = set()
        for f in dataclasses.fields(ModelConfig):
            asked, default = getattr(cfg.model, f.name), getattr(base, f.name)
            if asked == default or asked == getattr(self.model, f.name):
                continue
            if f.name not in allowed:
                raise UserError(f"model.{f.name}={asked} conflicts with init_from={cfg.init_from}, whose model has "
                                f"{f.name}={getattr(self.model, f.name)}; the architecture comes from the "
                                f"checkpoint: drop model.{f.name}"
                                + (" (a RoPE model's context can be extended; this one has "
                                   f"{self.model.pos_emb} positions)" if f.name in CONTEXT_FIELDS else ""))
            setattr(model, f.name, asked)
            given.add(f.name)
        if self.model.rope_scaling == "none" and "rope_scaling" in given and "rope_original_context" not in given:
            model.rope_original_context = self.model.context_len
        if given & set(CONTEXT_FIELDS):
            model.validate()  # the new RoPE settings checked as any config is
        return dataclasses.replace(cfg, model=model, preset=self.preset)

    def check_tokenizer(self, tokenizer, data_dir: Path) -> None:
        """The data's tokenizer must be the checkpoint's (the same text -> ids map)."""
        if tokenizer.identity != self.tokenizer_identity:
            raise UserError(f"the data in {data_dir} is tokenized with {tokenizer.spec or tokenizer.name} "
                            f"({tokenizer.identity[:12]}), but init_from={self.checkpoint} was trained with "
                            f"{self.checkpoint / 'tokenizer'} ({self.tokenizer_identity[:12]}); give raw text with "
                            f"--data.path (it is prepared with that tokenizer) or run `redline data prepare "
                            f"--tokenizer {self.checkpoint / 'tokenizer'}`")
        if tokenizer.vocab_size > self.model.vocab_size:
            raise UserError(f"the tokenizer of {data_dir} has {tokenizer.vocab_size} tokens, the model of "
                            f"{self.checkpoint} {self.model.vocab_size}")
