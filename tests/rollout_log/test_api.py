"""The web viewer's JSON API and server, without a browser: several ranks' files merged, a run still writing (new
steps, a file cut short, a partly written line), the routes over HTTP and their errors, and the CLI's --serve."""

from __future__ import annotations

import gzip
import json
import socket
import urllib.error
import urllib.request

import pytest

from tests.rollout_log.test_records import batch
from zerotir.rollout_log import api
from zerotir.rollout_log import records as R
from zerotir.rollout_log.cli import main
from zerotir.rollout_log.server import make_server, serve_in_thread, url_of

PROMPTS, IDS = ["Q: 3 + 4 = ?", "Q: 1 + 1 = ?"], ["a", "b"]


def write_step(folder, step, rank=0, world=1, split="train"):
    records = R.trajectory_records(batch(), PROMPTS, IDS, ["toy", "toy"], step=step, split=split, rank=rank)
    return R.write_records(folder / R.file_name(split, step, rank, world), records)


def test_a_step_of_several_ranks_is_merged_with_ids_per_rank(tmp_path):
    write_step(tmp_path, 1, rank=0, world=2)
    write_step(tmp_path, 1, rank=1, world=2)
    reader = api.RunReader(tmp_path)
    [line] = api.step_list(reader, "train")
    assert (line["step"], line["ranks"], line["trajectories"]) == (1, 2, 6)
    assert line["reward"] == pytest.approx(1 / 3) and line["tool_rate"] == pytest.approx(2 / 3)
    view = api.step_view(reader, "train", 1)
    assert [g["id"] for g in view["groups"]] == ["0-0", "0-1", "1-0", "1-1"]  # group ids are per rank
    assert [t["id"] for t in view["groups"][2]["trajectories"]] == ["1-0", "1-1"]
    assert view["groups"][0]["reward"] == 0.5 and view["tools"] == ["python"]
    failed = view["groups"][3]["trajectories"][0]
    assert (failed["id"], failed["failed"], failed["calls"], failed["correct"]) == ("1-2", True, 1, False)
    traj = api.trajectory_view(reader, "train", 1, "1-0")
    assert traj["rank"] == 1 and traj["blocks"][1] == ["code", "print(3 + 4)"] and traj["blocks"][2] == ["output", "7"]
    with pytest.raises(api.ApiInputError, match="no trajectory '2-0'"):
        api.trajectory_view(reader, "train", 1, "2-0")


def test_a_run_still_writing_shows_new_steps_and_skips_what_is_half_written(tmp_path):
    reader = api.RunReader(tmp_path)
    assert api.step_list(reader, "train") == []
    write_step(tmp_path, 1)
    assert [s["step"] for s in api.step_list(reader, "train")] == [1]
    write_step(tmp_path, 2)  # the next step lands while the viewer runs
    assert [s["step"] for s in api.step_list(reader, "train")] == [1, 2]
    lines = [json.dumps(r) for r in R.read_step(tmp_path, 1)]
    with gzip.open(tmp_path / "step_3.jsonl.gz", "wt") as f:  # a writer that stopped mid-line
        f.write("\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])
    assert [r["index"] for r in reader.records("train", 3)] == [0, 1]
    whole = gzip.compress(("\n".join(lines) + "\n").encode() * 50)
    (tmp_path / "step_4.jsonl.gz").write_bytes(whole[: len(whole) * 2 // 3])  # a gzip stream cut short
    cut = reader.records("train", 4)
    assert 0 < len(cut) < 150 and all(r["problem_id"] in ("a", "b") for r in cut)
    assert [s["trajectories"] for s in api.step_list(reader, "train")][:3] == [3, 3, 2]
    (tmp_path / ".step_5.jsonl.gz.tmp").write_bytes(b"\x1f\x8b")  # a temporary file is no step
    assert [s["step"] for s in api.step_list(reader, "train")] == [1, 2, 3, 4]


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


def test_the_server_answers_the_routes_and_names_bad_requests(tmp_path):
    write_step(tmp_path, 1)
    write_step(tmp_path, 1, split="val")
    server, thread = serve_in_thread(tmp_path)
    try:
        base = url_of(server)
        assert base.startswith("http://127.0.0.1:")
        status, kind, body = get(base)
        assert status == 200 and kind.startswith("text/html") and b"/static/viewer.js" in body
        assert get(base + "static/viewer.js")[0] == 200 and get(base + "static/viewer.css")[0] == 200
        assert json.loads(get(base + "api/run")[2])["splits"] == ["train", "val"]
        assert [s["step"] for s in json.loads(get(base + "api/steps?split=val")[2])] == [1]
        assert json.loads(get(base + "api/trajectory?split=train&step=1&id=0-2")[2])["problem_id"] == "b"
        status, _, body = get(base + "api/step?split=train&step=two")
        assert status == 400 and "step='two': must be an integer" in json.loads(body)["error"]
        status, _, body = get(base + "api/step?split=train&step=9")
        assert status == 404 and "no train rollouts of step 9" in json.loads(body)["error"]
        assert get(base + "api/steps?split=dev")[0] == 400
        assert get(base + "api/steps")[0] == 400
        assert get(base + "static/../api.py")[0] == 404 and get(base + "api/nothing")[0] == 404
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_taken_port_and_a_port_without_serve_are_errors(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError, match=f"--port {taken.getsockname()[1]}: cannot listen"):
            make_server(tmp_path, taken.getsockname()[1])
    with pytest.raises(ValueError, match="--port 70000"):
        make_server(tmp_path, 70000)
    write_step(tmp_path, 1)
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--port", "8000"])
    assert "--port is the web viewer's: add --serve" in capsys.readouterr().err


def test_serve_prints_the_url_of_a_free_port_and_answers_there(tmp_path):
    import subprocess
    import sys

    write_step(tmp_path / "rollouts", 1)
    process = subprocess.Popen([sys.executable, "-m", "zerotir", "rollouts", str(tmp_path), "--serve"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # printed once the server listens
        assert "serving" in line and "http://127.0.0.1:" in line, process.stderr.read() if not line else line
        url = line.split(" at ")[1].split()[0]
        assert json.loads(get(url + "api/steps?split=train")[2])[0]["step"] == 1
    finally:
        process.terminate()
        process.wait(30)
