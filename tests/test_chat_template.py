"""Chat templates rendered by redline/chat exactly as transformers' apply_chat_template renders them: ChatML
(Qwen-style, default system message), Llama 3 (bos_token, strftime_now, trim), Llama 2 / Mistral (raise_exception on
roles that do not alternate, a system message folded into the first turn), and one with tools, tojson, namespace
and loop controls; the rendered text tokenized as apply_chat_template tokenizes it; errors as one line."""

from __future__ import annotations

import json

import pytest

from redline.chat import ChatTemplate, template_for
from redline.errors import UserError
from redline.tokenizer import load_tokenizer
from tests.interop_models import byte_level_tokenizer

transformers = pytest.importorskip("transformers")

CHATML = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'system' and loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"
)
LLAMA3 = (
    "{{- bos_token }}\n"
    "{%- if not date_string is defined %}{%- set date_string = strftime_now(\"%d %b %Y\") %}{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = \"\" %}\n"
    "{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{{- system_message }}\n"
    "{{- \"<|eot_id|>\" }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)
LLAMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
TOOLS = (
    "{%- set ns = namespace(last_user=0, count=0) %}\n"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}\n"
    "{%- if tools %}{{ 'Tools:\\n' + (tools | tojson(indent=2)) + '\\n' }}{%- endif %}\n"
    "{%- for m in messages %}\n"
    "  {%- if loop.index0 > ns.last_user %}{% break %}{% endif %}\n"
    "  {%- if m.content is none or m.content == '' %}{% continue %}{% endif %}\n"
    "  {%- set ns.count = ns.count + 1 %}\n"
    "{{ ns.count }}. {{ m.role }}: {{ m.content }}\n"
    "{%- endfor %}\n"
    "{{ {'note': '<b>&\\'x\\''} | tojson }}{{ dict(a=1) | tojson(sort_keys=true) }}"
    "{% if enable_thinking is defined and not enable_thinking %} /no_think{% endif %}"
)
TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "llama2": LLAMA2, "tools": TOOLS}

CONVERSATIONS = {
    "user only": [{"role": "user", "content": "Hello there!"}],
    "system + turns": [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "2+2?"},
                       {"role": "assistant", "content": " 4 "}, {"role": "user", "content": "Ünïcödé 日本 🚀?"}],
    "none content": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", "tool_calls": None}],
}
TOOL_SCHEMA = [{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & later",
                                                 "parameters": {"type": "object",
                                                                "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """(redline tokenizer, transformers tokenizer) of one folder, per template."""
    out = {}
    for name, template in TEMPLATES.items():
        folder = byte_level_tokenizer(tmp_path_factory.mktemp(name), template=template)
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["bos_token"] = "<|endoftext|>"
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        out[name] = (load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder))
    return out


@pytest.mark.parametrize("template", list(TEMPLATES))
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_rendering_equals_apply_chat_template(template, conversation, add_generation_prompt, tokenizers):
    ours, theirs = tokenizers[template]
    messages = CONVERSATIONS[conversation]
    kwargs = {"tools": TOOL_SCHEMA, "enable_thinking": False} if template == "tools" else {}
    try:
        expected = theirs.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                              **kwargs)
    except Exception as e:  # the template refuses this conversation: redline must refuse it with the same message
        with pytest.raises(UserError, match=str(e)[:40].replace("(", r"\(").replace(".", r"\.")):
            template_for(ours).render(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        return
    text = template_for(ours).render(messages, add_generation_prompt=add_generation_prompt, **kwargs)
    assert text == expected
    ids = theirs.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                     return_dict=False, **kwargs)
    assert ours.encode_with_specials(text) == list(ids)


def test_raise_exception_is_one_line_user_error(tokenizers):
    ours, theirs = tokenizers["llama2"]
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(Exception, match="Conversation roles must alternate"):
        theirs.apply_chat_template(bad, tokenize=False)
    with pytest.raises(UserError, match="refused the conversation: Conversation roles must alternate") as e:
        template_for(ours).render(bad)
    assert "\n" not in str(e.value)


def test_bad_templates_and_messages():
    with pytest.raises(UserError, match="does not parse"):
        ChatTemplate("{% for m in messages %}{{ m }")
    template = ChatTemplate(CHATML)
    with pytest.raises(UserError, match="empty"):
        template.render([])
    with pytest.raises(UserError, match="message 0 is not an object"):
        template.render(["hi"])
    with pytest.raises(UserError, match="refused"):  # the sandbox: no access to Python internals
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([{"role": "user", "content": "x"}])
    with pytest.raises(UserError, match="refused"):
        ChatTemplate("{% set ns = namespace() %}{% set ns._x = 1 %}").render([{"role": "user", "content": "x"}])


def test_no_template_is_a_clear_error(tmp_path):
    tok = load_tokenizer(byte_level_tokenizer(tmp_path, template=None))
    with pytest.raises(UserError, match="no chat template"):
        template_for(tok)


def test_generation_spans_cover_the_assistant_text():
    source = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}"
              "{{ m.content }}<|im_end|>{% endgeneration %}{% else %}{{ m.content }}<|im_end|>{% endif %}\n"
              "{% endfor %}")
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "six"}]
    text, spans = ChatTemplate(source).render_with_generation_spans(messages)
    assert text == ChatTemplate(source).render(messages)
    assert [text[a:b] for a, b in spans] == ["4<|im_end|>", "six<|im_end|>"]


def test_template_travels_with_saved_tokenizer(tmp_path):
    """Saved by redline, the folder loads in transformers with the same template, specials and ids."""
    tok = load_tokenizer(byte_level_tokenizer(tmp_path / "src", template=LLAMA2))
    tok.stop_ids = [2, 0]
    tok.save(tmp_path / "saved")
    again = load_tokenizer(tmp_path / "saved")
    assert again.chat_template == LLAMA2 and again.stop_ids == [2, 0] and again.identity == tok.identity
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert theirs.chat_template == LLAMA2 and theirs.eos_token == "<|im_end|>"
