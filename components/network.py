"""The cluster VPC: subnets per zone, NAT, VPC endpoints for what nodes call, and flow logs.

Nodes live in private subnets (sized for VPC CNI pod addresses by `decisions.network.network_plan`); public
subnets hold only NAT gateways and internet-facing load balancers. Interface endpoints keep what the
cluster's own software calls (image pulls, the CNI, Pod Identity, the autoscaler, the drain queue, Session
Manager) inside the VPC; the S3 gateway endpoint carries ECR layers and the node gate's bundles, and lets through
this account's buckets and the few others nodes read (decisions/network/s3_endpoint.py).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

import pulumi
import pulumi_aws as aws

from components.iam import log_group_key_policy
from decisions.network.network_plan import plan_subnets
from decisions.network.s3_endpoint import gateway_endpoint_policy
from decisions.observability.logs import CLOUDWATCH_RETENTION_DAYS, flow_log_group_name, log_group_arn

NAT_MODES = ("one-per-az", "single")

# Interface endpoints, each for a consumer this program runs (a test holds each to its consumer): short
# resource-name suffix -> service (com.amazonaws.<region>.<service>). Everything else leaves through NAT.
INTERFACE_ENDPOINTS: Mapping[str, str] = {
    "ecr-api": "ecr.api",                 # image pulls: every EKS add-on image is in ECR (manifests, auth)
    "ecr-dkr": "ecr.dkr",                 # image pulls: registry API (layers come through the S3 gateway)
    "ec2": "ec2",                         # VPC CNI (interfaces, addresses), nodeadm, the node gate's CreateTags
    "eks-auth": "eks-auth",               # Pod Identity: credentials of every add-on role
    "autoscaling": "autoscaling",         # cluster-autoscaler; the node gate's CompleteLifecycleAction
    "sqs": "sqs",                         # aws-node-termination-handler reads its queue
    "ssm": "ssm",                         # Session Manager on nodes (AmazonSSMManagedInstanceCore)
    "ssmmessages": "ssmmessages",         # Session Manager sessions
    "ec2messages": "ec2messages",         # the SSM agent's command channel
}


ROLE_PRIVATE = "private"
ROLE_PUBLIC = "public"
_ROLE_TAGS = {ROLE_PRIVATE: "kubernetes.io/role/internal-elb", ROLE_PUBLIC: "kubernetes.io/role/elb"}


@dataclass(frozen=True)
class NetworkArgs:
    cidr: str
    # zone IDs in subnet order (decisions/network/network_plan.py); resource names carry them
    zones: Tuple[str, ...]
    nat_gateways: str            # "one-per-az" | "single"
    cluster_name: str            # EKS cluster name, for kubernetes.io/cluster/<name> subnet tags
    flow_log_retention_days: int
    # The stack's region, account and partition as prepare read them once (layers.Stack): names, ARNs, policies and
    # endpoint service names, with no invoke of the component's own.
    region: str
    account_id: str
    partition: str                  # "aws", "aws-cn", "aws-us-gov"
    dns_suffix: str                 # "amazonaws.com", ...: service principals
    reverse_dns_prefix: str         # "com.amazonaws", ...: interface endpoint service names
    transit_gateway_id: Optional[str] = None     # an existing transit gateway to attach the private subnets to
    transit_routes: Tuple[str, ...] = ()         # networks reached through it (the deployer's runners, ...)
    # buckets of other accounts the stack reads (Triton's model repository), which the S3 endpoint must let through
    readable_bucket_arns: Tuple[str, ...] = ()


def _tags(name: str, *, cluster_name: Optional[str] = None, role: Optional[str] = None) -> Dict[str, str]:
    """The tags a resource adds to the provider's default tags: its Name, and for subnets the EKS role tags."""
    tags = {"Name": name}
    if role is not None:
        tags[_ROLE_TAGS[role]] = "1"
        tags[f"kubernetes.io/cluster/{cluster_name}"] = "shared"
    return tags


