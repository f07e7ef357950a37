"""Which host was lost: every rank answers on a small TCP port, so after a collective
fails a surviving rank can dial each peer and say which ones are gone.

A failed Gloo collective says little (``Timed out waiting 30000ms for recv operation``, or
``Horovod has been shut down``): not which rank or host stopped answering. At start every
rank opens a listening socket on all its addresses and the ranks all-gather (rank, host
address, port). After a failure each survivor dials every peer with a short timeout:

- connection refused: the host answers but the rank's process is gone (it crashed or was
  killed);
- no answer: the host or its link is down (or the network between is cut);
- accepted: the rank is still alive (it is waiting too).

Example::

    watch = PeerWatch.start()          # a collective: every rank calls it
    try:
        train()
    except Exception as err:
        if is_collective_failure(err):
            log.error(watch.describe_failure(err))
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
import threading

import numpy as np

from gmeta_tf import distributed

# Words in the messages of TF errors raised by Horovod ops (or Gloo) when a peer is gone.
_FAILURE_MARKS = ("Horovod", "horovod", "Gloo", "gloo", "Connection closed by peer",
                  "Connection reset by peer", "Timed out waiting")


def is_collective_failure(err: BaseException) -> bool:
    """Whether err is a collective that failed because a peer went away."""
    text = f"{type(err).__name__}: {err}"
    return any(mark in text for mark in _FAILURE_MARKS)


@dataclasses.dataclass(frozen=True)
class Peer:
    rank: int
    host: str  # the address the rank answers on
    port: int


@dataclasses.dataclass(frozen=True)
class PeerState:
    peer: Peer
    state: str  # "alive", "process gone", "no answer"

    def describe(self) -> str:
        why = {"process gone": "its host answers but the rank's process is gone",
               "no answer": "the host does not answer (host or link down)",
               "alive": "still running"}[self.state]
        return f"host {self.peer.host} (rank {self.peer.rank}): {why}"


def _own_address() -> str:
    """The address peers reach this rank on: the host Horovod launched it for."""
    name = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        address = "127.0.0.1"
    return address


class PeerWatch:
    """A rank's answering socket and the table of every rank's (host, port)."""

    def __init__(self, peers: list[Peer], rank: int, server: socket.socket | None) -> None:
        self.peers, self.rank, self._server = peers, rank, server

    @classmethod
    def start(cls) -> "PeerWatch":
        """Opens this rank's socket and all-gathers every rank's (call on every rank)."""
        distributed.init()
        rank, size = distributed.rank(), distributed.size()
        if size == 1:
            return cls([], rank, None)
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", 0))
        server.listen(64)
        threading.Thread(target=_accept_forever, args=(server,), daemon=True,
                         name="gmeta-peer-watch").start()
        address = int(ipaddress.IPv4Address(_own_address()))
        table = distributed.allgather(np.array([rank, address, server.getsockname()[1]],
                                               np.int64)).reshape(-1, 3)
        peers = [Peer(int(r), str(ipaddress.IPv4Address(int(a))), int(p)) for r, a, p in table]
        return cls(peers, rank, server)

    def check(self, timeout: float = 3.0) -> list[PeerState]:
        """Dials every other rank (in parallel, at most ``timeout`` seconds in all)."""
        results: dict[int, str] = {}

        def dial(peer: Peer) -> None:
            try:
                with socket.create_connection((peer.host, peer.port), timeout=timeout):
                    results[peer.rank] = "alive"
            except ConnectionRefusedError:
                results[peer.rank] = "process gone"
            except OSError:  # timeout, unreachable host or network
                results[peer.rank] = "no answer"

        others = [p for p in self.peers if p.rank != self.rank]
        threads = [threading.Thread(target=dial, args=(p,), daemon=True) for p in others]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 1)
        return [PeerState(p, results.get(p.rank, "no answer")) for p in others]

    def describe_failure(self, err: BaseException) -> str:
        """One message: what failed here, and which hosts are lost."""
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        telling = [line for line in lines if any(m in line for m in _FAILURE_MARKS)]
        first = ((telling or lines or [type(err).__name__])[0])[:300]
        me = next((p.host for p in self.peers if p.rank == self.rank), "this host")
        states = self.check()
        lost = [s for s in states if s.state != "alive"]
        if lost:
            what = "lost " + "; ".join(s.describe() for s in lost)
        else:
            what = "every peer still answers (a peer failed on its own: see its log)"
        return (f"a collective failed on rank {self.rank} (host {me}): {what}. "
                f"The error was: {first}")

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


def _accept_forever(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        conn.close()
