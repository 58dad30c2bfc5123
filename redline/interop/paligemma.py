"""PaliGemma's text model (PaliGemmaForConditionalGeneration, model_type "paligemma": PaliGemma 1 on a Gemma text
model, PaliGemma 2 on Gemma 2's), read as a prefix-LM (model.prefix_lm): the prompt attends to itself both ways,
the tokens after it causally.

How transformers' PaliGemmaModel computes it (models/paligemma/modeling_paligemma.py): the processor's
token_type_ids mark the image and prompt tokens 0 and a training suffix 1; on the first forward (no cache yet) the
tokens marked 0 form one block that sees itself bidirectionally, ORed over the causal (and, for Gemma 2's windowed
layers, the sliding-window) mask (masking_utils' blockwise_overlay); generated tokens are marked 1, so decoding is
causal over the prompt and what came after it. The labels leave the prefix out (-100 where token_type_ids is 0), so
training's loss is the suffix's alone. redline's prefix is each sequence's prompt: the engine's prefill makes it so,
and GPT.forward takes its length per row (prefix_len).

Positions are 1-indexed (position_ids = arange + 1): RoPE rotates q and k by the same offset, so the scores are
the 0-indexed ones. The logits are lm_head's, soft-capped by text_config's final_logit_softcapping where it gives
one (Gemma 2's), as Gemma2ForCausalLM's. text_config's use_bidirectional_attention (PaliGemmaConfig sets it true)
changes only what transformers' attention does without a mask (text with no token_type_ids under SDPA, which then
attends fully both ways, while eager attention stays causal): token_type_ids give the mask, and the prefix-LM is what
they mean. Image tokens' rows are replaced by the vision tower's features only where pixel values are given; the
tower and its projector are left unread (multimodal.py).

Import only: no architecture redline exports to attends a prefix both ways, and a PaliGemma folder needs a vision
tower redline does not hold (families.export_family refuses model.prefix_lm by name).
"""

from __future__ import annotations

from dataclasses import replace

from redline.interop import gemma, gemma2
from redline.interop.families import Family
from redline.interop.multimodal import multimodal_family


def _text(text: dict) -> dict:
    """PaliGemma's text config as Gemma's and Gemma 2's readers take it: use_bidirectional_attention read as the
    prefix-LM (model_config sets it), which the readers would otherwise refuse as attention bidirectional
    throughout."""
    return {k: v for k, v in text.items() if k != "use_bidirectional_attention"}


def _family() -> Family:
    text = multimodal_family("paligemma", "PaliGemmaForConditionalGeneration",
                             {"gemma": gemma.FAMILY, "gemma2": gemma2.FAMILY}, "gemma", adapt=_text)
    return replace(text, model_config=lambda hf: replace(text.model_config(hf), prefix_lm=True))


FAMILY = _family()
