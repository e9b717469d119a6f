"""A run's ``spec.network``: the emulated bandwidth, latency, jitter and loss between its workers."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mlbench_api.common import (
    ApiModel,
    cel,
)


def _network_rules(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    schema["x-kubernetes-validations"] = [
        cel(
            "has(self.bandwidthMbit) || has(self.latencyMs) || has(self.lossPercent)",
            "set at least one of bandwidthMbit, latencyMs, lossPercent",
        ),
        cel("!has(self.jitterMs) || has(self.latencyMs)", "jitterMs needs latencyMs", ".jitterMs"),
    ]


#: Round trips of ssh's connect and handshake (TCP, banners, key exchange, authentication).
SSH_HANDSHAKE_ROUND_TRIPS = 4


class NetworkConditions(ApiModel):
    """Emulated network between the workers (Linux tc on each worker pod's interface, egress: htb for the rate,
    netem for delay and loss).

    Applied by an init container with NET_ADMIN, which leaves the restricted Pod Security profile: the operator
    refuses it unless its admin allows it (MLBENCH_ALLOW_NETWORK_EMULATION). Recorded in the run's result.
    """

    model_config = ConfigDict(json_schema_extra=_network_rules)

    bandwidth_mbit: Annotated[float, Field(gt=0, le=400_000)] | None = None
    """Egress rate of each worker in Mbit/s (an htb class); unset: not limited."""
    latency_ms: Annotated[float, Field(ge=0, le=10_000)] | None = None
    """Delay added to every packet a worker sends, in milliseconds (a round trip gains twice this)."""
    jitter_ms: Annotated[float, Field(ge=0, le=10_000)] | None = None
    """Random variation of latencyMs, in milliseconds (needs latencyMs)."""
    loss_percent: Annotated[float, Field(ge=0, lt=100)] | None = None
    """Percentage of sent packets dropped at random (TCP retransmits them: the cost shows as time)."""

    def ssh_handshake_delay(self) -> int:
        """Whole seconds this delay (latency plus jitter, on either side's egress) adds to an ssh connect and
        handshake (:data:`SSH_HANDSHAKE_ROUND_TRIPS`): what ssh's ConnectTimeout and sshd's LoginGraceTime must
        allow on top (5 s of latency made every launch time out in the banner exchange)."""
        one_way = ((self.latency_ms or 0.0) + (self.jitter_ms or 0.0)) / 1000
        return math.ceil(2 * SSH_HANDSHAKE_ROUND_TRIPS * one_way)

    @model_validator(mode="after")
    def _rules(self) -> NetworkConditions:
        if self.bandwidth_mbit is None and self.latency_ms is None and self.loss_percent is None:
            raise ValueError("set at least one of bandwidthMbit, latencyMs, lossPercent")
        if self.jitter_ms is not None and self.latency_ms is None:
            raise ValueError("jitterMs: needs latencyMs")
        return self
