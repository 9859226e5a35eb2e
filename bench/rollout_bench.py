"""Model an AMI rollout (a rolling instance refresh) of every pool of every shipped stack: how long it takes with
the warmup the ASGs had (the launch hook's timeout), with the one they have now
(decisions/nodes/boot.node_ready_seconds), and the floor: the time the nodes themselves need, batch after batch, with no
idle wait. Prints a Markdown table; results are kept in bench/RESULTS.md.

How EC2 Auto Scaling paces a rolling refresh (read 2026-12-04; "the guide" is its user guide as kept in
awsdocs/amazon-ec2-auto-scaling-user-guide doc_source/asg-instance-refresh.md):
- it replaces a batch of instances, then waits until they are healthy and their warmup has passed before the next
  batch; with a launch hook, warmup starts only once the hook is complete and the instance is InService (the guide,
  "Considerations"; docs.aws.amazon.com/autoscaling/ec2/APIReference/API_RefreshPreferences.html InstanceWarmup);
- MinHealthyPercentage is the share of the desired capacity kept in service, "rounded up to the nearest integer"
  (the guide); MaxHealthyPercentage (100 to 200) the most that may be in service or pending, so rounded down here;
  the range between them is how many instances it replaces at once (APIReference/API_InstanceMaintenancePolicy.html),
  and never fewer than one: a minimum of 100 % "limits the rate of replacement to one instance at a time" (the
  guide). Reserved and capacity-block pools keep a maximum of 100 % with a minimum of (n-1)/n (decisions/nodes/pools.py
  refresh_preferences): one node at a time, as a reservation has no spare room.

One step: a node boots to the gate's CONTINUE (decisions/nodes/boot.worst_case for the pool's shape, EC2 start
included), then registers and advertises its GPUs (decisions/nodes/boot.node_ready_seconds) inside the warmup, which
starts at the same moment. So a step takes CONTINUE + max(warmup, ready), and the floor's step CONTINUE + ready. Every
figure is the worst case the hook and the warmup are sized for. Nodes: the pool's desiredNodes (what the group runs when
a deploy starts the refresh; cluster-autoscaler may have moved it since), or maxNodes with --nodes max. Left out, the
same in every column: draining the node a step replaces (the termination hook, up to decisions/nodes/drain.py
LIFECYCLE_DRAIN_TIMEOUT_S, bounded by its pods' grace).

    .venv/bin/python -m bench.rollout_bench [--nodes desired|max] [--driver-source ami|install]
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import List, Optional

from decisions.nodes import boot
from decisions.nodes import pools as pool_rules
from decisions.storage import lustre as lustre_rules
from plan.stackfile import known_stacks, load_stack


@dataclass(frozen=True)
class PoolRollout:
    stack: str
    pool: str
    capacity: str
    nodes: int
    batch: int
    to_in_service_s: int      # launch and the gate, to CONTINUE
    ready_s: int              # CONTINUE to GPUs advertised
    old_warmup_s: int         # the launch hook's timeout
    new_warmup_s: int

    @property
    def old_s(self) -> int:
        return rollout_seconds(self.nodes, self.batch, self.to_in_service_s, self.ready_s, self.old_warmup_s)

    @property
    def new_s(self) -> int:
        return rollout_seconds(self.nodes, self.batch, self.to_in_service_s, self.ready_s, self.new_warmup_s)

    @property
    def floor_s(self) -> int:
        return rollout_seconds(self.nodes, self.batch, self.to_in_service_s, self.ready_s, 0)


def batch_size(nodes: int, min_healthy_percentage: int, max_healthy_percentage: int) -> int:
    """Instances one refresh step replaces: the room between the minimum kept in service (rounded up) and the
    maximum in service or pending (rounded down), at least one and at most the group."""
    keep = -(-nodes * min_healthy_percentage // 100)
    most = nodes * max_healthy_percentage // 100
    return min(nodes, max(1, most - keep))


def rollout_seconds(nodes: int, batch: int, to_in_service_s: int, ready_s: int, warmup_s: int) -> int:
    """A refresh of `nodes` in steps of `batch`: each step boots its nodes to InService, then waits the warmup,
    inside which they become ready (a warmup shorter than that still leaves the step as long as the nodes)."""
    steps = -(-nodes // batch) if nodes else 0
    return steps * (to_in_service_s + max(warmup_s, ready_s))


def stack_rollouts(stack: str, nodes: str = "desired", driver_source: Optional[str] = None) -> List[PoolRollout]:
    """Every pool of a shipped stack, booting with its own driver source or `driver_source`."""
    _, spec = load_stack(stack)
    source = driver_source or spec.node_image.source
    rows = []
    for pool in spec.pools:
        count = pool.spec.desired_nodes if nodes == "desired" else pool.spec.max_nodes
        refresh = pool_rules.refresh_preferences(pool)
        # The same shape components/nodes/nodepool.py renders into the pool's user-data.
        steps = boot.worst_case(source, nvswitch=spec.catalog.gpu_model(pool.primary_type.name).nvswitch,
                                efa=pool.efa, lustre=lustre_rules.mounts_lustre(pool, spec.storage.lustre is not None))
        rows.append(PoolRollout(
            stack=stack, pool=pool.name, capacity=pool.spec.capacity, nodes=count,
            batch=batch_size(count, refresh.min_healthy_percentage, refresh.max_healthy_percentage),
            to_in_service_s=sum(steps.values()), ready_s=boot.node_ready_seconds(),
            old_warmup_s=boot.verify_hook_timeout(source), new_warmup_s=boot.node_ready_seconds()))
    return rows


def _minutes(seconds: int) -> str:
    return f"{seconds / 60:.1f}"


def _ratio(seconds: int, floor: int) -> str:
    return f"{seconds / floor:.2f}" if floor else "-"


def table(rows: List[PoolRollout]) -> str:
    lines = ["| stack | pool | capacity | nodes | batch | per node min | old min | new min | floor min "
             "| old / floor | new / floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.stack} | {r.pool} | {r.capacity} | {r.nodes} | {r.batch} | "
                     f"{_minutes(r.to_in_service_s + r.ready_s)} | {_minutes(r.old_s)} | {_minutes(r.new_s)} | "
                     f"{_minutes(r.floor_s)} | {_ratio(r.old_s, r.floor_s)} | {_ratio(r.new_s, r.floor_s)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", choices=("desired", "max"), default="desired")
    parser.add_argument("--driver-source", choices=tuple(boot.VERIFY_HOOK_TIMEOUT_S),
                        help="model every pool on this driver source (default: each stack's own)")
    args = parser.parse_args()
    print(table([row for stack in known_stacks() for row in stack_rollouts(stack, args.nodes, args.driver_source)]))


if __name__ == "__main__":
    main()
