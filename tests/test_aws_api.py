"""jobs/aws_api.py: the repair controller's own AWS client (standard library only).

- Its Signature Version 4 is held to botocore's signer, request by request.
- Its retries are held to botocore's standard mode (botocore.retries.standard): which answers are retried and as
  what, for every operation it calls, every status and every code botocore's checkers or the operations' models
  name; the backoff; the retry quota; and the calls on the wire against a server that fails them.
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

import contextlib
import datetime
import http.client
import json
import socket
import urllib.error

import boto3
import botocore.session
import pytest
from botocore import exceptions as botocore_errors
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.parsers import ResponseParserError
from botocore.retries import quota as botocore_quota
from botocore.retries import standard
from botocore.credentials import Credentials as BotoCredentials
from moto import settings
from moto.autoscaling.models import autoscaling_backends
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.authorization import ActionAuthenticatorMixin
from moto.core.responses import EmptyResult
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


COMPLETED: list = []


def _complete_lifecycle_action(self):  # recording stand-in; moto 5.2.5 lacks this action (as in tests/test_bootstrap.py)
    COMPLETED.append({k: self._get_param(k) for k in ("AutoScalingGroupName", "LifecycleHookName", "InstanceId",
                                                      "LifecycleActionResult")})
    return EmptyResult()


@pytest.fixture(scope="module")
def aws_world():
    """Two of this cluster's pools and another cluster's group, one instance each, the gate's reports, and an IAM user
    holding exactly the controller's policy; then moto's authentication on."""
    mp = pytest.MonkeyPatch()
    mp.setattr(AutoScalingResponse, "_determine_resource", _group_arn, raising=False)
    mp.setattr(EC2Response, "_determine_resource", _instance_arn, raising=False)
    mp.setattr(AutoScalingResponse, "complete_lifecycle_action", _complete_lifecycle_action, raising=False)
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


def test_it_may_report_an_instance_of_its_cluster_unhealthy_and_not_of_another(aws_world):
    """The replacement of a pool whose reservation has a spare slot: the group replaces an Unhealthy instance under
    its instance maintenance policy (launch first)."""
    aws, instances = aws_world["aws"], aws_world["instances"]
    with pytest.raises(aws_api.AwsError) as raised:
        aws.mark_unhealthy(instances[THEIRS])
    assert raised.value.status == 403 and raised.value.code == "AccessDenied"
    aws.mark_unhealthy(instances[OURS[0]])
    assert aws.describe_groups([OURS[0]])[OURS[0]]["instances"][instances[OURS[0]]]["health"] == "Unhealthy"


def test_it_may_reboot_its_pools_instances_only(aws_world):
    aws, instances = aws_world["aws"], aws_world["instances"]
    aws.reboot_instance(instances[OURS[0]])
    with pytest.raises(aws_api.AwsError) as raised:
        aws.reboot_instance(instances[THEIRS])
    assert raised.value.code == "AccessDenied"


def test_it_may_complete_its_own_pools_termination_hooks_only(aws_world):
    """The fast path for dead hardware: CONTINUE the termination hook of its pools' instances, of no other group."""
    aws, instances = aws_world["aws"], aws_world["instances"]
    aws.continue_termination(OURS[0], repair.DRAIN_HOOK, instances[OURS[0]])
    assert COMPLETED[-1] == {"AutoScalingGroupName": OURS[0], "LifecycleHookName": "gpu-cloud-drain",
                             "InstanceId": instances[OURS[0]], "LifecycleActionResult": "CONTINUE"}
    with pytest.raises(aws_api.AwsError) as raised:
        aws.continue_termination(THEIRS, repair.DRAIN_HOOK, instances[THEIRS])
    assert raised.value.code == "AccessDenied" and len(COMPLETED) == 1


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


# ----------------------------------------------------------------------------- retries, held to botocore's standard mode

SERVICES = {"DescribeAutoScalingGroups": "autoscaling", "TerminateInstanceInAutoScalingGroup": "autoscaling",
            "SuspendProcesses": "autoscaling", "CompleteLifecycleAction": "autoscaling", "RebootInstances": "ec2", "ListObjectsV2": "s3", "GetObject": "s3",
            "ReceiveMessage": "sqs", "DeleteMessage": "sqs"}
_SESSION = botocore.session.get_session()


def _operation(name):
    return _SESSION.get_service_model(SERVICES[name]).operation_model(name)


def _modeled_codes(name):
    return {s.metadata.get("error", {}).get("code") or s.name for s in _operation(name).error_shapes}


