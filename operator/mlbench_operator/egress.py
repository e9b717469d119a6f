"""Where a run's or a fetch Job's pods may connect: address blocks, never the clouds' metadata services.

Clouds serve instance metadata, node credentials included, on link-local addresses (169.254.169.254 on AWS, GCP and
Azure; Alibaba 100.100.100.200 is not link-local and stays the admin's to leave out; AWS over IPv6 at fd00:ec2::254).
A pod that reaches them may take the node's identity, so every egress block the operator writes leaves them out
(:func:`ip_block`), and a block the admin lists that lies within them is refused when the operator starts
(:func:`metadata_overlap`).
"""

from __future__ import annotations

import ipaddress
from typing import Any

#: The link-local metadata blocks no egress rule of the operator's ever allows.
METADATA_BLOCKS = ("169.254.0.0/16", "fd00:ec2::254/128")
#: Every address, per family: a fetch Job's destinations when the admin lists none.
ANYWHERE = ("0.0.0.0/0", "::/0")

_Net = ipaddress.IPv4Network | ipaddress.IPv6Network


def _metadata_nets(version: int) -> list[_Net]:
    nets = [ipaddress.ip_network(block) for block in METADATA_BLOCKS]
    return [net for net in nets if net.version == version]


def _within(inner: _Net, outer: _Net) -> bool:
    """``inner`` lies within ``outer`` (the same family; equal blocks included)."""
    return (
        inner.version == outer.version
        and int(outer.network_address) <= int(inner.network_address)
        and int(inner.broadcast_address) <= int(outer.broadcast_address)
    )


def ip_block(cidr: str) -> dict[str, Any]:
    """The NetworkPolicy peer for ``cidr`` (a normalised block), with the metadata blocks inside it excepted."""
    net = ipaddress.ip_network(cidr)
    inside = [str(m) for m in _metadata_nets(net.version) if m != net and _within(m, net)]
    block: dict[str, Any] = {"cidr": str(net)}
    if inside:
        block["except"] = inside
    return {"ipBlock": block}


def metadata_overlap(cidr: str) -> str | None:
    """The metadata block that ``cidr`` lies within (an exception cannot carve it out), else None."""
    net = ipaddress.ip_network(cidr)
    for meta in _metadata_nets(net.version):
        if _within(net, meta):
            return str(meta)
    return None
