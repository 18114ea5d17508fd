"""Prompt data: files (JSONL / Parquet / a ``datasets`` dataset / a bundled benchmark) -> rendered, tokenized prompts.

A source is named in config as one of:
    * a bundled name (``math500``, ``aime24``, ... see ``BUNDLED``), read from the repo's ``data/`` folder
      (``$ZEROTIR_DATA_DIR`` overrides it). Bundled files always use the fields ``id`` / ``problem`` / ``answer``;
    * a path ending in ``.jsonl`` / ``.json`` (one object per line) or ``.parquet``;
    * ``hf:<dataset>[:<split>]``, loaded with ``datasets.load_dataset`` if that package is installed.

Rows are validated up front: a missing or empty problem / answer field raises with the file, the line (JSONL, 1-based)
or row (Parquet / datasets, 0-based) and the field name. Prompts longer than ``max_prompt_tokens`` are dropped, with
a warning giving the count per source (kept in ``PromptDataModule.dropped``): an over-long prompt cannot be generated
from within the budget, and dropping keeps a run going where one long problem would otherwise stop it.

Batches are plain lists of dicts (no tensors): ``{"id", "problem", "answer", "prompt_text", "prompt_ids", "source"}``,
plus ``"batch_index"`` and ``"position"`` on training rows. Training reads an endless, seeded stream, reshuffled
every epoch (``zerotir.data.stream``): the rollout source reads it (``train_batches``, ``train_batch``) and the train
loader only ticks Lightning's steps. The data position follows *consumption* (``mark_rows``, ``mark_consumed``),
so a resumed run continues with exactly the prompts not yet seen.
"""

from __future__ import annotations

import logging
import os
import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, IterableDataset

from zerotir.data.readers import read_hf, read_jsonl, read_parquet, row_field
from zerotir.data.prompts import build_prompts, check_template
from zerotir.data.curriculum import Curriculum, CurriculumConfig, Outcome
from zerotir.data.stream import Consumption, PromptStream, row_copy

logger = logging.getLogger(__name__)

# Bundled sources: config name -> file under data/ (see data/README.md for origins and licenses).
BUNDLED: dict[str, str] = {
    "math500": "math500_test.jsonl", "aime24": "aime24_test.jsonl", "aime25": "aime25_test.jsonl",
    "amc23": "amc23_test.jsonl", "gsm8k": "gsm8k_test.jsonl", "minerva": "minerva_math_test.jsonl",
    "olympiadbench": "olympiadbench_test.jsonl", "simplelr_math_level3to5": "simplelr_math_level3to5_train.jsonl",
    "gsm8k_train": "gsm8k_train.jsonl",
}
BENCHMARKS = ("math500", "aime24", "aime25", "amc23", "gsm8k", "minerva", "olympiadbench")


def data_dir() -> Path:
    """The folder of the bundled files: ``$ZEROTIR_DATA_DIR`` or the repo's ``data/``."""
    return Path(os.environ.get("ZEROTIR_DATA_DIR") or Path(__file__).resolve().parents[2] / "data")


def source_name(spec: str) -> str:
    """The short name of a source: the bundled name, the file stem, or the dataset name (with its split)."""
    if spec in BUNDLED:
        return spec
    if spec.startswith("hf:"):
        return spec[3:].replace("/", "_").replace(":", "_")
    return Path(spec).name.split(".")[0]


