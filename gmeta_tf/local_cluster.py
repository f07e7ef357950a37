"""A cluster on one machine: N hosts as network namespaces joined by a bridge.

Each host has its own address on one private /24, the same interface name (``eth0``), its
own hosts file (its own address for the machine's host name, and every host's name), an
sshd with its own host key, and optionally a rate limit (``tc`` token bucket, both ways) on
its link. The key that logs in and the known-hosts file live in a private folder; the
user's ``~/.ssh`` is never touched: inside a host, ``/etc/ssh`` is the folder this module
writes under ``/etc/netns/<host>/`` (``ip netns exec`` mounts it over ``/etc``).

    python -m gmeta_tf.local_cluster up 2 [--rate 1gbit]   # as root; twice is harmless
    python -m gmeta_tf.local_cluster status
    python -m gmeta_tf.local_cluster exec 1 -- horovodrun -np 2 \\
        -H 10.213.16.1:1,10.213.16.2:1 --network-interface eth0 gmeta train --config default
    python -m gmeta_tf.local_cluster down                   # removes everything it made

Jobs start on host 1 (``exec 1``), as on a real cluster's first node: Horovod's launcher
reads the address of ``--network-interface`` on the host it runs on, so it must run on one
of the hosts. A namespace shares the machine's kernel and CPUs: the cluster reproduces a
link's *rate* (``--rate``), not its latency (this kernel has no ``netem``), nor separate
machines' cores.

Horovod 0.28.1 builds its process-set Gloo contexts on the address the host name resolves
to, ignoring ``--network-interface``: a host whose name resolved to 127.0.0.1 would make
its peers dial their own loopback. Here each host's hosts file maps the machine's name to
that host's address, and is in place before its sshd (and so every rank) starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from gmeta_tf.atomic_file import write_atomically

DEFAULT_SUBNET = "10.213.16.0/24"
DEFAULT_NAME = "gmeta"
DEFAULT_STATE_DIR = "/run/gmeta-local-cluster"
INTERFACE = "eth0"
MAX_HOSTS = 8
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}

log = logging.getLogger(__name__)


class ClusterError(RuntimeError):
    """The cluster cannot be made or used; the message says why and what to do."""


def rate_bits(rate: str) -> float:
    """'1gbit' -> 1e9. Raises ClusterError for anything tc's rate syntax would not take."""
    match = _RATE.match(rate.strip().lower())
    if not match or float(match.group(1)) <= 0:
        raise ClusterError(f"--rate {rate!r} is not a rate: expected a positive number with "
                           f"one of the units {sorted(_RATE_UNITS)} (e.g. 1gbit, 500mbit)")
    return float(match.group(1)) * _RATE_UNITS[match.group(2)]


