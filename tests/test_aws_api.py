"""jobs/aws_api.py: the repair controller's own AWS client (standard library only).

- Its Signature Version 4 is held to botocore's signer, request by request.
- Its credentials come from a stand-in EKS Pod Identity agent, read the way botocore's container provider reads
  them (botocore 1.44.8 credentials.py ContainerProvider): the token file as the Authorization header, re-read.
- Every call runs against moto in server mode on 127.0.0.1 with moto's authentication on: moto recomputes each
  signature with botocore (moto/iam/access_control.py check_signature) and applies the IAM policy
  decisions/nodes/repair.py gives the controller, to an IAM user holding exactly that policy. moto authorizes Auto
  Scaling and EC2 actions against "*" and evaluates no condition of an identity policy; AWS authorizes
  TerminateInstanceInAutoScalingGroup and SuspendProcesses on the group (resource type autoScalingGroup) and
  RebootInstances on the instance, with ec2:ResourceTag/<key> from the instance's tags (Service Authorization Reference,
  Amazon EC2 Auto Scaling and Amazon EC2). The fixture gives moto exactly that: the group's or instance's ARN as the
  resource, and the instance's tags as the condition keys its policy names (a tag the instance lacks is an empty value,
  which no StringEquals matches, as in IAM).
"""
from __future__ import annotations

import datetime
import contextlib
import json

import boto3
import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials
from moto import settings
from moto.autoscaling.models import autoscaling_backends
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.authorization import ActionAuthenticatorMixin
from moto.ec2.models import ec2_backends
from moto.ec2.responses import EC2Response
from moto.iam import access_control

from decisions.nodes import repair
from jobs import aws_api
from tests.loopback import LoopbackServer, QuietHandler, moto_server

REGION, ACCOUNT = "us-east-1", "123456789012"
OURS, THEIRS = ("gpu-cloud-prod-train", "gpu-cloud-prod-infer"), "another-cluster-train"
BUCKET = "gpu-cloud-prod-123456789012-artifacts"
NOW = datetime.datetime(2026, 12, 4, 13, 0, 0, tzinfo=datetime.timezone.utc)
KEYS = aws_api.Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "session-token/+=", float("inf"))


class Static:
    def __init__(self, credentials):
        self.credentials = credentials

    def get(self):
        return self.credentials


# ----------------------------------------------------------------------------- SigV4 against botocore


def _botocore_signature(method, url, headers, body, service, signer=SigV4Auth):
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
    request.context["timestamp"] = NOW.strftime("%Y%m%dT%H%M%SZ")
    request.headers["X-Amz-Date"] = request.context["timestamp"]
    auth = signer(BotoCredentials(KEYS.access_key, KEYS.secret_key, KEYS.token), service, REGION)
    if signer is S3SigV4Auth:
        request.headers["X-Amz-Content-SHA256"] = auth.payload(request)
    canonical = auth.canonical_request(request)
    return auth.signature(auth.string_to_sign(request, canonical), request)


@pytest.mark.parametrize("service,method,url,body,signer", [
    ("autoscaling", "POST", "https://autoscaling.us-east-1.amazonaws.com/",
     aws_api.canonical_query({"Action": "TerminateInstanceInAutoScalingGroup", "Version": "2011-01-01",
                              "InstanceId": "i-0abc", "ShouldDecrementDesiredCapacity": "false"}).encode(), SigV4Auth),
    ("ec2", "POST", "https://ec2.us-east-1.amazonaws.com/",
     aws_api.canonical_query({"Action": "RebootInstances", "Version": "2016-11-15", "InstanceId.1": "i-0abc"}).encode(),
     SigV4Auth),
    ("s3", "GET", f"https://{BUCKET}.s3.us-east-1.amazonaws.com/?" + aws_api.canonical_query(
        {"list-type": "2", "prefix": "gate-reports/train/", "start-after": "gate-reports/train/20261204T120000Z"}),
     b"", S3SigV4Auth),
    ("s3", "GET", f"https://{BUCKET}.s3.us-east-1.amazonaws.com/gate-reports/train/20261204T1200%3A00Z-i-0abc.json",
     b"", S3SigV4Auth),
])
def test_signatures_are_the_ones_botocore_computes(service, method, url, body, signer):
    headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"} if body else {}
    signed = aws_api.sign(method, url, headers, body, KEYS, REGION, service, NOW)
    ours = signed["Authorization"].rsplit("Signature=", 1)[1]
    theirs = _botocore_signature(method, url, {**headers, "X-Amz-Security-Token": KEYS.token}, body, service, signer)
    assert ours == theirs
    assert signed["X-Amz-Security-Token"] == KEYS.token and signed["X-Amz-Date"] == "20261204T130000Z"
    assert f"Credential=AKIDEXAMPLE/20261204/{REGION}/{service}/aws4_request" in signed["Authorization"]


