"""Joining a Ray cluster by address (``model.hosts.address``): an address where nothing answers fails at once, naming
it, instead of Ray's own wait of minutes. A module of its own: the Ray tests' module keeps a local cluster running."""

from __future__ import annotations

import pytest

from tests.ports import free_port

ray = pytest.importorskip("ray", reason='the fleet tests need Ray: pip install -e ".[fleet]"')

from zerotir.fleet.cluster import start_cluster  # noqa: E402


def test_an_address_where_nothing_answers_fails_at_once_naming_it() -> None:
    assert not ray.is_initialized()
    port = free_port()  # nothing listens there
    with pytest.raises(ConnectionError, match=rf"model.hosts.address='127.0.0.1:{port}': nothing answers at "
                                              rf"127.0.0.1:{port} within 10 s .*ray start --head --port {port}"):
        start_cluster(address=f"127.0.0.1:{port}")
    assert not ray.is_initialized()