def _run(*command: str, check: bool = True, netns: str | None = None,
         quiet: bool = False) -> subprocess.CompletedProcess:
    if netns is not None:
        command = ("ip", "netns", "exec", netns, *command)
    result = subprocess.run(command, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise ClusterError(f"{' '.join(command)} failed ({result.returncode}): "
                           f"{(result.stderr or result.stdout).strip()}")
    return result


@dataclasses.dataclass(frozen=True)
class Host:
    """One host of the cluster."""

    index: int  # 1..N
    netns: str  # the network namespace
    address: str  # its address on the cluster's /24
    veth: str  # the bridge side of its link (in the machine's own namespace)

    @property
    def name(self) -> str:
        """Its name in every host's hosts file (same as its namespace)."""
        return self.netns


class LocalCluster:
    """The hosts ``1..size`` of one cluster and their state on disk.

    Args:
        name: Prefix of every namespace, link and the bridge (at most 8 characters).
        subnet: The private /24 the hosts' addresses come from (host k gets .k); nothing
            else on the machine may use it.
        state_dir: The private folder (keys, sshd configs and pid files, known hosts).
    """

    def __init__(self, name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET,
                 state_dir: str | os.PathLike = DEFAULT_STATE_DIR) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", name):
            raise ClusterError(f"cluster name {name!r}: expected 1-8 lower-case letters or "
                               f"digits, starting with a letter (interface names are short)")
        network = ipaddress.ip_network(subnet, strict=True)
        if network.prefixlen != 24 or not network.is_private:
            raise ClusterError(f"subnet {subnet!r}: expected a private /24, e.g. "
                               f"{DEFAULT_SUBNET}")
        self.name, self.network = name, network
        self.state_dir = Path(state_dir)
        self.bridge = f"{name}-br"

    # -- naming ------------------------------------------------------------------------------
    def host(self, index: int) -> Host:
        if not 1 <= index <= MAX_HOSTS:
            raise ClusterError(f"host {index}: expected 1..{MAX_HOSTS}")
        return Host(index, f"{self.name}-h{index}", str(self.network.network_address + index),
                    f"{self.name}-h{index}v")

    def hosts(self, size: int | None = None) -> list[Host]:
        """Hosts 1..size (default: the hosts that are up now)."""
        if size is None:
            size = len(self._existing_namespaces())
        return [self.host(k) for k in range(1, size + 1)]

    @property
    def identity_file(self) -> Path:
        """The private key that logs into every host (``horovodrun --ssh-identity-file``)."""
        return self.state_dir / "id_ed25519"

    def _host_dir(self, host: Host) -> Path:
        return self.state_dir / host.netns

    def _etc_dir(self, host: Host) -> Path:
        return Path("/etc/netns") / host.netns

    # -- checks ------------------------------------------------------------------------------
    @staticmethod
    def missing_requirements(rate: str | None = None) -> list[str]:
        """What this machine lacks to run the cluster (empty when nothing)."""
        missing = []
        if os.geteuid() != 0:
            missing.append("root (network namespaces, bridges and sshd need it: run as root)")
        for tool, package in (("ip", "iproute2"), ("sshd", "openssh-server"),
                              ("ssh", "openssh-client"), ("ssh-keygen", "openssh-client")):
            if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
                missing.append(f"{tool} (Debian package {package}; `bash scripts/setup.sh` "
                               f"as root installs it)")
        if rate is not None and shutil.which("tc", path="/usr/sbin:/sbin:/usr/bin") is None:
            missing.append("tc (Debian package iproute2) for --rate")
        if not missing:
            probe = _run("ip", "netns", "list", check=False)
            if probe.returncode != 0:
                missing.append(f"ip netns (`ip netns list` failed: {probe.stderr.strip()})")
        return missing

    def _require(self, rate: str | None = None) -> None:
        missing = self.missing_requirements(rate)
        if missing:
            raise ClusterError("cannot run a local cluster, missing: " + "; ".join(missing))

    def _existing_namespaces(self) -> list[str]:
        out = _run("ip", "netns", "list", check=False).stdout
        names = {line.split()[0] for line in out.splitlines() if line.strip()}
        return sorted((n for n in names if re.fullmatch(rf"{self.name}-h\d+", n)),
                      key=lambda n: int(n.rsplit("h", 1)[1]))

    def _link_exists(self, name: str, netns: str | None = None) -> bool:
        command = ["ip", "link", "show", name] if netns is None else \
            ["ip", "-n", netns, "link", "show", name]
        return _run(*command, check=False).returncode == 0

    # -- up ----------------------------------------------------------------------------------
    def up(self, size: int, rate: str | None = None) -> list[Host]:
        """Makes hosts 1..size (those already up are kept), removes hosts above size, and
        sets every link's rate limit (None: unshaped). Returns the hosts."""
        if not 1 <= size <= MAX_HOSTS:
            raise ClusterError(f"cluster size {size}: expected 1..{MAX_HOSTS} hosts")
        if rate is not None:
            rate_bits(rate)
        self._require(rate)
        self._check_subnet_free()
        for extra in self._existing_namespaces()[size:]:
            self._remove_host(self.host(int(extra.rsplit("h", 1)[1])))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o700)
        if not self.identity_file.exists():
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{self.name} local cluster",
                 "-f", str(self.identity_file))
        if not self._link_exists(self.bridge):
            _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "up")
        hosts = self.hosts(size)
        for host in hosts:
            self._make_host(host)
        self._write_known_hosts(hosts)
        for host in hosts:
            self._write_etc(host, hosts)
            self._start_sshd(host)
            self.set_rate(host, rate)
        (self.state_dir / "cluster.json").write_text(json.dumps(
            {"hosts": [h.address for h in hosts], "rate": rate}))
        for host in hosts:
            self._wait_for_sshd(host)
        return hosts

    def _check_subnet_free(self) -> None:
        """Refuses a subnet some interface of the machine (not ours) already uses."""
        out = _run("ip", "-o", "-4", "addr", "show", check=False).stdout
        for line in out.splitlines():
            fields = line.split()
            address = ipaddress.ip_interface(fields[3])
            if address.network.overlaps(self.network) and not fields[1].startswith(self.name):
                raise ClusterError(f"subnet {self.network} overlaps {address} on {fields[1]}: "
                                   f"choose another private /24 (--subnet)")

    def _make_host(self, host: Host) -> None:
        if host.netns not in self._existing_namespaces():
            _run("ip", "netns", "add", host.netns)
        if not self._link_exists(INTERFACE, host.netns):
            if self._link_exists(host.veth):
                _run("ip", "link", "del", host.veth)
            _run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", INTERFACE,
                 "netns", host.netns)
        _run("ip", "link", "set", host.veth, "master", self.bridge, "up")
        _run("ip", "-n", host.netns, "link", "set", "lo", "up")
        _run("ip", "-n", host.netns, "addr", "replace", f"{host.address}/24", "dev", INTERFACE)
        _run("ip", "-n", host.netns, "link", "set", INTERFACE, "up")

    def _write_known_hosts(self, hosts: list[Host]) -> None:
        lines = []
        for host in hosts:
            key_path = self._host_dir(host) / "ssh_host_ed25519_key"
            key_path.parent.mkdir(parents=True, exist_ok=True)
            if not key_path.exists():
                _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name,
                     "-f", str(key_path))
            public = key_path.with_suffix(".pub").read_text().split()[:2]
            lines.append(f"{host.address},{host.name} {' '.join(public)}")
        _write(self.state_dir / "known_hosts", "\n".join(lines) + "\n")
        _write(self.state_dir / "authorized_keys",
               self.identity_file.with_suffix(".pub").read_text())

    def _write_etc(self, host: Host, hosts: list[Host]) -> None:
        """The files ``ip netns exec`` mounts over /etc inside the host: hosts, ssh/."""
        etc = self._etc_dir(host)
        (etc / "ssh").mkdir(parents=True, exist_ok=True)
        names = ["127.0.0.1 localhost", f"{host.address} {socket.gethostname()} {host.name}"]
        names += [f"{h.address} {h.name}" for h in hosts if h != host]
        _write(etc / "hosts", "\n".join(names) + "\n")
        _write(etc / "ssh" / "ssh_config", "\n".join([
            "Host *",
            f"  IdentityFile {self.identity_file}",
            f"  UserKnownHostsFile {self.state_dir / 'known_hosts'}",
            "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes",
            "  PasswordAuthentication no",
            "  BatchMode yes",
            "  ConnectTimeout 10",
            "  LogLevel ERROR", ""]))
        host_dir = self._host_dir(host)
        _write(host_dir / "sshd_config", "\n".join([
            f"ListenAddress {host.address}",
            "Port 22",
            f"HostKey {host_dir / 'ssh_host_ed25519_key'}",
            f"PidFile {host_dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.state_dir / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            # The private folder is not under a home directory; its files are 0600 anyway.
            "StrictModes no",
            "PermitUserEnvironment no",
            "AcceptEnv *",
            "MaxStartups 64",
            "MaxSessions 64",
            "LogLevel ERROR", ""]))

    def _sshd_pid(self, host: Host) -> int | None:
        try:
            pid = int((self._host_dir(host) / "sshd.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _exe(pid).endswith("sshd") else None

    def _start_sshd(self, host: Host) -> None:
        if self._sshd_pid(host) is not None:
            return
        self._stop_stale_sshd(host)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        sshd = shutil.which("sshd", path="/usr/sbin:/sbin:" + os.environ.get("PATH", ""))
        config = str(self._host_dir(host) / "sshd_config")
        _run(sshd, "-t", "-f", config, netns=host.netns)
        _run(sshd, "-f", config, netns=host.netns)

    def _stop_stale_sshd(self, host: Host) -> None:
        """An sshd listening in the host's namespace that this cluster's state did not
        start (a cluster of the same name whose process was killed before ``down``, its
        state folder elsewhere or gone) would answer on the host's address with its own
        host key, which ours does not match: it is stopped, with a warning. Only listeners
        go (an sshd whose parent is not an sshd), not the sessions they served."""
        for pid in self.pids(host):
            if _exe(pid).endswith("sshd") and not _exe(_parent(pid)).endswith("sshd"):
                log.warning("%s: stopping sshd %d, left listening there by an earlier "
                            "cluster of the same name whose state is not in %s", host.name,
                            pid, self.state_dir)
                _kill(pid)

    def _wait_for_sshd(self, host: Host, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while True:
            result = self.ssh(host, "true", check=False)
            if result.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"sshd of {host.name} ({host.address}) does not let the "
                                   f"cluster key in: {result.stderr.strip()}")
            time.sleep(0.2)

    def set_rate(self, host: Host, rate: str | None) -> None:
        """Token-bucket limit on the host's link, both directions (None: unshaped)."""
        for device, netns in ((INTERFACE, host.netns), (host.veth, None)):
            prefix = ("ip", "netns", "exec", netns) if netns else ()
            if rate is None:
                _run(*prefix, "tc", "qdisc", "del", "dev", device, "root", check=False)
                continue
            # The bucket holds >= 4 ms at the rate and at least a few 64 KB segments
            # (veth offloads send 64 KB at once; a smaller bucket would drop them all).
            burst = max(int(rate_bits(rate) / 8 * 0.004), 256 * 1024)
            _run(*prefix, "tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate,
                 "burst", str(burst), "latency", "50ms")

    # -- use ---------------------------------------------------------------------------------
    def command_in(self, host: Host, command: Sequence[str]) -> list[str]:
        """The command line that runs command on host (as a process of this machine)."""
        return ["ip", "netns", "exec", host.netns, *command]

    def ssh(self, host: Host, command: str, check: bool = True,
            from_host: Host | None = None) -> subprocess.CompletedProcess:
        """Runs a shell command on host over ssh (from host 1 unless from_host)."""
        origin = from_host or self.host(1)
        return _run("ssh", host.address, command, netns=origin.netns, check=check)

    def set_link(self, host: Host, up: bool) -> None:
        """Takes the host's link down (as if its cable were pulled) or back up."""
        _run("ip", "-n", host.netns, "link", "set", INTERFACE, "up" if up else "down")

    def kill_host(self, host: Host) -> None:
        """SIGKILL to every process of the host except its sshd (as if it crashed)."""
        sshd = self._sshd_pid(host)
        for pid in self.pids(host):
            if pid != sshd:
                _kill(pid)

    def pids(self, host: Host) -> list[int]:
        out = _run("ip", "netns", "pids", host.netns, check=False).stdout
        return [int(p) for p in out.split()]

    def status(self) -> dict:
        """What is up: every host's address, sshd, link state and rate limit."""
        namespaces = self._existing_namespaces()
        hosts = []
        for netns in namespaces:
            host = self.host(int(netns.rsplit("h", 1)[1]))
            qdisc = _run("ip", "netns", "exec", netns, "tc", "qdisc", "show", "dev", INTERFACE,
                         check=False).stdout
            match = re.search(r"tbf .*?rate (\S+)", qdisc)
            link = _run("ip", "-n", netns, "-br", "link", "show", INTERFACE, check=False).stdout
            hosts.append({"host": host.name, "address": host.address,
                          "sshd_pid": self._sshd_pid(host),
                          "link": link.split()[1] if link.split() else "missing",
                          "rate": match.group(1) if match else "unshaped",
                          "processes": len(self.pids(host))})
        return {"bridge": self.bridge if self._link_exists(self.bridge) else None,
                "subnet": str(self.network), "hosts": hosts,
                "identity_file": str(self.identity_file) if self.identity_file.exists()
                else None}

    def leftovers(self) -> list[str]:
        """Whatever of this cluster still exists (empty after :meth:`down`)."""
        found = [f"namespace {n}" for n in self._existing_namespaces()]
        if self._link_exists(self.bridge):
            found.append(f"bridge {self.bridge}")
        links = _run("ip", "-o", "link", "show", check=False).stdout
        found += [f"link {m}" for m in re.findall(rf"^\d+: ({self.name}-h\d+v)[@:]", links, re.M)]
        etc = Path("/etc/netns")
        if etc.exists():
            found += [f"hosts folder {p}" for p in etc.glob(f"{self.name}-h*")]
        if self.state_dir.exists():
            found.append(f"state folder {self.state_dir}")
            for pid_file in self.state_dir.glob("*/sshd.pid"):
                host = self.host(int(pid_file.parent.name.rsplit("h", 1)[1]))
                if self._sshd_pid(host) is not None:
                    found.append(f"sshd of {host.name}")
        return found

    # -- down --------------------------------------------------------------------------------
    def down(self) -> None:
        """Removes every host (its processes, sshd, link, namespace, hosts file), the bridge
        and the private folder. Safe to call when nothing (or only part) is up."""
        numbers = {int(n.rsplit("h", 1)[1]) for n in self._existing_namespaces()}
        if Path("/etc/netns").exists():
            numbers |= {int(p.name.rsplit("h", 1)[1])
                        for p in Path("/etc/netns").glob(f"{self.name}-h*")
                        if re.fullmatch(rf"{self.name}-h\d+", p.name)}
        for index in sorted(numbers):
            self._remove_host(self.host(index))
        if self._link_exists(self.bridge):
            _run("ip", "link", "del", self.bridge)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def _remove_host(self, host: Host) -> None:
        sshd = self._sshd_pid(host)
        if sshd is not None:
            _kill(sshd)
        for pid in self.pids(host):
            _kill(pid)
        if self._link_exists(host.veth):
            _run("ip", "link", "del", host.veth, check=False)
        if host.netns in self._existing_namespaces():
            _run("ip", "netns", "del", host.netns)
        shutil.rmtree(self._etc_dir(host), ignore_errors=True)
        shutil.rmtree(self._host_dir(host), ignore_errors=True)


def _write(path: Path, text: str, mode: int = 0o600) -> None:
    """``text`` written atomically at ``path`` with ``mode`` (``hosts`` and ``ssh_config``,
    which every user reads, 0644)."""
    def write(tmp: Path) -> None:
        tmp.write_text(text)
        os.chmod(tmp, mode if path.name not in ("hosts", "ssh_config") else 0o644)

    write_atomically(path, write)


def _exe(pid: int) -> str:
    """The executable of a process ("" once it is gone or unreadable)."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, parent, ...); []
    once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _parent(pid: int) -> int:
    """The parent of a process (0 once it is gone)."""
    fields = _stat(pid)
    return int(fields[1]) if len(fields) > 1 else 0


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(100):  # wait until it is gone (reaped by its parent, or a zombie)
        fields = _stat(pid)
        if not fields or fields[0] == "Z":
            return
        time.sleep(0.02)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gmeta_tf.local_cluster",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--name", default=os.environ.get("GMETA_CLUSTER_NAME", DEFAULT_NAME),
                        help="prefix of namespaces, links and bridge (default %(default)s)")
    parser.add_argument("--subnet", default=os.environ.get("GMETA_CLUSTER_SUBNET",
                                                           DEFAULT_SUBNET),
                        help="a private /24 nothing else uses (default %(default)s)")
    parser.add_argument("--state-dir", default=os.environ.get("GMETA_CLUSTER_DIR",
                                                              DEFAULT_STATE_DIR),
                        help="private folder: keys, sshd configs (default %(default)s)")
    sub = parser.add_subparsers(dest="verb", required=True)
    up = sub.add_parser("up", help="make N hosts (2-4 is the usual size)")
    up.add_argument("size", type=int)
    up.add_argument("--rate", help="rate limit of every link, tc syntax (e.g. 1gbit)")
    sub.add_parser("down", help="remove everything the cluster made")
    sub.add_parser("status", help="print the hosts as JSON")
    run = sub.add_parser("exec", help="run a command on host K: exec K -- COMMAND ...")
    run.add_argument("host", type=int)
    run.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        cluster = LocalCluster(args.name, args.subnet, args.state_dir)
        if args.verb == "up":
            hosts = cluster.up(args.size, args.rate)
            print(f"cluster up: {len(hosts)} hosts "
                  f"({', '.join(f'{h.name} {h.address}' for h in hosts)}), interface "
                  f"{INTERFACE}, {'rate ' + args.rate if args.rate else 'unshaped'}; "
                  f"ssh key {cluster.identity_file}")
            print(f"run a job from host 1:  python -m gmeta_tf.local_cluster exec 1 -- "
                  f"horovodrun -np {len(hosts)} -H "
                  f"{','.join(f'{h.address}:1' for h in hosts)} --network-interface "
                  f"{INTERFACE} --ssh-identity-file {cluster.identity_file} gmeta train ...")
        elif args.verb == "down":
            cluster._require()
            cluster.down()
            left = cluster.leftovers()
            if left:
                raise ClusterError(f"still there after down: {left}")
            print("cluster down")
        elif args.verb == "status":
            cluster._require()
            print(json.dumps(cluster.status(), indent=1))
        else:
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            if not command:
                parser.error("exec needs a command after --")
            hosts = cluster.hosts()
            if not 1 <= args.host <= len(hosts):
                raise ClusterError(f"host {args.host} is not up (the cluster has {len(hosts)} "
                                   f"hosts): run `up` first")
            os.execvp("ip", cluster.command_in(cluster.host(args.host), command))
    except ClusterError as err:
        print(f"local_cluster: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