def test_a_changed_body_changes_the_signature():
    body = aws_api.canonical_query({"Action": "RebootInstances", "Version": "2016-11-15", "InstanceId.1": "i-0abc"})
    first = aws_api.sign("POST", "https://ec2.us-east-1.amazonaws.com/", {}, body.encode(), KEYS, REGION, "ec2", NOW)
    other = aws_api.sign("POST", "https://ec2.us-east-1.amazonaws.com/", {}, body.replace("0abc", "0abd").encode(),
                         KEYS, REGION, "ec2", NOW)
    assert first["Authorization"] != other["Authorization"]


# ----------------------------------------------------------------------------- Pod Identity credentials


class FakePodIdentityAgent:
    """The agent's endpoint (169.254.170.23/v1/credentials on a node) on loopback: it answers only the token it was
    given, with credentials that expire when told."""

    def __init__(self, token, expires_in_s=3600):
        self.token, self.expires_in_s, self.calls = token, expires_in_s, []
        owner = self

        class Handler(QuietHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                owner.calls.append(self.headers.get("Authorization"))
                if self.path != "/v1/credentials" or self.headers.get("Authorization") != owner.token:
                    return self.answer(401)
                expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=owner.expires_in_s)
                self.answer(200, {"AccessKeyId": f"ASIA{len(owner.calls)}", "SecretAccessKey": "secret",
                                  "Token": "tok", "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ")})

        self.server = LoopbackServer(Handler)
        self.url = f"{self.server.url}/v1/credentials"

    def close(self):
        self.server.close()


def test_pod_identity_credentials_are_read_as_botocore_reads_them_and_refreshed_before_expiry(tmp_path):
    token_file = tmp_path / "eks-pod-identity-token"
    token_file.write_text("first-token")
    agent = FakePodIdentityAgent("first-token", expires_in_s=3600)
    try:
        env = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": agent.url, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token_file)}
        clock = [datetime.datetime.now(datetime.timezone.utc).timestamp()]
        provider = aws_api.PodIdentityCredentials(env, clock=lambda: clock[0])
        first = provider.get()
        assert (first.access_key, first.secret_key, first.token) == ("ASIA1", "secret", "tok")
        assert provider.get() is first and agent.calls == ["first-token"]     # cached while fresh
        # the kubelet rotated the token; 44 minutes on, the credentials are 16 minutes from expiry: still used
        token_file.write_text("second-token")
        agent.token = "second-token"
        clock[0] += 44 * 60
        assert provider.get() is first
        clock[0] += 2 * 60               # 14 minutes left: fetched again, with the token as it is now
        assert provider.get().access_key == "ASIA2" and agent.calls[-1] == "second-token"
        token_file.write_text("bad\ntoken")
        with pytest.raises(ValueError, match="not a legal header value"):
            provider.fetch()
    finally:
        agent.close()


# ----------------------------------------------------------------------------- against moto, authentication on


def _group_arn(self):
    """What AWS authorizes a group action on: the group named by the request, or the instance's group."""
    backend = autoscaling_backends[ACCOUNT][REGION]
    name = self._get_param("AutoScalingGroupName")
    if not name and self._get_param("InstanceId"):
        name = next((g.name for g in backend.autoscaling_groups.values()
                     for s in g.instance_states if s.instance.id == self._get_param("InstanceId")), "")
    group = backend.autoscaling_groups.get(name)
    return group.arn if group else "*"


def _instance_arn(self):
    ids = [v for k, v in self.querystring.items() if k.startswith("InstanceId.")]
    return f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{ids[0][0]}" if self._get_action() == "RebootInstances" else "*"


def _with_resource_tags(original):
    """IAMRequest.check_action_permitted with the instance's tags as ec2:ResourceTag/<key> condition values."""
    def check(self, resource):
        if ":instance/" not in resource:
            return original(self, resource)
        tags = ec2_backends[ACCOUNT][REGION].describe_tags(filters={"resource-id": [resource.rsplit("/", 1)[1]]})
        values = {f"ec2:ResourceTag/{t['key']}": t["value"] for t in tags}
        permitted = False
        for policy in self._access_key.collect_policies():
            evaluated = access_control.IAMPolicy(policy)
            statements = evaluated._policy_json["Statement"]
            statements = statements if isinstance(statements, list) else [statements]
            wanted = {k for s in statements for c in (s.get("Condition") or {}).values() for k in c}
            result = evaluated.is_action_permitted(self._action, resource, None, {k: values.get(k, "") for k in wanted})
            if result == access_control.PermissionResult.DENIED:
                self._raise_access_denied()
            permitted = permitted or result == access_control.PermissionResult.PERMITTED
        if not permitted:
            self._raise_access_denied()
    return check