def _validate(args: NetworkArgs) -> None:
    if not args.zones:
        raise ValueError("Network needs at least one zone")
    if len(set(args.zones)) != len(args.zones):
        raise ValueError(f"Network zones repeat: {', '.join(args.zones)}")
    if args.nat_gateways not in NAT_MODES:
        raise ValueError(f"nat_gateways must be one of {', '.join(NAT_MODES)}, got {args.nat_gateways!r}")
    if args.flow_log_retention_days not in CLOUDWATCH_RETENTION_DAYS:
        raise ValueError(f"flow_log_retention_days {args.flow_log_retention_days} is not a CloudWatch Logs "
                         f"retention; pick one of {', '.join(map(str, CLOUDWATCH_RETENTION_DAYS))}")
    if not args.cluster_name:
        raise ValueError("cluster_name is needed for the kubernetes.io/cluster/<name> subnet tags")
    if bool(args.transit_gateway_id) != bool(args.transit_routes):
        raise ValueError("a transit gateway needs routes, and routes need a transit gateway")


class Network(pulumi.ComponentResource):
    """VPC, per-zone private and public subnets, NAT, VPC endpoints and encrypted flow logs."""

    vpc: aws.ec2.Vpc
    vpc_id: pulumi.Output[str]
    private_subnet_ids: Dict[str, pulumi.Output[str]]
    public_subnet_ids: Dict[str, pulumi.Output[str]]
    private_route_table_ids: Dict[str, pulumi.Output[str]]
    nat_gateway_ids: Dict[str, pulumi.Output[str]]
    endpoint_security_group: aws.ec2.SecurityGroup
    flow_log_group: aws.cloudwatch.LogGroup
    flow_log_key: aws.kms.Key

    def __init__(self, name: str, args: NetworkArgs, opts: Optional[pulumi.ResourceOptions] = None):
        _validate(args)
        plan = plan_subnets(args.cidr, args.zones)  # raises before anything is registered
        super().__init__("gpu-cloud:network:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        region, account, partition = args.region, args.account_id, args.partition

        self.vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=args.cidr, enable_dns_support=True,
                               enable_dns_hostnames=True, tags=_tags(f"{name}-vpc"), opts=child)
        self.vpc_id = self.vpc.id
        # Adopt the VPC's default security group and leave it without rules: anything launched without a
        # group of its own gets no traffic at all, instead of "all traffic from the group".
        aws.ec2.DefaultSecurityGroup(f"{name}-default-sg", vpc_id=self.vpc.id, ingress=[], egress=[],
                                     tags=_tags(f"{name}-default-sg"), opts=child)

        # --- public side: internet gateway, one route table, one small subnet per zone ----------
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=self.vpc.id, tags=_tags(f"{name}-igw"), opts=child)
        public_rt = aws.ec2.RouteTable(f"{name}-public", vpc_id=self.vpc.id, tags=_tags(f"{name}-public"),
                                       opts=child)
        aws.ec2.Route(f"{name}-public-default", route_table_id=public_rt.id, destination_cidr_block="0.0.0.0/0",
                      gateway_id=igw.id, opts=child)
        public_subnets: Dict[str, aws.ec2.Subnet] = {}
        for zone, cidr in plan.public.items():
            subnet = aws.ec2.Subnet(
                f"{name}-public-{zone}", vpc_id=self.vpc.id, cidr_block=cidr, availability_zone_id=zone,
                # Nothing launched here needs a public address: NAT gateways use an EIP, load
                # balancers get their own.
                map_public_ip_on_launch=False,
                tags=_tags(f"{name}-public-{zone}", cluster_name=args.cluster_name, role=ROLE_PUBLIC), opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-public-rta-{zone}", subnet_id=subnet.id,
                                          route_table_id=public_rt.id, opts=child)
            public_subnets[zone] = subnet

        # --- NAT: one per zone (a zone outage leaves the others' egress alone) or one in the first zone
        nat_zones = list(args.zones) if args.nat_gateways == "one-per-az" else [args.zones[0]]
        nat_gateways: Dict[str, aws.ec2.NatGateway] = {}
        for zone in nat_zones:
            eip = aws.ec2.Eip(f"{name}-nat-eip-{zone}", domain="vpc", tags=_tags(f"{name}-nat-eip-{zone}"),
                              opts=child)
            nat_gateways[zone] = aws.ec2.NatGateway(
                f"{name}-nat-{zone}", allocation_id=eip.allocation_id, subnet_id=public_subnets[zone].id,
                connectivity_type="public", tags=_tags(f"{name}-nat-{zone}"),
                # A NAT gateway only works once the VPC has its internet gateway.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]))

        # --- private side: a route table per zone, default route to the zone's (or the single) NAT
        private_subnets: Dict[str, aws.ec2.Subnet] = {}
        private_rts: Dict[str, aws.ec2.RouteTable] = {}
        for zone, cidr in plan.private.items():
            subnet = aws.ec2.Subnet(
                f"{name}-private-{zone}", vpc_id=self.vpc.id, cidr_block=cidr, availability_zone_id=zone,
                map_public_ip_on_launch=False,
                tags=_tags(f"{name}-private-{zone}", cluster_name=args.cluster_name, role=ROLE_PRIVATE), opts=child)
            rt = aws.ec2.RouteTable(f"{name}-private-rt-{zone}", vpc_id=self.vpc.id,
                                    tags=_tags(f"{name}-private-rt-{zone}"), opts=child)
            nat = nat_gateways.get(zone, nat_gateways[nat_zones[0]])
            aws.ec2.Route(f"{name}-private-default-{zone}", route_table_id=rt.id, destination_cidr_block="0.0.0.0/0",
                          nat_gateway_id=nat.id, opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-private-rta-{zone}", subnet_id=subnet.id, route_table_id=rt.id,
                                          opts=child)
            private_subnets[zone], private_rts[zone] = subnet, rt

        # --- transit gateway: the private subnets reach connected networks (and they reach the endpoint)
        self.transit_routes: List[aws.ec2.Route] = []
        if args.transit_gateway_id:
            attachment = aws.ec2transitgateway.VpcAttachment(
                f"{name}-tgw", transit_gateway_id=args.transit_gateway_id, vpc_id=self.vpc.id,
                subnet_ids=[subnet.id for subnet in private_subnets.values()], dns_support="enable",
                tags=_tags(f"{name}-tgw"), opts=child)
            self.transit_routes = [aws.ec2.Route(
                f"{name}-private-tgw-{zone}-{re.sub(r'[^0-9]+', '-', cidr)}", route_table_id=rt.id,
                destination_cidr_block=cidr, transit_gateway_id=args.transit_gateway_id,
                # The route only carries traffic once the attachment is available.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[attachment]))
                for zone, rt in private_rts.items() for cidr in args.transit_routes]

        # --- VPC endpoints ---------------------------------------------------------------------
        service_prefix = f"{args.reverse_dns_prefix}.{region}"
        aws.ec2.VpcEndpoint(f"{name}-vpce-s3", vpc_id=self.vpc.id, service_name=f"{service_prefix}.s3",
                            vpc_endpoint_type="Gateway", route_table_ids=[rt.id for rt in private_rts.values()],
                            policy=json.dumps(gateway_endpoint_policy(partition, region, account,
                                                                      args.readable_bucket_arns)),
                            tags=_tags(f"{name}-vpce-s3"), opts=child)
        self.endpoint_security_group = aws.ec2.SecurityGroup(
            f"{name}-endpoints", vpc_id=self.vpc.id, description="Interface VPC endpoints: HTTPS from the VPC",
            tags=_tags(f"{name}-endpoints"), opts=child)
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-endpoints-https", security_group_id=self.endpoint_security_group.id, ip_protocol="tcp",
            from_port=443, to_port=443, cidr_ipv4=args.cidr, description="HTTPS from the VPC",
            tags=_tags(f"{name}-endpoints-https"), opts=child)
        for short, service in INTERFACE_ENDPOINTS.items():
            aws.ec2.VpcEndpoint(
                f"{name}-vpce-{short}", vpc_id=self.vpc.id, service_name=f"{service_prefix}.{service}",
                vpc_endpoint_type="Interface", private_dns_enabled=True,
                subnet_ids=[subnet.id for subnet in private_subnets.values()],
                security_group_ids=[self.endpoint_security_group.id], tags=_tags(f"{name}-vpce-{short}"), opts=child)

        # --- flow logs: all traffic, to a log group encrypted with its own key --------------------
        log_group_arns = log_group_arn(partition, region, account, "*")
        # The group has a fixed name, so the key can name it: CloudWatch Logs may use the key for this group only.
        flow_log_group = flow_log_group_name(args.cluster_name)
        key_policy = log_group_key_policy(partition, args.dns_suffix, region, account, flow_log_group)
        self.flow_log_key = aws.kms.Key(
            f"{name}-flow-logs-key", description=f"{name}: VPC flow log encryption", enable_key_rotation=True,
            deletion_window_in_days=30, policy=key_policy, tags=_tags(f"{name}-flow-logs-key"),
            # Protected: deleting (or replacing) the key makes every flow log already written with it
            # unreadable, and KMS deletion cannot be undone once the window passes.
            opts=pulumi.ResourceOptions(parent=self, protect=True))
        self.flow_log_group = aws.cloudwatch.LogGroup(
            f"{name}-flow-logs", name=flow_log_group, retention_in_days=args.flow_log_retention_days,
            kms_key_id=self.flow_log_key.arn,
            tags=_tags(f"{name}-flow-logs"), opts=child)

        flow_log_arns = f"arn:{partition}:ec2:{region}:{account}:vpc-flow-log/*"
        flow_role = aws.iam.Role(
            f"{name}-flow-logs-role", description=f"{name}: VPC flow logs delivery to CloudWatch Logs",
            assume_role_policy=json.dumps({
                "Version": "2012-10-17",
                "Statement": [{
                    "Effect": "Allow", "Principal": {"Service": "vpc-flow-logs.amazonaws.com"},
                    "Action": "sts:AssumeRole",
                    # Only flow logs of this account may use the role (confused-deputy guard).
                    "Condition": {
                        "StringEquals": {"aws:SourceAccount": account},
                        "ArnLike": {"aws:SourceArn": flow_log_arns},
                    },
                }],
            }),
            tags=_tags(f"{name}-flow-logs-role"), opts=child)
        flow_policy = aws.iam.RolePolicy(
            f"{name}-flow-logs-policy", role=flow_role.id,
            policy=pulumi.Output.json_dumps({
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow",
                     "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                     "Resource": [self.flow_log_group.arn, pulumi.Output.concat(self.flow_log_group.arn, ":*")]},
                    {"Effect": "Allow", "Action": "logs:DescribeLogGroups", "Resource": log_group_arns},
                ],
            }),
            opts=child)
        aws.ec2.FlowLog(
            f"{name}-flow-log", vpc_id=self.vpc.id, traffic_type="ALL", log_destination_type="cloud-watch-logs",
            log_destination=self.flow_log_group.arn, iam_role_arn=flow_role.arn, tags=_tags(f"{name}-flow-log"),
            # Delivery starts at creation; the role must already be allowed to write.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[flow_policy]))

        self.private_subnet_ids = {zone: subnet.id for zone, subnet in private_subnets.items()}
        self.public_subnet_ids = {zone: subnet.id for zone, subnet in public_subnets.items()}
        self.private_route_table_ids = {zone: rt.id for zone, rt in private_rts.items()}
        self.nat_gateway_ids = {zone: nat.id for zone, nat in nat_gateways.items()}
        self.register_outputs({
            "vpc_id": self.vpc_id,
            "private_subnet_ids": self.private_subnet_ids,
            "public_subnet_ids": self.public_subnet_ids,
            "endpoint_security_group_id": self.endpoint_security_group.id,
            "flow_log_group_name": self.flow_log_group.name,
        })
