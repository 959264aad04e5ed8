"""Throwaway "hosts" for tests: Linux network namespaces joined by one Ethernet bridge.

What lives here: :class:`Network`, which makes one namespace per role (each with ``lo``
up and an ``eth0`` holding its own IPv4 address), a *switch* namespace holding the bridge
``br0`` that every ``eth0`` is plugged into, and one veth from the root namespace into
that bridge (``crl<tag>`` in the root namespace, holding the subnet's first address), so
the test process itself can reach the hosts; :class:`Host`, a role's namespace and
address; :class:`NetnsUnavailable`, raised (with the failing command's own words) when
this machine cannot make namespaces. Needs root and iproute2's ``ip``.

Why the bridge lives in a namespace of its own: on machines with ``br_netfilter`` loaded
(docker hosts), frames crossing a bridge in the root namespace go through the root
namespace's iptables FORWARD chain, which is often set to drop. A fresh namespace has no
rules, so host-to-host traffic is not filtered there.

The subnet is a /24 of 10.213.0.0/16 that no route of the root namespace overlaps; it
exists only on the interfaces made here, and no namespace has a default route, so traffic
goes only between these namespaces and the root namespace's end of the uplink. Names
carry the process id and a random suffix, so concurrent runs do not collide.
:meth:`Network.destroy` kills whatever still runs in these namespaces (only processes the
test started there), then deletes the uplink and the namespaces (their veths and the
bridge go with them); it is safe to call after a partial :meth:`Network.create`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Host", "NetnsUnavailable", "Network"]

IP = "ip"
COMMAND_TIMEOUT = 15.0  #: seconds for each ``ip`` command
POOL = ipaddress.IPv4Network("10.213.0.0/16")  #: where the test subnets come from


class NetnsUnavailable(RuntimeError):
    """This machine cannot make the namespaces: the message says which command failed
    and what it printed."""


@dataclass(frozen=True)
class Host:
    """One role's namespace and its address on the test subnet."""

    role: str
    netns: str
    address: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's namespace (``ip netns exec`` execs it: the
        process id is the program's own, so signals reach it directly)."""
        return [IP, "netns", "exec", self.netns, *argv]


def _run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        stdin=subprocess.DEVNULL,
        check=False,
    )


