"""The e2e tests' base shipped in ``data/e2e_base``: ``unpack`` gives its float16 weights in float32, and refuses a
copy whose files changed after ``SHA256SUMS`` was written or whose stamp is another recipe's, naming the command that
rebuilds it."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.base_model import REBUILD, SETTINGS, SHIPPED, unpack


def test_unpack_gives_the_shipped_weights_in_float32(tmp_path):
    out = unpack(tmp_path / "base")
    shipped, unpacked = load_file(SHIPPED / "model.safetensors"), load_file(out / "model.safetensors")
    assert shipped.keys() == unpacked.keys()
    assert {t.dtype for t in shipped.values()} == {torch.float16}
    assert {t.dtype for t in unpacked.values()} == {torch.float32}
    assert all(torch.equal(unpacked[k], shipped[k].float()) for k in shipped)
    assert (out / "tokenizer.json").read_bytes() == (SHIPPED / "tokenizer.json").read_bytes()


def test_a_changed_file_is_refused_naming_it(tmp_path):
    copy = shutil.copytree(SHIPPED, tmp_path / "copy")
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(AssertionError, match=r"model\.safetensors: missing or changed"):
        unpack(tmp_path / "out", shipped=copy)


def test_another_recipe_is_refused_naming_the_rebuild(tmp_path):
    copy = shutil.copytree(SHIPPED, tmp_path / "copy")
    stamp = json.loads((copy / "e2e_base.json").read_text())
    stamp["key"][0] = {**SETTINGS, "steps": SETTINGS["steps"] + 1}
    (copy / "e2e_base.json").write_text(json.dumps(stamp))
    sums = (copy / "SHA256SUMS").read_text().splitlines()
    digest = hashlib.sha256((copy / "e2e_base.json").read_bytes()).hexdigest()
    (copy / "SHA256SUMS").write_text("".join(
        (f"{digest}  e2e_base.json" if line.endswith("  e2e_base.json") else line) + "\n" for line in sums))
    with pytest.raises(AssertionError, match="other settings") as err:
        unpack(tmp_path / "out", shipped=copy)
    assert REBUILD in str(err.value)