# Every code botocore's checkers name, every code our operations model, and codes AWS answers that no rule names.
CODES = sorted(set(standard.ThrottledRetryableChecker._THROTTLED_ERROR_CODES)
               | set(standard.TransientRetryableChecker._TRANSIENT_ERROR_CODES)
               | {c for name in SERVICES for c in _modeled_codes(name)}
               | {"", "ValidationError", "AccessDenied", "InvalidInstanceID.NotFound", "UnauthorizedOperation",
                  "IncorrectInstanceState", "InternalFailure", "ServiceUnavailable", "SignatureDoesNotMatch"})
STATUSES = (400, 403, 404, 408, 409, 429, 500, 501, 502, 503, 504, 509)


def _context(name, status, code, attempt=1, headers=None):
    return standard.RetryContext(attempt_number=attempt, operation_model=_operation(name),
                                 parsed_response={"Error": {"Code": code or str(status)}},
                                 http_response=AWSResponse("https://aws", status, headers or {}, None))


def _theirs(context):
    """botocore's verdict: None, or the kind of retry (whose backoff base differs)."""
    if not standard.StandardRetryConditions(max_attempts=aws_api.MAX_ATTEMPTS).is_retryable(context):
        return None
    detector = standard.ThrottlingErrorDetector(standard.RetryEventAdapter())
    return aws_api.THROTTLING if detector.is_throttling_error_from_context(context) else aws_api.TRANSIENT


def test_the_modeled_errors_are_the_service_models():
    for name in SERVICES:
        assert aws_api.MODELED_ERRORS[name] == _modeled_codes(name), name
        assert not any(s.metadata.get("retryable") for s in _operation(name).error_shapes), name


def test_which_answers_are_retried_and_how_is_what_botocore_decides():
    """Every operation the controller calls x every status x every code: retried or not, throttling or not."""
    differ = []
    for name in SERVICES:
        for status in STATUSES:
            for code in CODES:
                ours, _ = aws_api.aws_retry_kind(aws_api.AwsError(status, code, "m", operation=name))
                theirs = _theirs(_context(name, status, code))
                if ours != theirs:
                    differ.append((name, status, code, ours, theirs))
    assert differ == []


@pytest.mark.parametrize("ours,theirs", [
    (urllib.error.URLError(ConnectionRefusedError(111, "refused")), botocore_errors.EndpointConnectionError(
        endpoint_url="https://ec2")),
    (socket.timeout("timed out"), botocore_errors.ReadTimeoutError(endpoint_url="https://ec2")),
    (TimeoutError("connect timed out"), botocore_errors.ConnectTimeoutError(endpoint_url="https://ec2")),
    (http.client.RemoteDisconnected("closed"), botocore_errors.ConnectionClosedError(endpoint_url="https://ec2")),
    (ConnectionResetError(104, "reset"), botocore_errors.ConnectionClosedError(endpoint_url="https://ec2")),
    (http.client.IncompleteRead(b""), botocore_errors.HTTPClientError(error="incomplete read")),
    (ValueError("not XML"), ResponseParserError("not XML")),
])
def test_a_lost_connection_is_retried_as_botocore_retries_it(ours, theirs):
    context = standard.RetryContext(attempt_number=1, operation_model=_operation("RebootInstances"),
                                    caught_exception=theirs)
    assert aws_api.aws_retry_kind(ours)[0] == _theirs(context)


@pytest.mark.parametrize("status,code,retry_after", [
    (400, "Throttling", None), (503, "RequestLimitExceeded", None), (500, "InternalFailure", None),
    (503, "", None), (429, "", "2500"), (400, "Throttling", "40000"), (503, "", "-5"), (503, "", "soon")])
def test_the_backoff_is_botocores(status, code, retry_after):
    headers = {} if retry_after is None else {"x-amz-retry-after": retry_after}
    for attempt in (1, 2, 3, 6):
        for draw in (0.0, 0.37, 0.999):
            context = _context("TerminateInstanceInAutoScalingGroup", status, code, attempt, headers)
            theirs = standard.ExponentialBackoff(random=lambda: draw, service_name="auto-scaling",
                                                 throttling_detector=standard.ThrottlingErrorDetector(
                                                     standard.RetryEventAdapter())).delay_amount(context)
            error = aws_api.AwsError(status, code, "m", retry_after, "TerminateInstanceInAutoScalingGroup")
            kind, after = aws_api.aws_retry_kind(error)
            assert aws_api.Retry(rand=lambda: draw).delay(kind, attempt, after) == pytest.approx(theirs)


