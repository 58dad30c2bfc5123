"""The text model of multimodal folders whose language model is a family redline already reads: Gemma 3's
Gemma3ForConditionalGeneration (model_type "gemma3", its text model gemma3_text: Gemma 3 4B, 12B, 27B), Mistral 3's
Mistral3ForConditionalGeneration (model_type "mistral3", its text model mistral or ministral3: Mistral Small 3.1 and
3.2, Magistral), Qwen3-VL's Qwen3VLForConditionalGeneration (model_type "qwen3_vl", its text model qwen3_vl_text,
read as qwen3), Apertus 1.5's Apertus1p5ForConditionalGeneration (model_type "apertus1p5", its text model
apertus1p5_text: apertus.py, whose image and audio tokens are ids of the text model's own vocabulary), Cohere
Compass's CohereCompassForConditionalGeneration (model_type "cohere_compass": North-Micro-Vision, Qwen3-VL's tower
and forward around cohere_compass_text: cohere.py, whose multimodal RoPE is plain RoPE on text as Qwen3-VL's is)
Aria's AriaForConditionalGeneration (model_type "aria", its text model aria_text: aria.py) and MiniMax-M3's
MiniMaxM3SparseForConditionalGeneration (model_type "minimax_m3_vl", its text model minimax_m3_vl_text:
minimax_m3.py, import only).

Qwen3-VL's text model is Qwen3's (QK-norm per head) with interleaved multimodal RoPE: each rotary frequency takes the
temporal, height or width position as mrope_section assigns it. On text alone the three are the token's one position
(transformers' Qwen3VLTextModel expands arange positions to all three where no image or video grid is given, and
recomposition_frequencies then chooses among equal frequencies), so the rotation is plain RoPE; its deepstack visual
embeddings are added to the first layers only where images are given.

Such a folder's config.json nests the text model's config under text_config, beside a vision_config; the text weights
sit under language_model.model. (Gemma 3's and Mistral 3's Hub folders, which transformers 5's save_pretrained still
writes) or model.language_model. (transformers 5's module names; Qwen3-VL's Hub folders), the head at lm_head,
language_model.lm_head or tied to the embedding. The vision tower and the projector into the text model's width are
left unread (hf.convert_source says so on stderr): a text-only prompt runs the text model alone, image tokens' rows
being replaced by image features only where pixel values are given (transformers' Gemma3Model, Mistral3Model and
Qwen3VLModel forwards). Imports export as the text-only family, which transformers loads as Gemma3ForCausalLM /
MistralForCausalLM / Qwen3ForCausalLM.

Whether the head is tied is the multimodal config's own tie_word_embeddings (true by default for Gemma 3 and Mistral
3, false for Qwen3-VL), which transformers 5 reads rather than text_config's, whatever text_config says.
transformers leaves a stored head that differs from the embedding untied whatever the config says, and so does redline
(Family.settle): a config.json that names no tying (true by default) beside a head of its own reads untied.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from redline.errors import UserError
from redline.interop.families import Family, TensorSource, raise_first
from redline.model import ModelConfig

_TEXT_PREFIXES = (("model.language_model.", "model."),  # transformers 5's module names (Qwen3-VL's Hub folders)
                  # Gemma 3's and Mistral 3's Hub folders, as save_pretrained still writes them
                  ("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."))
_TOWERS = ("model.vision_tower.", "vision_tower.", "model.multi_modal_projector.", "multi_modal_projector.",
           "model.visual.", "visual.",  # Gemma 3's and Mistral 3's; Qwen3-VL's tower and mergers
           # Apertus 1.5's image and audio tokenizers
           "model.vision_tokenizer.", "vision_tokenizer.", "model.audio_tokenizer.", "audio_tokenizer.",
           "patch_merge_mlp.", "model.patch_merge_mlp.")  # MiniMax-M3's patch merger, as its Hub folders name it


# The text config classes' defaults for the fields redline reads, which transformers fills in where a folder's
# text_config leaves them out (save_pretrained writes a nested config's fields that differ from them; Gemma 3's Hub
# folders give no vocab_size, for one): Gemma3TextConfig's, MistralConfig's, Qwen3VLTextConfig's
_TEXT_DEFAULTS = {
    "gemma3_text": dict(vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                        num_attention_heads=8, num_key_value_heads=4, head_dim=256, max_position_embeddings=131_072,
                        rms_norm_eps=1e-6, query_pre_attn_scalar=256, sliding_window=4096),
    "mistral": dict(vocab_size=32_000, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131_072, rms_norm_eps=1e-6,
                    sliding_window=4096),
    "qwen3_vl_text": dict(vocab_size=151_936, hidden_size=4096, intermediate_size=22_016, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=32, head_dim=128,
                          max_position_embeddings=128_000, rms_norm_eps=1e-6, rope_theta=500_000.0),
}


def text_config(hf: dict, tie_default: bool = True) -> dict:
    """The text model's config: text_config, its class's defaults where it leaves a field out (_TEXT_DEFAULTS), with
    the head's tying the multimodal config's, else its class's default (tie_default): transformers' tie_weights reads
    the top-level config's flag, which text_config's does not set; or hf itself where it nests none."""
    if "text_config" not in hf:
        return hf
    given = hf["text_config"]
    text = {**_TEXT_DEFAULTS.get(given.get("model_type"), {}), **given}
    text["tie_word_embeddings"] = bool(hf.get("tie_word_embeddings", tie_default))
    return text


def text_view(src: TensorSource) -> TensorSource:
    """src with the text model's tensors read under the text-only names (model.*, lm_head.weight); the rest (vision
    tower, projector) keep their names and are left unread. Qwen3.5's, Gemma 4's and Llama 4's multimodal folders
    are read through it too."""
    names = {}
    for n in src.names:
        for theirs, ours in _TEXT_PREFIXES:
            if n.startswith(theirs):
                names[ours + n[len(theirs):]] = n
                break
        else:
            names[n] = n
    return TensorSource(names, lambda name: src.take(names[name]), src.where)


def is_tower(name: str) -> bool:
    """A tensor of the vision tower or of the projector from it into the text model, which text does not run."""
    return name.startswith(_TOWERS)


def _stored_head_differs(src: TensorSource) -> bool:
    """Whether the folder stores a head with values other than the embedding's."""
    if "lm_head.weight" not in src or "model.embed_tokens.weight" not in src:
        return False
    head, embedding = src.take("lm_head.weight"), src.take("model.embed_tokens.weight")
    return head.shape != embedding.shape or not torch.equal(head, embedding)


