"""DNS for inference across the two regions, as plain decisions (components/serving/failover.py makes the records).

Each stack with a DR role owns its half of one Route 53 record set for `dr.domain` in `dr.hostedZoneId`: a CNAME to
its Triton load balancer, with a health check, and a routing policy chosen by `dr.routing`:
- **failover** (active-passive, the default): PRIMARY in the primary stack, SECONDARY in the secondary. Every
  client goes to the primary while it is healthy. Fits when the secondary is smaller or its models lag: one region
  serves, the other waits.
- **weighted** (active-active): both records at the same weight; Route 53 answers each region half of the time,
  and only healthy ones. Fits two regions of equal size, with the same models, and clients anywhere.
- **latency** (active-active): each client gets the region with the lower latency to it, among the healthy ones.
  Fits clients spread over both continents.

The health check follows Triton's readiness path (/v2/health/ready on its HTTP port):
- an **internet-facing** load balancer: Route 53's checkers call the path through the load balancer's DNS name;
- an **internal** one, which Route 53's checkers (on the internet) cannot reach: a CloudWatch alarm on the
  load balancer's healthy target count, whose targets are checked on the same path by the load balancer itself,
  and a Route 53 health check that follows the alarm.

The alarm means "no node of the load balancer sees a ready Triton", never "one node sees none". CloudWatch's
Minimum and Maximum of HealthyHostCount are over the data points of the individual load balancer nodes, and the
ELB guide recommends alarming on the Maximum of HealthyHostCount when it falls below what is needed, or 0
(docs.aws.amazon.com/elasticloadbalancing/latest/network/load-balancer-cloudwatch-metrics.html, "Statistics for
Network Load Balancer metrics"). With cross-zone load balancing off, the NLB's default, a node sends only to the
targets of its own zone (".../network/target-group-cross-zone.html"): a node in a zone without a Triton replica has
none, so the Minimum would fail over a region that serves. gpu-cloud turns cross-zone on for Triton's NLB
(decisions/serving/lb_controller.py), but the alarm does not rely on it. HealthyHostCount is "reported if there are
registered targets" (same page): a load balancer left with none reports nothing, which the alarm treats as breaching.

Triton's own readiness is what the alarm watches: the load balancer checks every replica on /v2/health/ready, the
path clients take. A signal from inside the cluster (Prometheus' view of the pods) was not chosen: it dies with the
region it should report on, and Route 53 can follow only a CloudWatch alarm or an endpoint it reaches itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, get_args

from decisions.config.model import Dr

ROUTINGS = get_args(Dr.model_fields["routing"].annotation)     # what `dr.routing` accepts
HEALTH_PATH = "/v2/health/ready"       # Triton: ready once its models are loaded (docs/protocol: health)
HTTP_PORT = 8000                       # Triton's HTTP endpoint, the Service's port

# Route 53 HTTP checks (internet-facing): every 10 s (the "fast" interval), unhealthy after 3 failures in a row.
REQUEST_INTERVAL_S = 10
FAILURE_THRESHOLD = 3
RECORD_TTL_S = 60                      # how long resolvers may keep the old answer after a failover
# Internal: the load balancer checks each target every 10 s and marks it unhealthy after 3 failures
# (the Service's health-check annotations); the alarm trips when the most healthy targets any node of the load
# balancer reports stays below 1 for 2 of the last 3 one-minute periods. Three, not two: the minute in which the
# targets fail may still hold a healthy report, which the Maximum keeps.
TARGET_CHECK_INTERVAL_S = 10
TARGET_UNHEALTHY_THRESHOLD = 3
ALARM_NAMESPACE = "AWS/NetworkELB"
ALARM_METRIC = "HealthyHostCount"
ALARM_STATISTIC = "Maximum"
ALARM_COMPARISON = "LessThanThreshold"
ALARM_THRESHOLD = 1
ALARM_TREAT_MISSING_DATA = "breaching"
ALARM_PERIOD_S = 60
ALARM_DATAPOINTS_TO_ALARM = 2
ALARM_EVALUATION_PERIODS = ALARM_DATAPOINTS_TO_ALARM + 1
WEIGHT = 100                           # both regions equal under weighted routing


@dataclass(frozen=True)
class RecordPolicy:
    kind: str                          # "failover" | "weighted" | "latency"
    failover: Optional[str] = None     # PRIMARY | SECONDARY
    weight: Optional[int] = None
    region: Optional[str] = None


def record_policy(role: str, routing: str, region: str) -> RecordPolicy:
    """This stack's half of the record set."""
    if role not in ("primary", "secondary"):
        raise ValueError(f"dr.role {role!r} makes no DNS record; primary or secondary do")
    if routing == "failover":
        return RecordPolicy("failover", failover="PRIMARY" if role == "primary" else "SECONDARY")
    if routing == "weighted":
        return RecordPolicy("weighted", weight=WEIGHT)
    if routing == "latency":
        return RecordPolicy("latency", region=region)
    raise ValueError(f"dr.routing {routing!r}: allowed {', '.join(ROUTINGS)}")


def detection_seconds(scheme: str) -> int:
    """How long after the endpoint stops answering its record is marked unhealthy (worst case)."""
    if scheme == "internet-facing":
        return REQUEST_INTERVAL_S * FAILURE_THRESHOLD
    # the load balancer's own checks, then the alarm's window (Route 53 reads the alarm state as it changes)
    return TARGET_CHECK_INTERVAL_S * TARGET_UNHEALTHY_THRESHOLD + ALARM_PERIOD_S * ALARM_EVALUATION_PERIODS


def arn_suffix(arn: str) -> str:
    """The CloudWatch dimension form of an ELB ARN: `net/name/id` or `targetgroup/name/id`."""
    parts = arn.split(":", 5)
    if len(parts) != 6 or "/" not in parts[5]:
        raise ValueError(f"{arn!r} is not an ELB ARN")
    resource = parts[5]
    return resource.split("/", 1)[1] if resource.startswith("loadbalancer/") else resource


def set_identifier(stack: str) -> str:
    """What tells the two halves of the record set apart: the stack's name."""
    return stack


# Route 53 takes a caller reference of up to 64 characters; the AWS provider appends a 37-character unique suffix
# to the reference name (terraform-provider-aws route53 health check), so the name itself may have 27.
REFERENCE_NAME_MAX = 27


def reference_name(stack: str) -> str:
    """The health check's reference name: the stack's, cut to what the provider accepts."""
    return stack[:REFERENCE_NAME_MAX]