def test_three_attempts_at_most_and_the_quota_is_botocores():
    """The same run of calls through ours and through botocore's RetryQuotaChecker: an outage of 503s long enough to
    spend the quota, then successes that give it back. Attempts and the quota agree call by call."""
    theirs_quota = botocore_quota.RetryQuota()
    detector = standard.ThrottlingErrorDetector(standard.RetryEventAdapter())
    checker = standard.RetryQuotaChecker(theirs_quota, detector)
    conditions = standard.StandardRetryConditions(max_attempts=aws_api.MAX_ATTEMPTS)
    retry = aws_api.Retry(sleep=lambda s: None)
    plan = [("503", 3)] * 25 + [("ok", 0)] * 40 + [("throttle", 1)] * 10 + [("403", 1)] * 3
    cut_short = 0

    for outcome, failures in plan:
        code, status = {"503": ("", 503), "throttle": ("Throttling", 400), "403": ("AccessDenied", 403),
                        "ok": ("", 200)}[outcome]
        # botocore: attempt, fail, ask for a retry while it may, until an attempt succeeds or it gives up
        request_context, attempt, theirs_attempts = {}, 1, 0
        while True:
            theirs_attempts += 1
            if attempt > failures:
                checker.release_retry_quota(request_context, AWSResponse("https://aws", 200, {}, None))
                break
            context = _context("DescribeAutoScalingGroups", status, code, attempt)
            context.request_context = request_context
            if not (conditions.is_retryable(context) and checker.acquire_retry_quota(context)):
                break
            attempt += 1
        # ours
        attempts = []

        def once():
            attempts.append(1)
            if len(attempts) <= failures:
                raise aws_api.AwsError(status, code, "m", operation="DescribeAutoScalingGroups")
            return "ok"

        try:
            retry.call(once)
        except aws_api.AwsError:
            pass
        assert len(attempts) == theirs_attempts <= aws_api.MAX_ATTEMPTS, outcome
        cut_short += outcome == "503" and len(attempts) < aws_api.MAX_ATTEMPTS
        assert retry.quota == theirs_quota.available_capacity, (outcome, retry.quota, theirs_quota.available_capacity)
    assert cut_short and 0 < retry.quota < botocore_quota.RetryQuota.INITIAL_CAPACITY   # spent, then won some back