def load_rows(spec: str, problem_field: str = "problem", answer_field: str = "answer", id_field: str = "id",
              default_split: str = "test", limit: int | None = None) -> list[dict[str, str]]:
    """Read and validate one source into ``[{"id", "problem", "answer"}]``, plus ``"kind"`` where a row has one.

    Args:
        spec: a bundled name, a JSONL / Parquet path, or ``hf:<dataset>[:<split>]``.
        problem_field / answer_field / id_field: field names in the source (bundled files use the defaults).
            A row without an id gets ``"<source name>-<index>"``.
        default_split: the split of an ``hf:`` source that names none.
        limit: keep only the first ``limit`` rows.

    Raises:
        ValueError: a missing / empty problem or answer (with file and line), bad JSON, an unknown file type.
        FileNotFoundError: the file does not exist.
    """
    if spec in BUNDLED:
        path = data_dir() / BUNDLED[spec]
        problem_field, answer_field, id_field = "problem", "answer", "id"
        reader = read_jsonl(path)
    elif spec.startswith("hf:"):
        path, reader = None, read_hf(spec, default_split)
    else:
        path = Path(spec)
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".json"):
            reader = read_jsonl(path)
        elif suffix == ".parquet":
            reader = read_parquet(path)
        else:
            raise ValueError(f"data source {spec!r}: unknown file type {suffix!r}; use .jsonl or .parquet, "
                             f"'hf:<dataset>', or a bundled name ({', '.join(BUNDLED)})")
    if path is not None and not path.is_file():
        raise FileNotFoundError(f"data source {spec!r}: no file at {path}")
    name = source_name(spec)
    rows = []
    for where, obj in reader:
        if limit is not None and len(rows) >= limit:
            break
        problem = row_field(obj, problem_field, where)
        answer = row_field(obj, answer_field, where).strip()
        row_id = obj.get(id_field) if isinstance(obj, dict) else None
        rows.append({"id": str(row_id) if row_id not in (None, "") else f"{name}-{len(rows)}",
                     "problem": problem, "answer": answer})
        if isinstance(obj, dict) and obj.get("kind") not in (None, ""):  # data.curriculum, the per-kind metrics
            rows[-1]["kind"] = str(obj["kind"])
    if not rows:
        raise ValueError(f"data source {spec!r} has no rows")
    return rows


