"""The CrossGuard entry point: `pulumi preview --policy-pack policy` runs this file, which serves the pack.

Constructing a PolicyPack starts the analyzer's gRPC server and blocks, so nothing imports this module: tests and
the offline plan use policy/policies.py directly (plan/policy_runner.py).
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # the engine starts the pack in policy/; the policies import decisions/ from the root

from pulumi_policy import PolicyPack  # noqa: E402

from policy.policies import PACK_ENFORCEMENT, PACK_NAME, POLICIES, initial_config  # noqa: E402


def stack_budget():
    """The stack's gpu-cloud:budget (maxHourlyUsd, the unpriced items it acknowledges and the prices it assumes), read
    from its stack file (the engine names the stack in PULUMI_STACK); (None, (), {}) when there is no stack file or no
    budget, and the budget policy says it is not applicable."""
    from plan.stackfile import load_stack_config

    stack = os.environ.get("PULUMI_STACK", "").rsplit("/", 1)[-1]
    if not stack or not (ROOT / "stacks" / f"Pulumi.{stack}.yaml").exists():
        return None, (), {}
    budget = load_stack_config(stack).get("gpu-cloud:budget") or {}
    if not isinstance(budget, dict):
        return None, (), {}
    return budget.get("maxHourlyUsd"), tuple(budget.get("unpriced") or ()), dict(budget.get("assumed") or {})


PolicyPack(name=PACK_NAME, policies=POLICIES, enforcement_level=PACK_ENFORCEMENT,
           initial_config=initial_config(*stack_budget()))