class FlakyAws:
    """A Query endpoint that answers the first `failures` requests with `status`/`body`, then succeeds."""

    def __init__(self, failures, status, body, headers=None):
        self.left, self.requests = failures, []
        owner = self

        class Handler(QuietHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests.append(self.headers["Authorization"])
                if owner.left > 0:
                    owner.left -= 1
                    self.send_response(status)
                    for key, value in (headers or {}).items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    return self.wfile.write(body)
                self.answer(200, b'<RebootInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
                                 b'<return>true</return></RebootInstancesResponse>', "text/xml")

        self.server = LoopbackServer(Handler)


THROTTLED = (b'<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message>'
             b'</Error></Errors><RequestID>r</RequestID></Response>')


@pytest.mark.parametrize("failures,status,body,headers,attempts,raised", [
    (2, 503, THROTTLED, {}, 3, None),                             # throttled twice: the third attempt succeeds
    (3, 503, THROTTLED, {}, 3, "RequestLimitExceeded"),          # three times: the call fails, after 3 attempts
    (1, 502, b"<html>bad gateway</html>", {}, 2, None),          # a proxy's page, no XML: its status decides
    (1, 403, b'<Response><Errors><Error><Code>UnauthorizedOperation</Code></Error></Errors></Response>', {}, 1,
     "UnauthorizedOperation"),                                   # not retried
    (1, 429, b"", {"x-amz-retry-after": "3000"}, 2, None),       # a 429 the model does not name; waits 3 s
])
def test_a_call_on_the_wire_is_retried_as_botocore_would(failures, status, body, headers, attempts, raised):
    flaky = FlakyAws(failures, status, body, headers)
    slept = []
    try:
        aws = aws_api.Aws(REGION, "amazonaws.com", Static(KEYS), endpoint=flaky.server.url,
                          retry=aws_api.Retry(sleep=slept.append, rand=lambda: 0.5))
        if raised:
            with pytest.raises(aws_api.AwsError) as error:
                aws.reboot_instance("i-0abc")
            assert error.value.code == raised
        else:
            aws.reboot_instance("i-0abc")
        assert len(flaky.requests) == attempts and len(slept) == attempts - 1
        if headers.get("x-amz-retry-after"):
            assert slept == [3.0]                                 # max(t_i, min(3 s, t_i + 5 s)), t_i = 0.5 x 1 s
        if status == 503 and not raised:
            assert slept == [0.5 * 1, 0.5 * 2]                    # throttling: base 1 s, doubled, times the draw
    finally:
        flaky.server.close()


# ----------------------------------------------------------------------------- SQS: the capacity blocks' expiry warnings

@pytest.fixture
def sqs_world():
    """The warnings' queue and another, a warning in each, and an IAM user holding exactly the capacity-block
    statements decisions/nodes/capacity_blocks.py adds to the controller's policy; then moto's authentication on."""
    from decisions.nodes import capacity_blocks
    server = contextlib.ExitStack()
    endpoint = server.enter_context(moto_server())
    before = settings.INITIAL_NO_AUTH_ACTION_COUNT
    settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")      # set up as an administrator
    admin = dict(endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                 aws_secret_access_key="testing")
    sqs, iam = boto3.client("sqs", **admin), boto3.client("iam", **admin)
    ours = capacity_blocks.queue_name("gpu-cloud-prod")
    urls = {name: sqs.create_queue(QueueName=name)["QueueUrl"] for name in (ours, "another-stack-queue")}
    for url in urls.values():
        sqs.send_message(QueueUrl=url, MessageBody='{"detail-type": "Capacity Block Reservation Expiration Warning"}')
    statements = capacity_blocks.iam_statements(capacity_blocks.queue_arn("aws", REGION, ACCOUNT, ours))
    iam.create_user(UserName="gpu-node-repair-sqs")
    iam.put_user_policy(UserName="gpu-node-repair-sqs", PolicyName="controller",
                        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": statements}))
    key = iam.create_access_key(UserName="gpu-node-repair-sqs")["AccessKey"]
    credentials = Static(aws_api.Credentials(key["AccessKeyId"], key["SecretAccessKey"], None, float("inf")))
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    ActionAuthenticatorMixin.request_count = 0
    try:
        # The URL the controller is given (capacity_blocks.queue_url): moto knows the queue by its last segment.
        yield {"aws": aws_api.Aws(REGION, "amazonaws.com", credentials, endpoint=endpoint),
               "ours": capacity_blocks.queue_url(REGION, "amazonaws.com", ACCOUNT, ours),
               "theirs": urls["another-stack-queue"], "admin": sqs, "ours_url": urls[ours]}
    finally:
        settings.INITIAL_NO_AUTH_ACTION_COUNT = before
        server.close()


def test_it_reads_and_deletes_the_warnings_of_its_own_queue_and_of_no_other(sqs_world):
    aws = sqs_world["aws"]
    [message] = aws.receive_messages(sqs_world["ours"], 10, 1, 0)
    assert json.loads(message["body"])["detail-type"] == "Capacity Block Reservation Expiration Warning"
    assert len(aws.receive_messages(sqs_world["ours"], 10, 1, 0)) == 1      # visible again at once: kept
    aws.delete_message(sqs_world["ours"], message["receipt"])
    assert aws.receive_messages(sqs_world["ours"], 10, 1, 0) == []
    with pytest.raises(aws_api.AwsError) as raised:
        aws.receive_messages(sqs_world["theirs"], 10, 1, 0)
    assert raised.value.status == 403


@pytest.mark.parametrize("body, headers, code", [
    (b'{"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "The specified queue does not exist."}',
     {"x-amzn-query-error": "AWS.SimpleQueueService.NonExistentQueue;Sender"}, "AWS.SimpleQueueService.NonExistentQueue"),
    (b'{"__type": "com.amazonaws.sqs#RequestThrottled", "message": "slow down"}', {}, "RequestThrottled"),
    (b'{"__type": "com.amazonaws.sqs#OverLimit:http://internal.amazon.com/", "message": "x"}', {}, "OverLimit"),
])
def test_a_json_error_is_read_as_botocore_reads_it(body, headers, code):
    """botocore 1.44.18 parsers.py BaseJSONParser._do_error_parse with its query-compatible code (SQS's model)."""
    from botocore.parsers import create_parser
    parsed = create_parser("json").parse(
        {"status_code": 400, "headers": headers, "body": body},
        _SESSION.get_service_model("sqs").operation_model("ReceiveMessage").output_shape)
    assert parsed["Error"]["Code"] == code
    ours = aws_api._error(400, body, None, "ReceiveMessage", headers.get("x-amzn-query-error"))
    assert (ours.code, ours.message) == (code, parsed["Error"]["Message"])
