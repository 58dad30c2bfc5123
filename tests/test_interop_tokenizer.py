"""Hugging Face tokenizer folders in redline's tokenizer, against transformers' own loading of the same folder: a
byte-level BPE (GPT-2 / Qwen / SmolLM style) and a SentencePiece-style BPE (Llama 2 / Mistral style, byte fallback,
BOS added) built in the test; encode with and without special tokens, decode, special ids; the identity hash and
stop ids kept through save and load."""

from __future__ import annotations

import pytest

from redline.tokenizer import load_tokenizer
from tests.interop_models import byte_level_tokenizer, sentencepiece_style_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = ["hello world, the model says hi", "Ünïcödé café 日本 1234\ttabs 🚀", "  two  spaces\n\nend ", "x", "",
         "says hi <|im_end|> and </s> written out"]
BUILDERS = {"byte_level": byte_level_tokenizer, "sentencepiece": sentencepiece_style_tokenizer}


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_encode_decode_equal_transformers(kind, tmp_path):
    folder = BUILDERS[kind](tmp_path)
    ours, theirs = load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    for text in TEXTS:
        # redline's encode keeps special tokens written in text as text; encode_with_specials reads them, as
        # transformers' tokenizer(text) does
        assert ours.encode_with_specials(text) == theirs(text, add_special_tokens=False)["input_ids"], text
        with_specials = theirs(text)["input_ids"]
        if "</s>" not in text and "<|im_end|>" not in text:
            assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text
            assert ours.encode(text, add_special_tokens=True) == with_specials, text
        ids = ours.encode(text)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
    assert ours.bos_id == theirs.bos_token_id
    assert ours.stop_ids == [theirs.eos_token_id]
    assert ours.vocab_size == len(theirs)
    if kind == "sentencepiece":
        assert ours.encode("hi", add_special_tokens=True)[0] == ours.bos_id  # BOS added, as Llama's tokenizer does


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_save_load_keeps_identity_stop_ids_and_transformers_view(kind, tmp_path):
    ours = load_tokenizer(BUILDERS[kind](tmp_path / "src"))
    ours.stop_ids = [ours.eot_id, 0]
    ours.save(tmp_path / "saved")
    again = load_tokenizer(tmp_path / "saved")
    assert again.identity == ours.identity and again.stop_ids == [ours.eot_id, 0]
    assert again.hf_config == ours.hf_config
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")
    for text in TEXTS:
        assert again.encode(text, add_special_tokens=True) == theirs(text)["input_ids"] or "</s>" in text \
            or "<|im_end|>" in text


def test_plain_tokenizers_keep_their_behaviour(tmp_path):
    """A tokenizer.json without tokenizer_config.json (as `redline tokenizer train` writes) has no BOS, no template
    and stops at its end-of-text token; its identity is what it was."""
    from redline.tokenizer import train_bpe

    tok = train_bpe(["some text to train on"] * 20, vocab_size=300)
    identity = tok.identity
    tok.save(tmp_path)
    assert not (tmp_path / "tokenizer_config.json").exists()
    again = load_tokenizer(tmp_path)
    assert again.identity == identity and again.bos_id is None and again.chat_template is None
    assert again.stop_ids == [again.eot_id]


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_generation_prompts_and_stop_tokens_are_the_tokenizers(kind, tmp_path):
    """TextGenerator encodes a prompt as transformers' tokenizer(text) does (an imported Llama-style tokenizer's
    BOS first) and stops at the tokenizer's stop ids; a tokenizer without encode_prompt / stop_ids (the tests'
    CharTokenizer) falls back to encode and its end-of-text token."""
    import torch

    from redline.inference import InferenceEngine
    from redline.inference.text import TextGenerator, prompt_ids, stop_token_ids
    from redline.model import GPT, ModelConfig

    folder = BUILDERS[kind](tmp_path)
    ours, theirs = load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    engine = InferenceEngine(GPT(ModelConfig(vocab_size=ours.vocab_size, context_len=32, n_layer=1, n_embd=32,
                                             n_head=2, n_kv_head=2)), dtype=torch.float32)
    calls = []
    real_generate = engine.generate

    def recording_generate(prompts, *args, **kwargs):
        calls.append((prompts, kwargs.get("stop_tokens")))
        return real_generate(prompts, *args, **kwargs)

    engine.generate = recording_generate
    text = "hello world, the model says hi"
    completion = TextGenerator(engine, ours).generate([text], 4)[0]
    assert calls[0][0] == [theirs(text)["input_ids"]]
    assert list(calls[0][1]) == ours.stop_ids == [theirs.eos_token_id]
    assert completion.prompt_tokens == len(theirs(text)["input_ids"])
    if kind == "sentencepiece":
        assert calls[0][0][0][0] == ours.bos_id
    # special tokens written in a prompt are those tokens, as in transformers' tokenizer(text)
    special = theirs.eos_token
    assert prompt_ids(ours, f"hi{special} there") == theirs(f"hi{special} there")["input_ids"]

    class Plain:  # only encode and eot_id
        eot_id = 7

        def encode(self, text):
            return [ord(c) % 7 for c in text]

    assert prompt_ids(Plain(), "ab") == [ord("a") % 7, ord("b") % 7] and stop_token_ids(Plain()) == [7]


def test_special_tokens_map_names_bos_and_eos_as_transformers_reads_it(tmp_path):
    """Older uploads name their special tokens in special_tokens_map.json, which transformers reads over
    tokenizer_config.json's: the chat template sees the same tokens and EOS stops generation."""
    import json

    from redline.chat.template import template_for

    folder = sentencepiece_style_tokenizer(tmp_path)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "eos_token": "<unk>",
        "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}"
                         "{% endfor %}"}))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": {"content": "<s>", "lstrip": False, "normalized": False}, "eos_token": "</s>",
        "unk_token": "<unk>"}))
    ours, theirs = load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(str(folder))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert template_for(ours).render(messages) == theirs.apply_chat_template(messages, tokenize=False)
    assert ours.stop_ids[0] == theirs.eos_token_id
