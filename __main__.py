"""gpu-cloud: one regional GPU cluster per stack.

Reads the stack config once, validates all of it and checks it against the account (through the stack's own AWS
provider, the only thing registered first), then builds its layers in order (layers.py):

1. foundation: network -> EKS cluster -> buckets (logs, datasets, checkpoints, models, node artifacts; replicated to
   the DR peer from a primary);
2. compute: spot/scale-in draining -> one GPU node pool per `nodePools` entry -> cluster-autoscaler;
3. observability: Prometheus, alert rules, Alertmanager, Grafana (before the platform, which needs its CRDs);
4. platform: GPU node repair -> GPU operator (and EFA device plugin) -> Kueue, MPI Operator, JobSet and the load
   balancer controller -> team tenancy -> the training jobs' bucket access -> FSx for Lustre -> the training queue;
5. serving: Triton behind an NLB, scaled on its queue time -> its half of the two regions' DNS record;

and exports what operators and the DR peer read.
"""
import layers

stack = layers.prepare()
base = layers.foundation(stack)
node_pools = layers.compute(stack, base)
monitoring = layers.observability(stack, base)
team_platform = layers.platform(stack, base, monitoring)
layers.serving(stack, base, team_platform, monitoring)
layers.outputs(stack, base, node_pools)
