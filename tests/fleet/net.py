"""The lab's network: one bridge, a namespace per host, and the faults a link can suffer.

Each host's namespace has one interface, ``eth0``, whose veth peer (named after
the namespace) hangs on the bridge; the bridge's own address is the lab's. What
a fault does to a link, and why it is done that way on this kernel (which has no
``sch_netem`` and no tc actions, only ``htb``/``tbf``/``pfifo`` and ``u32``):

- **link down** (a host cut off): the root-side veth goes down; the host's
  packets go nowhere, silently, in both directions.
- **silent cut** of one peer: on both ends, a /32 route to the other through a
  next hop whose MAC address nobody has; the bridge floods the frames and no one
  takes them. New connections time out, open ones stall: a real partition.
- **refused cut** of one peer: an ``unreachable`` route on both ends; every send
  fails at once with "no route to host" (a router that knows the path is gone).
- **shaping** of one peer: an ``htb`` class at a low rate with a short ``pfifo``
  on both ends, so packets queue (delay) and the queue's tail is dropped (loss);
  the Coder host's front door adds a fixed delay on top (see :mod:`.relay`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .slots import Slot

#: The last octet of the next hop that no one answers for (silent cuts).
NOWHERE = 254
NOWHERE_MAC = "02:00:00:00:00:fe"
#: htb's handle for a shaped peer's class, and the default class for everything else.
SHAPED, FREE = 20, 10


class NetError(RuntimeError):
    pass


async def sh(*argv: str) -> str:
    """Run a command; its stdout, or :class:`NetError` with its stderr."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise NetError(f"{' '.join(argv)}: {err.decode(errors='replace').strip()}")
    return out.decode(errors="replace")


@dataclass(frozen=True)
class Host:
    """One host: its namespace, its address, and the bridge-side end of its link."""

    name: str
    ns: str
    address: str

    @property
    def veth(self) -> str:
        return self.ns

    def ip(self, *args: str) -> list[str]:
        return ["ip", "-n", self.ns, *args]

    def exec(self, *argv: str) -> list[str]:
        """``argv`` run inside this host: its network, and a hostname of its own."""
        return [
            "ip",
            "netns",
            "exec",
            self.ns,
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            f'hostname {self.name} && exec "$@"',
            "sh",
            *argv,
        ]


@dataclass
class Network:
    slot: Slot

    @property
    def gateway(self) -> str:
        """The bridge's own address: where the lab (this process) is reached."""
        return self.slot.address(1)

    async def create(self) -> None:
        bridge = self.slot.bridge
        await sh("ip", "link", "add", bridge, "type", "bridge")
        await sh("ip", "addr", "add", f"{self.gateway}/24", "dev", bridge)
        await sh("ip", "link", "set", bridge, "up")

    async def add_host(self, name: str, last_octet: int) -> Host:
        host = Host(name, self.slot.name(name), self.slot.address(last_octet))
        await sh("ip", "netns", "add", host.ns)
        await sh(
            "ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.ns
        )
        await sh("ip", "link", "set", host.veth, "master", self.slot.bridge, "up")
        await sh(*host.ip("addr", "add", f"{host.address}/24", "dev", "eth0"))
        for dev in ("lo", "eth0"):
            await sh(*host.ip("link", "set", dev, "up"))
        await sh(*host.ip("route", "add", "default", "via", self.gateway))
        await sh(*host.ip("neigh", "replace", self._nowhere, "lladdr", NOWHERE_MAC, "dev", "eth0"))
        return host

    @property
    def _nowhere(self) -> str:
        return self.slot.address(NOWHERE)

    # -- a whole host --------------------------------------------------------------------
    async def link(self, host: Host, up: bool) -> None:
        await sh("ip", "link", "set", host.veth, "up" if up else "down")

    # -- one peer ------------------------------------------------------------------------
    async def cut(self, host: Host, peer: Host, how: str) -> None:
        """Cut ``host`` off from ``peer`` (both ways): ``silent`` or ``refused``."""
        for a, b in ((host, peer), (peer, host)):
            if how == "silent":
                await sh(*a.ip("route", "add", f"{b.address}/32", "via", self._nowhere))
            else:
                await sh(*a.ip("route", "add", "unreachable", f"{b.address}/32"))

    async def heal(self, host: Host, peer: Host) -> None:
        for a, b in ((host, peer), (peer, host)):
            await sh(*a.ip("route", "del", f"{b.address}/32"))

    async def shape(self, host: Host, peer: Host, rate_kbit: int, queue_packets: int) -> None:
        """Slow the link between ``host`` and ``peer`` to ``rate_kbit``, each way, with a
        queue of ``queue_packets`` (what overflows it is dropped)."""
        for tc, dev, match in self._ends(host, peer):
            for command in (
                f"qdisc add dev {dev} root handle 1: htb default {FREE}",
                f"class add dev {dev} parent 1: classid 1:{FREE} htb rate 10gbit quantum 60000",
                f"class add dev {dev} parent 1: classid 1:{SHAPED} htb rate {rate_kbit}kbit "
                f"ceil {rate_kbit}kbit quantum 1514",
                f"qdisc add dev {dev} parent 1:{SHAPED} pfifo limit {queue_packets}",
                f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match {match} "
                f"flowid 1:{SHAPED}",
            ):
                await sh(*tc, *command.split())

    async def unshape(self, host: Host, peer: Host) -> None:
        for tc, dev, _ in self._ends(host, peer):
            await sh(*tc, "qdisc", "del", "dev", dev, "root")

    async def shaped_drops(self, host: Host, peer: Host) -> int:
        """Packets the shaped queues between ``host`` and ``peer`` dropped so far."""
        dropped = 0
        for tc, dev, _ in self._ends(host, peer):
            out = await sh(*tc, "-s", "qdisc", "show", "dev", dev, "parent", f"1:{SHAPED}")
            for line in out.splitlines():
                if "dropped" in line:
                    dropped += int(line.split("dropped")[1].split(",")[0].strip())
        return dropped

    @staticmethod
    def _ends(host: Host, peer: Host) -> list[tuple[list[str], str, str]]:
        """(tc command, device, u32 match) of each end: the host's own egress toward the
        peer, and the bridge side's egress toward the host (what the peer sends it)."""
        inside = ["ip", "netns", "exec", host.ns, "tc"]
        return [
            (inside, "eth0", f"ip dst {peer.address}/32"),
            (["tc"], host.veth, f"ip src {peer.address}/32"),
        ]