class Network:
    """Namespaces for ``roles`` on one bridge; a context manager (create, then destroy)."""

    def __init__(self, roles: Sequence[str], *, tag: str | None = None) -> None:
        if len(set(roles)) != len(roles) or not roles:
            raise ValueError(f"roles must be distinct and not empty, got {roles!r}")
        if len(roles) > 250:
            raise ValueError("at most 250 roles fit in a /24")
        self.roles = list(roles)
        self.tag = tag or f"{os.getpid()}{secrets.token_hex(2)}"
        self.switch = f"crl-{self.tag}-switch"
        self.uplink = f"crl{self.tag}"  # an interface name: at most 15 characters
        if len(self.uplink) > 15:
            raise ValueError(f"tag {self.tag!r} is too long for an interface name")
        self.subnet: ipaddress.IPv4Network | None = None
        self.gateway = ""  #: the root namespace's address on the subnet
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []  # made by us, in order
        self._uplink_made = False

    def __enter__(self) -> Network:
        self.create()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()

    # -- making ----------------------------------------------------------------------

    def _step(self, *args: str) -> str:
        """Run ``ip ARGS``; raise :class:`NetnsUnavailable` with its words if it fails."""
        cmd = [IP, *args]
        try:
            done = _run(cmd)
        except subprocess.TimeoutExpired:
            raise NetnsUnavailable(
                f"`{' '.join(cmd)}` did not finish within {COMMAND_TIMEOUT} s"
            ) from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip() or "(no output)"
            raise NetnsUnavailable(
                f"`{' '.join(cmd)}` failed with exit code {done.returncode}: {said}"
            )
        return done.stdout

    def _free_subnet(self) -> ipaddress.IPv4Network:
        """A /24 of :data:`POOL` that no route or address of the root namespace overlaps."""
        taken: list[ipaddress.IPv4Network] = []
        for listing in (self._step("-4", "route", "show"), self._step("-4", "-o", "addr", "show")):
            for line in listing.splitlines():
                for word in line.split():
                    try:
                        net = ipaddress.IPv4Network(word, strict=False)
                    except ValueError:
                        continue
                    if net.prefixlen > 0:  # "default" and 0.0.0.0/0 cover everything
                        taken.append(net)
                    break
        candidates = list(POOL.subnets(new_prefix=24))
        start = os.getpid() % len(candidates)
        for i in range(len(candidates)):
            net = candidates[(start + i) % len(candidates)]
            if not any(net.overlaps(t) for t in taken):
                return net
        raise NetnsUnavailable(f"every /24 of {POOL} is already routed in the root namespace")

    def _add_namespace(self, name: str) -> None:
        self._step("netns", "add", name)
        self._namespaces.append(name)
        self._step("-n", name, "link", "set", "lo", "up")

    def create(self) -> None:
        """Make the namespaces, the bridge and the links. On failure, undo what was made
        and raise :class:`NetnsUnavailable`."""
        if shutil.which(IP) is None:
            raise NetnsUnavailable("the `ip` command (iproute2) is not installed")
        try:
            self._create()
        except BaseException:
            self.destroy()
            raise

    def _create(self) -> None:
        self.subnet = self._free_subnet()
        addresses = [str(a) for a in self.subnet.hosts()]
        bits = str(self.subnet.prefixlen)
        self.gateway = addresses[0]

        self._add_namespace(self.switch)
        # `ip netns exec` also needs a private mount namespace: check it works here.
        self._step("netns", "exec", self.switch, IP, "link", "show", "lo")
        self._step("-n", self.switch, "link", "add", "br0", "type", "bridge")
        self._step("-n", self.switch, "link", "set", "br0", "up")

        # The uplink: the root namespace's door into the bridge.
        peer = ["peer", "name", "p-root", "netns", self.switch]
        self._step("link", "add", self.uplink, "type", "veth", *peer)
        self._uplink_made = True
        self._step("-n", self.switch, "link", "set", "p-root", "master", "br0", "up")
        self._step("addr", "add", f"{self.gateway}/{bits}", "dev", self.uplink)
        self._step("link", "set", self.uplink, "up")

        for i, role in enumerate(self.roles):
            ns = f"crl-{self.tag}-{role}"
            address = addresses[i + 1]
            self._add_namespace(ns)
            # Both ends are made directly in their namespaces: "eth0" never exists in
            # the root namespace, where that name is usually taken.
            port = f"p{i}"
            self._step(
                "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port,
                "netns", self.switch,
            )  # fmt: skip
            self._step("-n", self.switch, "link", "set", port, "master", "br0", "up")
            self._step("-n", ns, "addr", "add", f"{address}/{bits}", "dev", "eth0")
            self._step("-n", ns, "link", "set", "eth0", "up")
            self.hosts[role] = Host(role, ns, address)

    # -- unmaking --------------------------------------------------------------------

    def _pids_in(self, ns: str) -> list[int]:
        try:
            done = _run([IP, "netns", "pids", ns])
        except subprocess.TimeoutExpired:
            return []
        return [int(p) for p in done.stdout.split() if p.isdigit()]

    def destroy(self) -> list[str]:
        """Kill what still runs in our namespaces, delete the uplink and the namespaces.
        Returns the problems met (also checked by :meth:`leftovers`); never raises for
        a missing piece."""
        problems: list[str] = []
        for ns in self._namespaces:
            for pid in self._pids_in(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # a process the test started in there
        deadline = time.monotonic() + 10
        for ns in self._namespaces:
            while self._pids_in(ns) and time.monotonic() < deadline:
                time.sleep(0.05)
        if self._uplink_made:
            # Deleting one end of a veth deletes both, synchronously.
            done = _run([IP, "link", "del", self.uplink])
            if done.returncode != 0 and "Cannot find device" not in done.stderr:
                problems.append(f"ip link del {self.uplink}: {done.stderr.strip()}")
            self._uplink_made = False
        for ns in reversed(self._namespaces):
            done = _run([IP, "netns", "del", ns])
            if done.returncode != 0:
                problems.append(f"ip netns del {ns}: {done.stderr.strip()}")
        self._namespaces.clear()
        self.hosts.clear()
        return problems

    def leftovers(self) -> list[str]:
        """Namespaces or the uplink of this network that still exist (empty when clean)."""
        mine = f"crl-{self.tag}-"
        listed = _run([IP, "netns", "list"]).stdout.split()
        left = [name for name in listed if name.startswith(mine)]
        if _run([IP, "link", "show", self.uplink]).returncode == 0:
            left.append(self.uplink)
        return left