@pytest.fixture(scope="module")
def aws_world():
    """Two of this cluster's pools and another cluster's group, one instance each, the gate's reports, and an IAM user
    holding exactly the controller's policy; then moto's authentication on."""
    mp = pytest.MonkeyPatch()
    mp.setattr(AutoScalingResponse, "_determine_resource", _group_arn, raising=False)
    mp.setattr(EC2Response, "_determine_resource", _instance_arn, raising=False)
    mp.setattr(access_control.IAMRequest, "check_action_permitted",
               _with_resource_tags(access_control.IAMRequest.check_action_permitted))
    server = contextlib.ExitStack()
    endpoint = server.enter_context(moto_server())
    admin = dict(endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                 aws_secret_access_key="testing")
    ec2, autoscaling, s3, iam = (boto3.client(s, **admin) for s in ("ec2", "autoscaling", "s3", "iam"))
    ec2.create_launch_template(LaunchTemplateName="gpu-pool", LaunchTemplateData={"ImageId": "ami-12c6146b"})
    instances = {}
    for group in (*OURS, THEIRS):
        autoscaling.create_auto_scaling_group(AutoScalingGroupName=group, MinSize=1, MaxSize=3, DesiredCapacity=1,
                                              AvailabilityZones=[f"{REGION}a"],
                                              LaunchTemplate={"LaunchTemplateName": "gpu-pool", "Version": "$Latest"})
        found = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"][0]
        instances[group] = found["Instances"][0]["InstanceId"]
    s3.create_bucket(Bucket=BUCKET)
    for key in ("gate-reports/train/20261204T120000Z-i-1-launch.json", "gate-reports/train/20261204T121500Z-i-2-launch.json",
                "verifier/train/bundle.tar"):
        s3.put_object(Bucket=BUCKET, Key=key, Body=b'{"verdict": "fail"}')
    policy = {"Version": "2012-10-17", "Statement": repair.iam_statements(
        partition="aws", region=REGION, account_id=ACCOUNT, asg_names=OURS,
        reports_bucket_arn=f"arn:aws:s3:::{BUCKET}", reports_key_arn=f"arn:aws:kms:{REGION}:{ACCOUNT}:key/k")}
    iam.create_user(UserName="gpu-node-repair")
    iam.put_user_policy(UserName="gpu-node-repair", PolicyName="controller", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName="gpu-node-repair")["AccessKey"]
    credentials = Static(aws_api.Credentials(key["AccessKeyId"], key["SecretAccessKey"], None, float("inf")))
    before = settings.INITIAL_NO_AUTH_ACTION_COUNT
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0          # every request from here on is authenticated and authorized
    ActionAuthenticatorMixin.request_count = 0
    try:
        yield {"aws": aws_api.Aws(REGION, "amazonaws.com", credentials, endpoint=endpoint), "instances": instances,
               "admin": admin, "endpoint": endpoint}
    finally:
        settings.INITIAL_NO_AUTH_ACTION_COUNT = before
        server.close()
        mp.undo()


def test_moto_checks_the_signature(aws_world):
    forged = aws_api.Aws(REGION, "amazonaws.com", Static(aws_world["aws"].credentials.get()._replace(
        secret_key="not-the-secret")), endpoint=aws_world["endpoint"])
    with pytest.raises(aws_api.AwsError) as raised:
        forged.describe_groups(list(OURS))
    assert raised.value.status == 403 and "Signature" in raised.value.code


def test_it_describes_its_groups_with_their_instances(aws_world):
    groups = aws_world["aws"].describe_groups(list(OURS))
    assert set(groups) == set(OURS)
    for name in OURS:
        assert groups[name]["instances"] == {aws_world["instances"][name]: {"lifecycle": "InService",
                                                                            "health": "Healthy"}}
        assert groups[name]["suspended"] == [] and groups[name]["desired"] == 1


def test_it_may_replace_an_instance_of_its_cluster_and_not_of_another(aws_world):
    aws, instances = aws_world["aws"], aws_world["instances"]
    with pytest.raises(aws_api.AwsError) as raised:
        aws.replace_instance(instances[THEIRS])
    assert raised.value.status == 403 and raised.value.code == "AccessDenied"
    aws.replace_instance(instances[OURS[1]])
    after = aws.describe_groups([OURS[1]])[OURS[1]]
    assert instances[OURS[1]] not in after["instances"] and after["desired"] == 1   # the group keeps its size


def test_it_may_reboot_its_pools_instances_only(aws_world):
    aws, instances = aws_world["aws"], aws_world["instances"]
    aws.reboot_instance(instances[OURS[0]])
    with pytest.raises(aws_api.AwsError) as raised:
        aws.reboot_instance(instances[THEIRS])
    assert raised.value.code == "AccessDenied"


def test_it_may_brake_its_own_pools_only(aws_world):
    aws = aws_world["aws"]
    aws.suspend_launch(OURS[0])
    assert aws.describe_groups([OURS[0]])[OURS[0]]["suspended"] == ["Launch"]
    with pytest.raises(aws_api.AwsError) as raised:
        aws.suspend_launch(THEIRS)
    assert raised.value.code == "AccessDenied"


def test_it_reads_the_gate_reports_and_nothing_else_of_the_bucket(aws_world):
    aws = aws_world["aws"]
    keys = aws.list_keys(BUCKET, "gate-reports/train/", "gate-reports/train/20261204T120500Z")
    assert keys == ["gate-reports/train/20261204T121500Z-i-2-launch.json"]
    assert json.loads(aws.get_object(BUCKET, keys[0])) == {"verdict": "fail"}
    with pytest.raises(aws_api.AwsError) as raised:
        aws.get_object(BUCKET, "verifier/train/bundle.tar")
    assert raised.value.status == 403
