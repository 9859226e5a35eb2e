"""A Triton pod's end, walked second by second: the pod's timings, the NLB's flows and Triton's own stop order, to
find every request still in flight when something closes its connection.

Each system acts as its source at the pinned version says (the lines are cited where it acts):
- the pod: the kubelet runs preStop, then sends SIGTERM, and kills what still runs when the grace (or, on a node
  drain, the drainer's limit; on spot, the node itself) runs out;
- the NLB: DeregisterTargets comes once the controller sees the pod terminate; new flows may reach the pod for a while
  after (AWS documents no figure: decisions/serving/triton.py takes the measured one); established flows stay, and
  are closed when the deregistration delay ends only if the target group says so
  (deregistration_delay.connection_termination.enabled);
- Triton server v2.71.0 on SIGTERM (src/main.cc lines 559-575): HTTP first (src/http_server.cc lines 242-256: no new
  connection, lines 293-294; then a wait of one second at a time while any connection is open, spending the shared
  --exit-timeout-secs budget; then every connection closed), gRPC with what is left (src/grpc/grpc_server.cc lines
  2584-2606: Shutdown, which sends GOAWAY, and a wait for its calls, lines 2653-2662), the core with the rest (core
  r26.06 src/server.cc lines 300-378), then gRPC stopped by force (main.cc line 575) and the process exits;
  --grpc-max-connection-age sends GOAWAY to each connection at that age, up to 10 % later, and closes it
  --grpc-max-connection-age-grace after (grpc/grpc src/core/ext/filters/max_age/max_age_filter.cc).
- clients: each sends requests back to back on a connection (from a moment after it opens), stops using it at its
  own maximum age (if it has one) or on GOAWAY (gRPC), and opens the next one through the NLB.

The walk is the worst case: every client is busy all the time, DeregisterTargets comes as late as the controller
margin allows, the NLB's new flows reach this pod up to the last second they may, gRPC's jitter gives each connection
its longest age, and each of the pod's own HTTP checks is open for its whole timeout at SIGTERM.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

FOREVER = math.inf


@dataclass(frozen=True)
class PodTimings:
    prestop_s: int                      # the preStop pause; SIGTERM follows
    exit_timeout_s: int                 # Triton's --exit-timeout-secs
    kill_s: float                       # when everything still running is killed: the grace, a drainer's limit, a node gone
    deregistration_delay_s: int
    terminate_connections: bool         # deregistration_delay.connection_termination.enabled
    grpc_max_age_s: Optional[float]     # --grpc-max-connection-age (None: unset, connections live on)
    grpc_age_grace_s: float             # --grpc-max-connection-age-grace (gRPC's default: none)
    health_check_s: int                 # the longest of the pod's own HTTP checks, open at SIGTERM
    grpc_age_jitter: float = 0.1        # gRPC core: MAX_CONNECTION_AGE_JITTER


@dataclass(frozen=True)
class Client:
    name: str
    protocol: str                       # "http" or "grpc"
    request_s: float                    # each request's length
    max_age_s: float = FOREVER          # the client uses a connection no longer than this
    first_after_s: float = 0            # its first request on a connection starts this long after it opens


@dataclass(frozen=True)
class Lost:
    client: str
    opened_s: float                     # the connection's
    started_s: float                    # the request's
    cut_s: float
    by: str


@dataclass(frozen=True)
class Walk:
    sigterm_s: Optional[float]          # None: killed before the pause ended
    http_closed_s: Optional[float]      # Triton's HTTP stop closes every HTTP connection
    exited_s: float                     # Triton's process ends (or is killed)
    lost: List[Lost]


@dataclass
class _Connection:
    client: Client
    opened: float
    no_new_from: float                  # the first moment the client sends nothing more on it
    cuts: List[tuple]                   # (time, what) that close it whatever is in flight

    def run(self) -> tuple:
        """(when it closes, the request lost or None): requests back to back until the client stops or a cut."""
        start = self.opened + self.client.first_after_s
        first_cut = min(((t, by) for t, by in self.cuts if t >= self.opened), default=(FOREVER, ""))
        while start < self.no_new_from and start <= first_cut[0]:       # one sent as the cut comes is lost
            end = start + self.client.request_s
            cut = min(((t, by) for t, by in self.cuts if t >= start), default=(FOREVER, ""))
            if cut[0] < end:
                return cut[0], Lost(self.client.name, self.opened, start, cut[0], cut[1])
            start = end
        return min(start, first_cut[0]), None


def walk(pod: PodTimings, clients: Sequence[Client], *, deregistered_s: float, new_flows_s: float,
         oldest_connection_s: float = 300) -> Walk:
    """Every connection a client can have with the pod, from one opened `oldest_connection_s` before the pod began
    to terminate (time 0) to one the NLB opens at the last second it may (`deregistered_s` + `new_flows_s`)."""
    sigterm = pod.prestop_s if pod.prestop_s < pod.kill_s else None
    nlb_cut = deregistered_s + pod.deregistration_delay_s if pod.terminate_connections else FOREVER
    shared = [(pod.kill_s, "killed")] + ([(nlb_cut, "the NLB's connection termination")] if nlb_cut < FOREVER else [])
    last_flow = deregistered_s + new_flows_s
    opens = [t for t in range(-int(oldest_connection_s), int(last_flow) + 1)
             # Triton refuses connections from SIGTERM on (http_server.cc lines 293-294); none after the kill.
             if t < (pod.kill_s if sigterm is None else sigterm)]

    def grpc_limits(opened: float, graceful: float) -> tuple:
        goaway = FOREVER
        cuts = list(shared)
        if pod.grpc_max_age_s is not None:
            goaway = opened + pod.grpc_max_age_s * (1 + pod.grpc_age_jitter)
            cuts.append((goaway + pod.grpc_age_grace_s, "gRPC's max connection age grace"))
        return min(goaway, graceful), cuts

    def connections(client: Client, graceful: float, http_closed: float, exited: float) -> List[_Connection]:
        made = []
        for opened in opens:
            if client.protocol == "http":
                made.append(_Connection(client, opened, opened + client.max_age_s,
                                        shared + [(http_closed, "Triton's HTTP stop"), (exited, "Triton's exit")]))
            else:
                goaway, cuts = grpc_limits(opened, graceful)
                made.append(_Connection(client, opened, min(opened + client.max_age_s, goaway),
                                        cuts + [(exited, "Triton's exit")]))
        return made

    if sigterm is None:
        lost = [loss for client in clients for conn in connections(client, FOREVER, FOREVER, FOREVER)
                if (loss := conn.run()[1])]
        return Walk(None, None, pod.kill_s, lost)

    budget = pod.exit_timeout_s
    # HTTP: open at SIGTERM are the pod's checks and every client connection not yet closed (Triton's stop aside).
    http_open_until = [sigterm + pod.health_check_s]
    for client in clients:
        if client.protocol == "http":
            for conn in connections(client, FOREVER, FOREVER, FOREVER):
                closed, _ = conn.run()
                if conn.opened < sigterm < closed:
                    http_open_until.append(closed)
    http_wait = min(budget, math.ceil(max(http_open_until) - sigterm))
    http_closed = graceful = sigterm + http_wait
    # gRPC's GracefulStop, then the core, wait with what is left for the calls in flight at `graceful`.
    in_flight_until = [graceful]
    for client in clients:
        if client.protocol == "grpc":
            for conn in connections(client, graceful, FOREVER, FOREVER):
                closed, loss = conn.run()
                if loss is None and conn.opened < graceful < closed:
                    in_flight_until.append(closed)
    exited = min(graceful + math.ceil(max(in_flight_until) - graceful), sigterm + budget, pod.kill_s)
    lost = [loss for client in clients for conn in connections(client, graceful, http_closed, exited)
            if (loss := conn.run()[1])]
    return Walk(sigterm, http_closed, exited, lost)
