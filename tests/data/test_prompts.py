"""Prompt templates: wording contracts, the chat template, the registry and tokenization."""

from __future__ import annotations

import pytest

from zerotir.data import prompts
from zerotir.data.prompts import get_template, register_template, render_prompt, template_names, tokenize_prompts
from zerotir.toy.tokenizer import build_byte_tokenizer

PROBLEM = "Let $f(x) = x^{2}$. Find $f(3)$ where {braces} stay as written."

# A minimal chat template (the byte tokenizer has none): one line per message, then the assistant's turn.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def shout(problem: str, tokenizer: object = None) -> str:
    """A template referenced as 'tests.data.test_prompts:shout'."""
    return problem.upper()


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prompts, "_REGISTRY", dict(prompts._REGISTRY))


def test_orz_tool_prompt() -> None:
    text = render_prompt("orz_tool", PROBLEM)
    assert text.startswith("A conversation between User and Assistant.")
    assert "\nUser: " in text and "\nAssistant: " in text
    assert "Python" in text and "executed" in text and "```python" in text
    assert "\\boxed{...}" in text  # the literal instruction, not a format placeholder
    assert PROBLEM in text  # braces in the problem are kept verbatim
    assert text.endswith("Assistant: <think>")
    assert text.index("User: ") < text.index(PROBLEM) < text.index("Assistant: <think>")


def test_plain_prompt() -> None:
    text = render_prompt("plain", PROBLEM)
    assert PROBLEM in text and "\\boxed{}" in text
    assert "Python" not in text


def test_chat_prompt_uses_the_tokenizer_template() -> None:
    tok = build_byte_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    text = render_prompt("chat", PROBLEM, tokenizer=tok)
    expected = f"<|system|>{prompts.CHAT_SYSTEM_PROMPT}\n<|user|>{PROBLEM}\n<|assistant|>"
    assert text == expected
    assert "Python" in prompts.CHAT_SYSTEM_PROMPT and "\\boxed{}" in prompts.CHAT_SYSTEM_PROMPT
    assert get_template("chat").add_special_tokens is False


def test_chat_prompt_needs_a_chat_template() -> None:
    with pytest.raises(ValueError, match="chat template"):
        render_prompt("chat", PROBLEM, tokenizer=build_byte_tokenizer())
    with pytest.raises(ValueError, match="chat template"):
        render_prompt("chat", PROBLEM)


def test_unknown_template_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown prompt template 'nope'; valid names: chat, orz_tool, plain"):
        render_prompt("nope", PROBLEM)


def test_register_template() -> None:
    register_template("custom", lambda problem, tokenizer=None: f"Q: {problem}\nA:")
    assert "custom" in template_names()
    assert render_prompt("custom", "1+1") == "Q: 1+1\nA:"
    with pytest.raises(ValueError, match="already registered"):
        register_template("custom", lambda problem, tokenizer=None: problem)
    register_template("custom", lambda problem, tokenizer=None: problem + "!", overwrite=True)
    assert render_prompt("custom", "1+1") == "1+1!"


def test_template_by_import_path() -> None:
    assert render_prompt("tests.data.test_prompts:shout", "abc") == "ABC"
    assert "tests.data.test_prompts:shout" in template_names()
    with pytest.raises(ValueError, match="cannot import"):
        render_prompt("tests.data.test_prompts:missing", "abc")


def test_tokenize_prompts_byte_tokenizer() -> None:
    tok = build_byte_tokenizer()
    texts = [render_prompt("orz_tool", PROBLEM), render_prompt("plain", "é")]
    ids = tokenize_prompts("orz_tool", texts, tok)
    # One token per byte and no special tokens added by this tokenizer: ids are byte + 3.
    assert ids[1] == [b + 3 for b in texts[1].encode()]
    assert len(ids[0]) == len(texts[0].encode())
    assert tok.decode(ids[0]) == texts[0]
    assert tokenize_prompts("orz_tool", [], tok) == []
