"""Models in and out of redline: Hugging Face folders, the Hub and GGUF files.

    families.py        Family: a Hugging Face model_type's config and weight-name maps; which family a model
                       imports from or exports as
    llama.py, gpt2.py  the weight maps: the Llama layout (Llama, Mistral, Qwen2, Qwen3) and GPT-2
    olmo2.py           OLMo 2's config (the Llama layout's names, its norms on the sublayers' outputs)
    gemma3.py          Gemma 3's text config (the same names; sandwich norms, windowed and full layers interleaved)
    gemma4.py          Gemma 4's text model (full layers' own heads, shared KV layers, per-layer inputs), and the text
                       model of its multimodal folders
    hf.py              Hugging Face folders (config.json, safetensors shards, tokenizer, generation config)
    gguf_file.py       GGUF files through the `gguf` package (dequantized on import; f32, f16, bf16, Q8_0, Q5/Q4 and
                       GPT-OSS's MXFP4 experts on export)
    gguf_vocab.py      a GGUF's tokenizer metadata <-> a tokenizers tokenizer
    hub.py             model names on the Hugging Face Hub (huggingface_hub's snapshot_download)
    tokenizer_files.py a redline tokenizer as tokenizer.json + tokenizer_config.json
    source.py          `read_source(SRC)`: whichever of the above SRC is, as an ImportedModel

Every conversion checks names and shapes against redline's own model, and each bad input is one UserError.
"""
