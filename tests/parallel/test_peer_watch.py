"""``PeerWatch``: a rank whose peer process on the same host is gone says which one and ends itself."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

from zerotir.parallel.peer_watch import LOST_PEER_EXIT_CODE, PeerWatch, alive


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def test_a_killed_peer_is_named_its_close_runs_and_the_rank_exits(capsys):
    peer = _sleeper()
    exited, closed = threading.Event(), []
    codes = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        exited.set()

    host = socket.gethostname()
    watch = PeerWatch(0, [(host, os.getpid()), (host, peer.pid)], on_lost=lambda: closed.append(True),
                      interval=0.05, exit=fake_exit)
    try:
        assert watch.watched == {1: peer.pid} and watch.lost() == []
        watch.start()
        os.kill(peer.pid, signal.SIGKILL)  # not reaped: a zombie counts as gone
        assert exited.wait(timeout=120)
    finally:
        watch.stop()
        peer.kill()
        peer.wait()
    assert codes == [LOST_PEER_EXIT_CODE] and closed == [True]
    assert f"rank 0: lost peer rank 1 (pid {peer.pid} on {host})" in capsys.readouterr().err


def test_peers_on_other_hosts_and_self_are_not_watched():
    watch = PeerWatch(1, [("elsewhere", 1), (socket.gethostname(), os.getpid())])
    assert watch.watched == {}
    assert alive(os.getpid())


def test_a_stopped_watch_does_not_fire():
    """A watch stopped before its peer dies (the run ended normally: peers may exit first) never ends the rank."""
    peer = _sleeper()
    codes = []
    watch = PeerWatch(0, [(socket.gethostname(), os.getpid()), (socket.gethostname(), peer.pid)],
                      interval=0.05, exit=codes.append)
    watch.start()
    watch.stop()
    os.kill(peer.pid, signal.SIGKILL)  # gone (a zombie) from here on: only the stop keeps the watch from firing
    watch._thread.join(timeout=60)
    peer.wait()
    assert not watch._thread.is_alive() and codes == []