def batch_fields(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """``prompts``, ``problem_ids``, ``sources``, ``kinds`` ("": none) of a batch's rows (index = group id)."""
    return {"prompts": [r["prompt_text"] for r in rows], "problem_ids": [str(r["id"]) for r in rows],
            "sources": [r["source"] for r in rows], "kinds": [r.get("kind", "") for r in rows]}


class _ListDataset(Dataset):
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return row_copy(self.rows[i])


class _Ticks(IterableDataset):
    """The train loader's items: 0, 1, 2, ... one per step, endless (``max_steps`` ends the run)."""

    def __iter__(self) -> Iterator[int]:
        return itertools.count()


class PromptDataModule(LightningDataModule):
    """Prompts for training (an endless seeded stream), validation and test (one loader per source).

    Args:
        train_files: training sources (bundled names, JSONL / Parquet paths, ``hf:<dataset>[:<split>]``); rows of all
            sources are pooled into one stream.
        val_files: validation sources, one dataloader each (names in ``val_names``).
        test_files: test sources, one dataloader each (names in ``test_names``); default: the 7 bundled benchmarks.
        problem_field: field holding the problem in user files.
        answer_field: field holding the reference answer in user files.
        id_field: field holding a row id in user files (optional in the rows).
        template: prompt template: "orz_tool" (ZeroTIR's prompt for a base model), "plain" (without the tool
            sentence), "chat" (the tokenizer's chat template, for an instruct model), "toy" (the toy world's), or
            "package.module:function" of your own (docs/data.md).
        tokenizer: path of a tokenizer (an HF model folder); or call ``set_tokenizer`` before ``setup``.
        tools: the tools the prompt describes (``model.tool.tools`` under a format whose calls name their tool,
            hermes or chat: linked), else None.
        tool_format: the call format that writes its part of the prompt (``model.tool.format``, linked by
            ``zerotir.cli.app``): a built-in name or a ``{class_path, init_args}`` entry.
        chat_template_kwargs: given to the chat template of a ``chat`` prompt (``model.tool.chat_template_kwargs``,
            linked).
        prompts_per_step: prompts per training batch.
        eval_prompts_per_batch: prompts per validation / test batch.
        max_prompt_tokens: prompts with more tokens are dropped with a warning (counts in ``dropped``); None = keep all.
        seed: seed of the training shuffle.
        limit_val_rows: use only the first N rows of each validation source.
        limit_test_rows: use only the first N rows of each test source.
        curriculum: stages of kinds / files with weights and switch rules (``zerotir.data.curriculum``; docs/data.md);
            None: one stream of all training rows.
    """

    def __init__(self, train_files: list[str] | None = None, val_files: list[str] | None = None,
                 test_files: list[str] | None = None, problem_field: str = "problem", answer_field: str = "answer",
                 id_field: str = "id", template: str = "orz_tool", tokenizer: str | None = None,
                 tools: list[dict[str, Any]] | None = None, tool_format: str | dict[str, Any] = "fences",
                 chat_template_kwargs: dict[str, Any] | None = None, prompts_per_step: int = 128,
                 eval_prompts_per_batch: int = 64, max_prompt_tokens: int | None = 1024, seed: int = 0,
                 limit_val_rows: int | None = None, limit_test_rows: int | None = None,
                 curriculum: CurriculumConfig | None = None) -> None:
        super().__init__()
        # ``seed`` stays out of the logged hyperparameters: the module has its own ``seed`` (rollout sampling), and
        # Lightning refuses to log two different values under one name. That happens when `test --ckpt_path` takes
        # the module's hyperparameters from a checkpoint trained with another seed. The data seed is in the saved
        # config and in this module's checkpoint state.
        self.save_hyperparameters(ignore=["seed"])
        if prompts_per_step < 1 or eval_prompts_per_batch < 1:
            raise ValueError("prompts_per_step and eval_prompts_per_batch must be >= 1")
        # Fail at construction: an unknown name, tools it cannot show, a format it cannot write, kwargs it ignores.
        check_template(template, tools, tool_format, chat_template_kwargs)
        self.train_files = list(train_files or [])
        self.val_files = list(val_files or [])
        self.test_files = list(test_files) if test_files is not None else list(BENCHMARKS)
        self.fields = {"problem_field": problem_field, "answer_field": answer_field, "id_field": id_field}
        self.template, self.tokenizer_path, self.tools, self.tool_format = template, tokenizer, tools, tool_format
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.prompts_per_step, self.eval_prompts_per_batch = prompts_per_step, eval_prompts_per_batch
        self.max_prompt_tokens, self.seed = max_prompt_tokens, seed
        self.limits = {"val": limit_val_rows, "test": limit_test_rows}
        self.curriculum = curriculum
        self.tokenizer: Any = None
        self.dropped: dict[str, int] = {}  # source name -> prompts dropped as too long
        self.train_rows: list[dict[str, Any]] | None = None
        self.eval_rows: dict[str, dict[str, list[dict[str, Any]]]] = {}  # "val" / "test" -> name -> rows
        self._consumed = Consumption(prompts_per_step)
        self._pending_state: dict[str, Any] | None = None
        self._stream: PromptStream | None = None  # the training stream, read by the rollout source
        self._step_outcomes: list[Outcome] = []  # the step's results (data.curriculum), for its metrics
        self._step_stage = 0

    @property
    def val_names(self) -> list[str]:
        """Names of the validation dataloaders, in order."""
        return _unique_names(self.val_files, "val_files")

    @property
    def test_names(self) -> list[str]:
        """Names of the test dataloaders (benchmarks), in order."""
        return _unique_names(self.test_files, "test_files")

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Use an already-loaded tokenizer (e.g. the policy's) instead of loading ``tokenizer`` from a path."""
        self.tokenizer = tokenizer

    def _get_tokenizer(self) -> Any:
        if self.tokenizer is None:
            if self.tokenizer_path is None:
                raise ValueError("PromptDataModule needs a tokenizer: set data.tokenizer to a tokenizer / model folder "
                                 "or call set_tokenizer() before setup()")
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        return self.tokenizer

    def _prepare(self, spec: str, split: str, limit: int | None) -> list[dict[str, Any]]:
        rows = load_rows(spec, default_split=split, limit=limit, **self.fields)
        name = source_name(spec)
        kept, dropped = build_prompts(rows, name, self.template, self._get_tokenizer(), self.max_prompt_tokens,
                                      self.tools, self.tool_format, self.chat_template_kwargs)
        self.dropped[name] = dropped
        return kept

    def setup(self, stage: str | None = None) -> None:
        """Load, validate and tokenize the sources the stage needs (each only once)."""
        if stage in (None, "fit") and self.train_rows is None and self.train_files:
            rows = [row for spec in self.train_files for row in self._prepare(spec, "train", None)]
            if len(rows) < self.prompts_per_step:
                logger.warning("data: %d train prompts < prompts_per_step=%d; batches repeat prompts",
                               len(rows), self.prompts_per_step)
            self.train_rows = rows
            self._check_state()
            if self.curriculum is not None:  # its kinds and files checked against the rows now, at start
                self._train_stream()
        splits = (("val", self.val_files, self.val_names), ("test", self.test_files, self.test_names))
        for split, files, names in splits:
            wanted = stage is None or stage == split or (split == "val" and stage in ("fit", "validate"))
            if wanted and split not in self.eval_rows:
                self.eval_rows[split] = {name: self._prepare(spec, split, self.limits[split])
                                         for spec, name in zip(files, names)}

    def train_dataloader(self) -> DataLoader:
        """Lightning's training loop: one tick per step; the rollout source reads the prompts (``train_batches``)."""
        self._train_stream()  # no training data fails here, before the loop starts
        return DataLoader(_Ticks(), batch_size=None, num_workers=0)

    def _train_stream(self) -> PromptStream:
        if not self.train_files:
            raise ValueError("no training data: set data.train_files")
        if self.train_rows is None:
            self.setup("fit")
        if self._stream is None:
            sources = {spec: source_name(spec) for spec in self.train_files}
            self._stream = PromptStream(self.train_rows, self.prompts_per_step, self.seed) if self.curriculum is None \
                else Curriculum(self.curriculum, self.train_rows, sources, self.prompts_per_step, self.seed)
            self._load_curriculum()
        return self._stream

    def train_batches(self, steps_take: str) -> Iterator[list[dict[str, Any]]]:
        """The training batches in order from the first not consumed whole (read at the first batch: a state loaded
        later counts), as steps taking the stream as ``steps_take`` (``Consumption.STEPS``, the rollout source's)
        train them: less the rows consumed (a batch with none left skipped), or whole for ``"rows"`` (streaming).

        Raises:
            ValueError: an unknown ``steps_take``; at the first batch, a record ``"ahead"`` cannot resume.
        """
        if steps_take not in Consumption.STEPS:
            raise ValueError(f"steps_take({steps_take!r}): one of {', '.join(map(repr, Consumption.STEPS))}")
        stream = self._train_stream()
        yield from stream.batches(self._consumed.first_batch(steps_take),
                                  lambda b: self._consumed.leaves_out(steps_take, b))

    def train_batch(self, batch_index: int) -> list[dict[str, Any]]:
        """The rows of training batch ``batch_index`` of the stream that no step consumed yet: all of them where
        none was (an engine host reads the batches of the next steps ahead by index); fewer where a step took single
        prompts of it (``mark_rows``)."""
        consumed = self._consumed.consumed(batch_index)
        return [row for row in self._train_stream().batch(batch_index) if row["position"] not in consumed]

    def _eval_loaders(self, split: str) -> list[DataLoader]:
        if split not in self.eval_rows:
            self.setup("validate" if split == "val" else "test")
        return [DataLoader(_ListDataset(rows), batch_size=self.eval_prompts_per_batch, shuffle=False, collate_fn=list)
                for rows in self.eval_rows[split].values()]

    def val_dataloader(self) -> list[DataLoader]:
        return self._eval_loaders("val") if self.val_files else []

    def test_dataloader(self) -> list[DataLoader]:
        if not self.test_files:
            raise ValueError("no test data: set data.test_files (bundled names: " + ", ".join(BENCHMARKS) + ")")
        return self._eval_loaders("test")

    # ----- resume -----
    @property
    def consumed(self) -> int:
        """Training batches consumed whole so far (the first batch a resumed run reads)."""
        return self._consumed.whole

    def mark_consumed(self, batch_index: int) -> None:
        """Record that training batch ``batch_index`` was used by a step; raises ValueError where it already was
        (the position only moves forward)."""
        self._consumed.mark_batch(batch_index)

    def mark_rows(self, positions: Iterable[tuple[int, int]]) -> None:
        """Record that a step used the rows ``(batch index, position)`` (every rank's); ``train_batch`` and
        ``train_batches`` leave them out from now on, a resumed run's too. Raises ValueError on a row consumed."""
        self._consumed.mark_rows(positions)

    # ----- data.curriculum -----
    def check_steps_take(self, steps_take: str) -> None:
        """Refuse, at start, a curriculum that decides batches on results with batches drawn ahead of them."""
        if self.curriculum is not None:
            self.curriculum.check_steps_take(steps_take)

    def observe(self, outcomes: list[Outcome]) -> None:
        """The results of a rolled-out batch, every rank's (``curriculum.outcomes``), for ``data.curriculum``;
        nothing without one."""
        if isinstance(self._stream, Curriculum) and outcomes:
            self._step_stage = self._stream.stage_of(max(o[0] for o in outcomes))  # as drawn, before a switch
            self._step_outcomes += outcomes
            self._stream.observe(outcomes)

    def step_metrics(self) -> dict[str, float]:
        """The curriculum's scalars of the step's batches (``Curriculum.metrics``), then a new step; {} without."""
        if not isinstance(self._stream, Curriculum) or not self._step_outcomes:
            return {}
        out = self._stream.metrics(self._step_outcomes, self._step_stage)
        self._step_outcomes = []
        return out

    def _load_curriculum(self) -> None:
        """The checkpoint's curriculum state into the stream, once both exist."""
        state, stream = self._pending_state, self._stream
        if state is None or stream is None:
            return
        saved = state.get("curriculum")
        if (saved is None) != (self.curriculum is None):
            raise ValueError(f"resumed data state {'has' if saved else 'has no'} data.curriculum state but this run "
                             f"{'has none' if saved else 'has one'}; the training stream would differ. Use the "
                             "data.curriculum of the run that saved the checkpoint")
        if saved is not None:
            stream.load(saved)

    def state_dict(self) -> dict[str, Any]:
        num_rows = len(self.train_rows) if self.train_rows is not None else None
        stream = self._stream if isinstance(self._stream, Curriculum) else None
        curriculum = stream.state() if stream else (self._pending_state or {}).get("curriculum")
        return {**self._consumed.state(), "seed": self.seed, "prompts_per_step": self.prompts_per_step,
                "num_train_rows": num_rows, **({"curriculum": curriculum} if curriculum is not None else {})}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._consumed.load(state_dict)
        self._pending_state = dict(state_dict)
        self._check_state()
        self._load_curriculum()

    def _check_state(self) -> None:
        # The same stream needs the same seed, batch size and rows; anything else would silently replay or skip data.
        # Checked once the training rows are loaded (fit): evaluating a checkpoint (`test --ckpt_path`) with other
        # data settings is fine, it never reads the training stream.
        state = self._pending_state
        if state is None or self.train_rows is None:
            return
        now = {"seed": self.seed, "prompts_per_step": self.prompts_per_step}
        if self.train_rows is not None:
            now["num_train_rows"] = len(self.train_rows)
        for key, value in now.items():
            saved = state.get(key)
            if saved is not None and saved != value:
                raise ValueError(f"resumed data state has {key}={saved} but this run has {key}={value}; the training "
                                 f"stream would differ. Use the same data settings to resume.")


def _unique_names(files: list[str], what: str) -> list[str]:
    names = [source_name(spec) for spec in files]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{what}: several sources share the name(s) {duplicates}; rename the files")
    return names
