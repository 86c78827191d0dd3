"""Stopping a local server: SIGTERM, then SIGKILL with a warning that names the server."""

import logging
import shlex
import time

from lakehouse_assets.ops import jvm_server
from lakehouse_assets.ops.jvm_server import JvmServer


def test_a_server_that_ignores_sigterm_is_killed_after_the_timeout_and_named(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(jvm_server, "STOP_TIMEOUT_SECONDS", 0.5)
    server = JvmServer("stubborn server", "none", tmp_path, port=0)
    ready = tmp_path / "ignoring"
    server.spawn(["sh", "-c", f"trap '' TERM; touch {shlex.quote(str(ready))}; while :; do sleep 0.1; done"])
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert time.monotonic() < deadline and server.process.poll() is None, "the server never started"
        time.sleep(0.05)

    with caplog.at_level(logging.WARNING, logger=jvm_server.__name__):
        server.stop()

    assert server.process is not None and server.process.returncode == -9
    assert "stubborn server did not end within 0 s of SIGTERM; killed" in caplog.text
    assert str(server.log_file) in caplog.text
