"""Leases over the hand-off socket, with real client processes: what a lease holds, and what ends it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_kit import start_engine
from safetensors.torch import load_file
from wait_helpers import wait_for

from executor import FileStore
from models import Catalog
from prewarm import CapacityError, Order, OrderAction, Tier
from prewarm_client import SOCKET_NAME, Refused, open_weights, recv_message, send_message

# A client process: leases the model, says what it got, and holds the lease until told (or killed).
HOLDER = """
    import json, sys
    from prewarm_client import open_weights
    model, socket_dir = sys.argv[1], sys.argv[2]
    with open_weights(model, socket_dir=socket_dir) as weights:
        print(json.dumps({"lease": weights.lease, "source": weights.source, "n": len(weights)}), flush=True)
        sys.stdin.readline()
    print(json.dumps({"closed": True}), flush=True)
"""


def _hold(model: str, socket_dir: Path) -> tuple[Any, dict[str, Any]]:
    engine = start_engine(HOLDER, model, str(socket_dir))
    assert engine.stdout is not None
    line = engine.stdout.readline()
    if not line:
        raise AssertionError(f"client process failed: {engine.stderr.read() if engine.stderr else ''}")
    return engine, json.loads(line)


def _l1(executor: Any) -> dict[str, Any]:
    tier = executor.state().tier(Tier.L1)
    return {r.model: r for r in tier.resident}


def test_socket_directory_is_private_and_the_socket_owner_only(serve: Any, two_models: Catalog) -> None:
    _executor, socket_dir = serve(two_models)
    assert stat.S_IMODE(os.stat(socket_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(socket_dir / SOCKET_NAME).st_mode) == 0o600


def test_leased_model_survives_eviction_pressure_and_is_never_demoted(
    serve: Any, two_models: Catalog
) -> None:
    size = two_models["m0"].size_bytes
    executor, socket_dir = serve(two_models, l1_budget_bytes=size + size // 2)  # room for one model
    engine, got = _hold("m0", socket_dir)
    try:
        assert got["source"] == "executor"
        resident = _l1(executor)["m0"]
        assert (resident.leases, resident.pins) == (1, 1)
        assert resident.lease_wait_s is not None
        # Pressure: another model wants L1, and the only room is the leased block's.
        with pytest.raises(CapacityError):
            executor.ensure("m1", Tier.L1, demand=True)
        # Orders to demote it and to evict it from L1 leave it where it is while the lease lasts.
        now = time.time()
        for i, (action, tier) in enumerate(((OrderAction.DEMOTE, Tier.L2), (OrderAction.EVICT, Tier.L1))):
            order = Order(
                id=f"o{i}",
                node="node-0",
                model="m0",
                version="1",
                action=action,
                tier=tier,
                reason="forecast",
                not_before=now,
                deadline=now + 60,
                created_at=now,
            )
            assert executor.apply(order).status.value == "done"
        assert "m0" in _l1(executor)
        assert executor.l1.cache.lookup(two_models["m0"].key, use=False) is not None
        # The engine still reads what it was given.
        engine.stdin.write("close\n")
        engine.stdin.flush()
        assert json.loads(engine.stdout.readline()) == {"closed": True}
    finally:
        engine.kill()
        engine.wait()
    wait_for(lambda: not executor.leases(), 10, "the closed lease to be released")
    executor.ensure("m1", Tier.L1, demand=True)  # the room is given up once nobody holds it
    assert set(_l1(executor)) == {"m1"}


def test_sigkill_of_the_client_ends_its_lease(serve: Any, two_models: Catalog) -> None:
    executor, socket_dir = serve(two_models)
    engine, _got = _hold("m0", socket_dir)
    assert len(executor.leases()) == 1
    os.kill(engine.pid, signal.SIGKILL)
    engine.wait()
    wait_for(lambda: not executor.leases(), 10, "the lease of the killed client to end")
    resident = _l1(executor)["m0"]
    assert (resident.leases, resident.pins) == (0, 0)


def test_wrong_fingerprint_is_refused_with_a_message_and_nothing_is_served(
    serve: Any, two_models: Catalog
) -> None:
    executor, socket_dir = serve(two_models)
    spec = two_models["m0"]
    for fingerprint in ({"version": "2"}, {"sha256": "0" * 64}):
        with pytest.raises(Refused, match="fingerprint mismatch") as refused:
            open_weights("m0", socket_dir=socket_dir, **fingerprint)
        assert refused.value.reason == "fingerprint"
    with pytest.raises(Refused, match="unknown model"):
        open_weights("nope", socket_dir=socket_dir)
    assert not executor.leases()
    assert executor.state().tier(Tier.L1).used_bytes == 0  # nothing was even loaded for them
    with open_weights("m0", socket_dir=socket_dir, version=spec.version, sha256=spec.sha256) as weights:
        assert weights.sha256 == spec.sha256


def test_a_stale_version_is_never_served_after_the_catalog_moves(serve: Any, tmp_path: Path) -> None:
    from executor_testkit import make_model

    old = make_model(tmp_path / "w", "m", seed=1, version="1")
    executor, socket_dir = serve(Catalog([old]))
    with open_weights("m", socket_dir=socket_dir) as held:
        new = make_model(tmp_path / "w", "m", seed=2, version="2")
        executor.update_catalog(Catalog([new]))
        with pytest.raises(Refused, match="fingerprint"):
            open_weights("m", socket_dir=socket_dir, version="1")
        with open_weights("m", socket_dir=socket_dir) as fresh:
            assert fresh.version == "2"
            expected = load_file(str(FileStore.path(new.uri)))
            assert all(torch.equal(fresh[k], v) for k, v in expected.items())
        assert held.version == "1"  # the old lease keeps its copy until it ends


def test_open_without_load_refuses_a_model_not_in_l1(serve: Any, two_models: Catalog) -> None:
    executor, socket_dir = serve(two_models)
    with pytest.raises(Refused, match="not in L1"):
        open_weights("m0", socket_dir=socket_dir, load=False)
    executor.ensure("m0", Tier.L1)
    with open_weights("m0", socket_dir=socket_dir, load=False) as weights:
        assert weights.served_from == "L1"


def test_peer_of_another_uid_is_refused_by_the_peercred_check(serve: Any, two_models: Catalog) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to run a client as another uid (os.setuid in a forked child)")
    # Open the directory (and the path to it: pytest's own tmp_path is 0700) and the socket to
    # everyone, so that the filesystem lets the other uid in and the SO_PEERCRED check must refuse it.
    public = Path(tempfile.mkdtemp(prefix="prewarm-peercred-"))
    os.chmod(public, 0o755)
    executor, socket_dir = serve(two_models, socket_dir=public / "sock")
    os.chmod(socket_dir, 0o755)
    os.chmod(socket_dir / SOCKET_NAME, 0o666)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: another uid, raw protocol, no torch work
        try:
            os.close(read_end)
            os.setgid(65534)
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.connect(str(socket_dir / SOCKET_NAME))
            send_message(sock, {"op": "open", "model": "m0", "device": "cpu"})
            received = recv_message(sock)
            reply = received[0] if received else {"eof": True}
            os.write(write_end, json.dumps({"uid": os.getuid(), **reply}).encode())
        except BaseException as exc:
            os.write(write_end, json.dumps({"child_error": repr(exc)}).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        answer = json.loads(pipe.read())
    os.waitpid(pid, 0)
    shutil.rmtree(public, ignore_errors=True)
    assert "child_error" not in answer, answer
    assert answer["uid"] == 65534
    assert answer["ok"] is False
    assert answer["reason"] == "peer_uid"
    assert "peer uid 65534" in answer["error"]
    assert not executor.leases()
    assert executor.state().tier(Tier.L1).used_bytes == 0