def multimodal_family(name: str, architecture: str, text_families: dict[str, Family], default_text: str,
                      check: Callable[[dict], None] = lambda hf: None, tie_default: bool = True) -> Family:
    """The Family of a multimodal folder (model_type `name`) whose text model is one of `text_families` (by
    text_config's model_type, `default_text` where it names none; all of them must share their tensor names);
    check(hf) raises a UserError for a multimodal config whose text model is not the text family's."""
    text = text_families[default_text]

    def model_config(hf: dict) -> ModelConfig:
        kind = hf.get("text_config", {}).get("model_type", default_text)
        raise_first([(kind not in text_families,
                      f"text_config.model_type={kind!r}: redline reads a {name} folder's text model as "
                      f"{' or '.join(sorted(text_families))}")])
        check(hf)
        if "text_config" in hf:  # its class's defaults by the model_type it names or implies
            hf = {**hf, "text_config": {"model_type": kind, **hf["text_config"]}}
        return text_families[kind].model_config(text_config(hf, tie_default))

    def settle(hf: dict, src: TensorSource) -> dict:
        """hf untied where it ties the head but the folder stores one of other values, as transformers reads it
        (PreTrainedModel.tie_weights leaves such a pair apart)."""
        if text_config(hf, tie_default)["tie_word_embeddings"] and _stored_head_differs(text_view(src)):
            return {**hf, "tie_word_embeddings": False}
        return hf

    def to_redline(src: TensorSource, cfg: ModelConfig) -> dict:
        return text.to_redline(text_view(src), cfg)

    def ignorable(n: str) -> bool:
        return is_tower(n) or text.ignorable(n)

    return Family(name=name, architecture=architecture, model_config=model_config, hf_config=text.hf_config,
                  to_redline=to_redline, to_hf=text.to_hf, ignorable=ignorable, settle=settle)


def _check_gemma3(hf: dict) -> None:
    """Gemma3ForConditionalGeneration computes its logits with lm_head alone: a final_logit_softcapping its text
    config gives is applied by Gemma3ForCausalLM and not by it, so such a file names no one model."""
    cap = hf.get("text_config", {}).get("final_logit_softcapping")
    raise_first([(cap is not None, f"text_config.final_logit_softcapping={cap}: transformers' "
                                   f"Gemma3ForConditionalGeneration leaves it out and its text model "
                                   f"(Gemma3ForCausalLM) applies it, so the file names no one model")])


def families() -> tuple[Family, ...]:
    """The multimodal families: gemma3 (text model gemma3_text), mistral3 (mistral or ministral3), qwen3_vl
    (qwen3), apertus1p5 (apertus1p5_text: apertus.py), cohere_compass (cohere_compass_text: cohere.py), aria
    (aria_text: aria.py), minimax_m3_vl (minimax_m3_vl_text: minimax_m3.py)."""
    from redline.interop import apertus, aria, cohere, gemma3, llama, minimax_m3

    llamas = {f.name: f for f in llama.FAMILIES}
    return (multimodal_family("gemma3", "Gemma3ForCausalLM", {"gemma3_text": gemma3.FAMILY}, "gemma3_text",
                              _check_gemma3),
            multimodal_family("mistral3", "MistralForCausalLM",
                              {"mistral": llamas["mistral"], "ministral3": llama.MINISTRAL3_FAMILY}, "mistral"),
            multimodal_family("qwen3_vl", "Qwen3ForCausalLM", {"qwen3_vl_text": llamas["qwen3"]}, "qwen3_vl_text",
                              tie_default=False),
            multimodal_family("apertus1p5", "Apertus1p5TextForCausalLM",
                              {"apertus1p5_text": apertus.TEXT_1P5_FAMILY}, "apertus1p5_text", tie_default=False),
            multimodal_family("cohere_compass", "CohereCompassForCausalLM",
                              {"cohere_compass_text": cohere.COMPASS_FAMILY}, "cohere_compass_text",
                              tie_default=False),
            multimodal_family("aria", "AriaTextForCausalLM", {"aria_text": aria.FAMILY}, "aria_text",
                              tie_default=False),
            multimodal_family("minimax_m3_vl", "MiniMaxM3VLForCausalLM", {"minimax_m3_vl_text": minimax_m3.FAMILY},
                              "minimax_m3_vl_text", tie_default=False))

