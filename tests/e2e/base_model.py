"""A tiny base model for the end-to-end tests, pretrained in seconds so that RL has something to learn from.

A random model never writes a correct ``\\boxed{}`` answer, so every reward is 0, every advantage is 0 and nothing
changes: useless for checking an update. This one is pretrained on one-digit additions in its own prompt, answered
either in text by restating the sum (``3 + 4 = \\boxed{7}``) or through a tool call (code block, output block, then
the restated answer), exactly the text the tool loop produces with ``ToolConfig``'s default fences. After a few hundred
steps it writes both forms, sometimes right and sometimes wrong, so rewards vary within a prompt group and
every algorithm has a signal.

The formats are defined here, not borrowed from the toy world, so that the tests do not depend on how the toy corpus
evolves; the cache stamp holds a sample document, so any change of format rebuilds the model.

As the toy base's, its schedule is a function of the step alone (a fixed step count, a linear decay over it), never
of wall time, so a loaded machine builds the same model, only later; the seconds it took are recorded, not used.

The suite does not pretrain it: ``data/e2e_base`` ships it (``ship``: the pretrained weights stored in float16, under
1 MB, with ``SHA256SUMS``), and ``unpack`` verifies that folder and writes the float32 model the tests load (the
float16 values, exactly). Its stamp holds the settings and the sample document it was built with; when they differ
from the ones here, ``unpack`` fails naming the command that rebuilds it:
``python -m tests.e2e.base_model --out data/e2e_base``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch

from zerotir.config import ToolConfig
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer

# Measured with the real tool loop at temperature 1 (16 prompts x 4 samples): 53% correct, 37% of responses call the
# tool, 13 of 16 prompt groups mixed (neither all right nor all wrong); ~1 minute of pretraining on one free core.
SETTINGS = {"seed": 0, "steps": 400, "batch_size": 16, "lr": 3e-3, "hidden_size": 128, "num_layers": 2,
            "num_heads": 4, "intermediate_size": 256, "code_share": 0.5, "version": 2}
PROMPT = "Q: {problem} = ? (Python allowed; answer in \\boxed{{}})\nA: "
TEMPLATE = "tests.e2e.base_model:prompt"  # the data module's template name for this prompt
SHIPPED = Path(__file__).resolve().parents[2] / "data" / "e2e_base"
SHIPPED_NAME = "data/e2e_base"
STAMP, CHECKSUMS = "e2e_base.json", "SHA256SUMS"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
REBUILD = f"python -m tests.e2e.base_model --out {SHIPPED_NAME}"


def prompt(problem: str, tokenizer: object | None = None) -> str:
    """The prompt of one question (a template function for ``zerotir.data.prompts``)."""
    return PROMPT.format(problem=problem)


def problem(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(10), rng.randrange(10)
    return f"{a} + {b}", str(a + b)


def answer_text(question: str, answer: str, use_code: bool) -> str:
    """What follows the prompt: optionally a tool call and its injected output, then the restated boxed answer."""
    tool = ToolConfig()
    text = ""
    if use_code:
        text = f"{tool.code_start}\nprint({question})\n{tool.code_end}" + tool.output_template.format(output=answer)
    return text + f"{question} = \\boxed{{{answer}}}"


def document(rng: random.Random, code_share: float) -> str:
    question, answer = problem(rng)
    return prompt(question) + answer_text(question, answer, rng.random() < code_share)


def write_problems(path: Path, n: int, seed: int) -> Path:
    """``n`` rows ``{"id", "problem", "answer"}`` of one-digit additions."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        question, answer = problem(rng)
        rows.append({"id": f"add-{seed}-{i}", "problem": question, "answer": answer})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def pretrain(out_dir: Path, settings: dict = SETTINGS) -> Path:
    """Train and save the base (model + tokenizer) to ``out_dir``; reuse it when the settings match."""
    stamp = out_dir / "e2e_base.json"
    sample = document(random.Random(0), 1.0)
    if stamp.is_file() and json.loads(stamp.read_text()).get("key") == [settings, sample]:
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_byte_tokenizer()
    model = build_tiny_model(tok, seed=settings["seed"], hidden_size=settings["hidden_size"],
                             num_layers=settings["num_layers"], num_heads=settings["num_heads"],
                             intermediate_size=settings["intermediate_size"])
    rng = random.Random(settings["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=settings["lr"])
    start = time.perf_counter()
    model.train()
    for step in range(settings["steps"]):
        docs = [document(rng, settings["code_share"]) for _ in range(settings["batch_size"])]
        enc = [tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for d in docs]
        width = max(map(len, enc))
        ids = torch.tensor([e + [tok.pad_token_id] * (width - len(e)) for e in enc])
        attn = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in enc])
        labels = ids.masked_fill(attn == 0, -100)
        for group in opt.param_groups:  # linear decay to 10%
            group["lr"] = settings["lr"] * (1 - 0.9 * step / settings["steps"])
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    record = {"key": [settings, sample], "final_loss": loss.item(), "seconds": time.perf_counter() - start}
    stamp.write_text(json.dumps(record, indent=2))
    return out_dir


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ship(out_dir: Path) -> Path:
    """Pretrain the base and write it to ``out_dir`` as shipped: float16 weights, the tokenizer, the stamp and
    ``SHA256SUMS`` (``sha256sum -c`` format) over every other file. One torch thread, as the e2e tests run."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        built = pretrain(Path(tmp))
        model = AutoModelForCausalLM.from_pretrained(str(built), dtype=torch.float32)
        out_dir.mkdir(parents=True, exist_ok=True)
        model.to(torch.float16).save_pretrained(str(out_dir))
        for name in (*TOKENIZER_FILES, STAMP):
            shutil.copy(built / name, out_dir / name)
    names = sorted(p.name for p in out_dir.iterdir() if p.is_file() and p.name != CHECKSUMS)
    (out_dir / CHECKSUMS).write_text("".join(f"{_sha256(out_dir / n)}  {n}\n" for n in names))
    return out_dir


def unpack(dest: Path, shipped: Path = SHIPPED) -> Path:
    """Verify the shipped base (its checksums, and that its stamp is this module's settings and formats) and write
    it to ``dest`` in float32, the dtype the tests train in.

    Raises:
        AssertionError: a file is missing or differs from ``SHA256SUMS``, or the stamp is another recipe's; the
            message names the command that rebuilds the shipped base.
    """
    from transformers import AutoModelForCausalLM

    sums = shipped / CHECKSUMS
    assert sums.is_file(), f"{shipped}: no {CHECKSUMS}; restore it (`git checkout -- {SHIPPED_NAME}`) or run {REBUILD}"
    for line in sums.read_text().splitlines():
        expected, _, name = line.partition("  ")
        assert (shipped / name).is_file() and _sha256(shipped / name) == expected, \
            f"{shipped / name}: missing or changed since {CHECKSUMS} was written; restore it or run {REBUILD}"
    key = json.loads((shipped / STAMP).read_text())["key"]
    assert key == json.loads(json.dumps([SETTINGS, document(random.Random(0), 1.0)])), \
        f"{shipped} was built with other settings or formats than tests/e2e/base_model.py's; run {REBUILD}"
    model = AutoModelForCausalLM.from_pretrained(str(shipped), dtype=torch.float32)
    model.save_pretrained(str(dest))
    for name in (*TOKENIZER_FILES, STAMP):
        shutil.copy(shipped / name, dest / name)
    return dest


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Pretrain the e2e tests' base and write it as shipped.")
    parser.add_argument("--out", type=Path, required=True, help=f"the folder to write ({SHIPPED_NAME} is shipped)")
    print(ship(parser.parse_args().out))
