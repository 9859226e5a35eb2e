"""The AWS calls of the GPU node repair controller, with the standard library only (the image is a plain python
image: no SDK to install at run time, nothing fetched from anywhere).

- Credentials from EKS Pod Identity, as botocore's container provider reads them (botocore 1.44.8
  credentials.py ContainerProvider, lines 2082-2155): GET $AWS_CONTAINER_CREDENTIALS_FULL_URI with the token in
  $AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (read again on every fetch: the kubelet rotates it) as the Authorization
  header; the answer's AccessKeyId, SecretAccessKey, Token, Expiration. They are fetched again 15 minutes before
  they expire (botocore's advisory refresh, RefreshableCredentials._advisory_refresh_timeout).
- Requests signed with Signature Version 4 (AWS General Reference, "Create a signed AWS API request"): the Query
  protocol (Auto Scaling 2011-01-01, EC2 2016-11-15: a form-encoded POST, an XML answer) and S3's REST GETs.
  tests/test_aws_api.py holds the signatures to botocore's signer and runs every call against moto in server
  mode with its authentication on, which recomputes the signature and applies the controller's IAM policy.

- Every call is retried as botocore's standard retry mode retries it (botocore 1.44.18 retries/standard.py, the
  mode the AWS SDKs share): at most 3 attempts; throttling codes, a 429 the operation does not model, the transient
  codes, 500/502/503/504 and a lost connection are retried; the wait is full jitter, rand(0, 1) x min(base x 2^(n-1),
  20 s), base 1 s after throttling and 50 ms otherwise, raised to an x-amz-retry-after header (capped at 5 s more);
  and a retry quota (500 tokens, 5 per throttling retry, 14 per other retry, given back on success) stops retrying
  while a service keeps failing. `Retry` does it, for the Kubernetes API as well (jobs/node_repair.py Kube).
  tests/test_aws_api.py holds the classification, the delays and the quota to botocore's own classes.

AWS_ENDPOINT_URL (the variable botocore honours for every service) sends every call to one endpoint, path-style for
S3: tests only.
"""
from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
import json
import os
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
REFRESH_BEFORE_S = 15 * 60
AUTOSCALING_VERSION = "2011-01-01"
EC2_VERSION = "2016-11-15"
TIMEOUT_S = 20


class AwsError(Exception):
    def __init__(self, status: int, code: str, message: str, retry_after: Optional[str] = None,
                 operation: str = ""):
        super().__init__(f"{code}: {message} (HTTP {status})")
        self.status, self.code, self.message = status, code, message
        self.retry_after, self.operation = retry_after, operation    # x-amz-retry-after (ms); the Action or "s3"


# --------------------------------------------------------------------------------------------------------------------
# Retries: botocore's standard mode (botocore 1.44.18 retries/standard.py, line numbers below)
# --------------------------------------------------------------------------------------------------------------------

MAX_ATTEMPTS = 3                           # DEFAULT_MAX_ATTEMPTS, line 36
MAX_BACKOFF_S = 20.0                       # ExponentialBackoff._MAX_BACKOFF, line 346
THROTTLING_BASE_S = 1.0                    # _DEFAULT_BACKOFF_CONFIG throttling_base_scale, line 351
TRANSIENT_BASE_S = 0.05                    # non_throttling_base_scale, line 352
RETRY_AFTER_MAX_ADDITIONAL_S = 5.0         # _RETRY_AFTER_MAX_ADDITIONAL, line 348 (header x-amz-retry-after, ms)
# TransientRetryableChecker, lines 464-469.
TRANSIENT_CODES = frozenset({"RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete"})
TRANSIENT_STATUS = frozenset({500, 502, 503, 504})
# ThrottledRetryableChecker, lines 510-525: the union of the throttling codes AWS services answer.
THROTTLING_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException", "TooManyRequestsException",
    "ProvisionedThroughputExceededException", "TransactionInProgressException", "RequestLimitExceeded",
    "BandwidthLimitExceeded", "LimitExceededException", "RequestThrottled", "SlowDown", "PriorRequestNotComplete",
    "EC2ThrottledException"})
THROTTLING_STATUS = frozenset({429})       # ThrottlingStatusCodeChecker, line 549: only for an error not modeled
# The error codes each operation's service model declares (botocore/data/<service>/<version>/service-2.json): a 429
# with one of them is the model's to judge (lines 557-565), and none of them is modeled retryable.
MODELED_ERRORS = {
    "DescribeAutoScalingGroups": frozenset({"InvalidNextToken", "ResourceContention"}),
    "TerminateInstanceInAutoScalingGroup": frozenset({"ScalingActivityInProgress", "ResourceContention"}),
    "SuspendProcesses": frozenset({"ResourceInUse", "ResourceContention"}),
    "CompleteLifecycleAction": frozenset({"ResourceContention"}),
    "RebootInstances": frozenset(),
    "ListObjectsV2": frozenset({"NoSuchBucket"}),
    "GetObject": frozenset({"NoSuchKey", "InvalidObjectState"}),
    "ReceiveMessage": frozenset({"InvalidAddress", "InvalidSecurity", "KmsAccessDenied", "KmsDisabled",
                                 "KmsInvalidKeyUsage", "KmsInvalidState", "KmsNotFound", "KmsOptInRequired",
                                 "KmsThrottled", "OverLimit", "QueueDoesNotExist", "RequestThrottled",
                                 "UnsupportedOperation"}),
    "DeleteMessage": frozenset({"InvalidAddress", "InvalidIdFormat", "InvalidSecurity", "QueueDoesNotExist",
                                "ReceiptHandleIsInvalid", "RequestThrottled", "UnsupportedOperation"}),
}
# RetryQuotaChecker, lines 704-706, and retries/quota.py RetryQuota.INITIAL_CAPACITY.
QUOTA_CAPACITY, THROTTLING_RETRY_COST, RETRY_COST, NO_RETRY_INCREMENT = 500, 5, 14, 1
# botocore's ConnectionError and HTTPClientError (line 470-473) are what urllib raises as OSError (URLError, refused,
# reset, timed out) or http.client.HTTPException (RemoteDisconnected, IncompleteRead, BadStatusLine).
CONNECTION_ERRORS = (OSError, http.client.HTTPException)

THROTTLING, TRANSIENT = "throttling", "transient"


def aws_retry_kind(error: BaseException) -> Tuple[Optional[str], Optional[float]]:
    """(throttling | transient | None, the x-amz-retry-after delay in s) for a failed AWS call, as
    StandardRetryConditions (lines 659-692) and ThrottlingErrorDetector (lines 637-656) judge it."""
    if isinstance(error, AwsError):
        modeled = error.code in MODELED_ERRORS.get(error.operation, ())
        throttling = error.code in THROTTLING_CODES or (error.status in THROTTLING_STATUS and not modeled)
        transient = error.code in TRANSIENT_CODES or error.status in TRANSIENT_STATUS
        retry_after = None
        try:
            retry_after = int(error.retry_after) / 1000.0 if error.retry_after is not None else None
        except (ValueError, OverflowError):
            retry_after = None          # lines 436-443: a bad header is ignored
        if retry_after is not None and retry_after < 0:
            retry_after = None
        return (THROTTLING if throttling else TRANSIENT if transient else None), retry_after
    if isinstance(error, CONNECTION_ERRORS):
        return TRANSIENT, None
    return None, None


class Retry:
    """One client's retries: at most MAX_ATTEMPTS attempts, full-jitter backoff, and the retry quota. `classify`
    says what kind of error a failure is (aws_retry_kind for AWS, node_repair.kube_retry_kind for Kubernetes)."""

    def __init__(self, classify: Callable[[BaseException], Tuple[Optional[str], Optional[float]]] = aws_retry_kind,
                 sleep: Callable[[float], None] = time.sleep, rand: Callable[[], float] = random.random):
        self.classify, self.sleep, self.rand = classify, sleep, rand
        self.quota = QUOTA_CAPACITY
        self.lock = threading.Lock()

    def delay(self, kind: str, attempt: int, retry_after: Optional[float] = None) -> float:
        """ExponentialBackoff.delay_amount (lines 373-407): `attempt` is the 1-based attempt that failed."""
        base = THROTTLING_BASE_S if kind == THROTTLING else TRANSIENT_BASE_S
        t_i = self.rand() * min(base * 2 ** (attempt - 1), MAX_BACKOFF_S)
        if retry_after is not None:
            return max(t_i, min(retry_after, RETRY_AFTER_MAX_ADDITIONAL_S + t_i))
        return t_i

    def acquire(self, kind: str) -> bool:
        cost = THROTTLING_RETRY_COST if kind == THROTTLING else RETRY_COST
        with self.lock:
            if cost > self.quota:
                return False        # the quota is spent: this failure is final (RetryQuotaChecker.acquire_retry_quota)
            self.quota -= cost
            return True

    def release(self, amount: int) -> None:
        with self.lock:
            self.quota = min(QUOTA_CAPACITY, self.quota + amount)

    def call(self, attempt_once: Callable[[], Any]) -> Any:
        attempt, acquired = 1, 0
        while True:
            try:
                result = attempt_once()
            except Exception as error:      # noqa: BLE001  (classified; anything unknown is not retried)
                kind, retry_after = self.classify(error)
                if kind is None or attempt >= MAX_ATTEMPTS or not self.acquire(kind):
                    raise
                acquired = THROTTLING_RETRY_COST if kind == THROTTLING else RETRY_COST
                self.sleep(self.delay(kind, attempt, retry_after))
                attempt += 1
                continue
            # release_retry_quota (lines 743-760): a success gives back what its last retry took, or 1.
            self.release(acquired or NO_RETRY_INCREMENT)
            return result


class Credentials(NamedTuple):
    access_key: str
    secret_key: str
    token: Optional[str]
    expires: float          # Unix time; inf for static credentials


class PodIdentityCredentials:
    """EKS Pod Identity's credentials for this pod's service account, fetched again before they expire."""

    def __init__(self, environ: Mapping[str, str] = os.environ, clock: Callable[[], float] = time.time,
                 opener: Callable[..., Any] = urllib.request.urlopen):
        self.environ, self.clock, self.opener = environ, clock, opener
        self.current: Optional[Credentials] = None

    def get(self) -> Credentials:
        if self.current is None or self.current.expires - self.clock() < REFRESH_BEFORE_S:
            self.current = self.fetch()
        return self.current

    def fetch(self) -> Credentials:
        url = self.environ["AWS_CONTAINER_CREDENTIALS_FULL_URI"]
        with open(self.environ["AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"], encoding="utf-8") as handle:
            token = handle.read()
        if "\r" in token or "\n" in token:
            raise ValueError("the Pod Identity token is not a legal header value")
        request = urllib.request.Request(url, headers={"Authorization": token})
        with self.opener(request, timeout=TIMEOUT_S) as answer:
            found = json.loads(answer.read())
        expires = datetime.datetime.fromisoformat(found["Expiration"].replace("Z", "+00:00")).timestamp()
        return Credentials(found["AccessKeyId"], found["SecretAccessKey"], found.get("Token"), expires)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.~")


def canonical_query(params: Mapping[str, str]) -> str:
    return "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(params.items()))


def sign(method: str, url: str, headers: Mapping[str, str], body: bytes, credentials: Credentials, region: str,
         service: str, now: datetime.datetime) -> Dict[str, str]:
    """`headers` with the SigV4 Authorization, X-Amz-Date, X-Amz-Security-Token and (S3) X-Amz-Content-Sha256
    headers added. The canonical request signs every header given, plus host."""
    parts = urllib.parse.urlsplit(url)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload_hash = hashlib.sha256(body).hexdigest()
    signed = {k.lower(): " ".join(str(v).split()) for k, v in headers.items()}
    signed["host"] = parts.netloc
    signed["x-amz-date"] = stamp
    if credentials.token:
        signed["x-amz-security-token"] = credentials.token
    if service == "s3":
        signed["x-amz-content-sha256"] = payload_hash
    names = sorted(signed)
    query = canonical_query(dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True)))
    path = parts.path or "/"
    if service != "s3":     # S3 signs the path as sent; the others normalize it, a form path is always "/"
        path = urllib.parse.quote(path, safe="/-_.~")
    canonical = "\n".join([method, path, query, "".join(f"{n}:{signed[n]}\n" for n in names), ";".join(names),
                           payload_hash])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(("AWS4" + credentials.secret_key).encode(), day), region), service), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {**headers, "X-Amz-Date": stamp,
           "Authorization": f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
                            f"SignedHeaders={';'.join(names)}, Signature={signature}"}
    if credentials.token:
        out["X-Amz-Security-Token"] = credentials.token
    if service == "s3":
        out["X-Amz-Content-Sha256"] = payload_hash
    return out


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child(element: ET.Element, name: str) -> Optional[ET.Element]:
    return next((c for c in element if _local(c.tag) == name), None)


def _text(element: ET.Element, name: str) -> str:
    found = _child(element, name)
    return "" if found is None or found.text is None else found.text


def _members(element: Optional[ET.Element]) -> List[ET.Element]:
    return [] if element is None else [c for c in element if _local(c.tag) in ("member", "item")]


class Aws:
    """The calls the controller makes, in one region."""

    def __init__(self, region: str, dns_suffix: str, credentials: Any, endpoint: Optional[str] = None,
                 opener: Callable[..., Any] = urllib.request.urlopen,
                 now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.timezone.utc),
                 retry: Optional[Retry] = None):
        self.region, self.dns_suffix, self.credentials = region, dns_suffix, credentials
        self.endpoint = (endpoint or os.environ.get("AWS_ENDPOINT_URL") or "").rstrip("/") or None
        self.opener, self.now = opener, now
        self.retry = retry or Retry()

    def _send(self, method: str, url: str, service: str, headers: Dict[str, str], body: bytes = b"",
              operation: str = "") -> bytes:
        def once() -> bytes:
            # Signed again on every attempt: X-Amz-Date moves on, and the credentials may have been refreshed.
            signed = sign(method, url, headers, body, self.credentials.get(), self.region, service, self.now())
            request = urllib.request.Request(url, data=body or None, method=method, headers=signed)
            try:
                with self.opener(request, timeout=TIMEOUT_S) as answer:
                    return answer.read()
            except urllib.error.HTTPError as error:
                answered = error.headers or {}
                raise _error(error.code, error.read(), answered.get("x-amz-retry-after"), operation,
                             answered.get("x-amzn-query-error")) from None
        return self.retry.call(once)

    def query(self, service: str, version: str, action: str, params: Mapping[str, str]) -> ET.Element:
        url = (self.endpoint or f"https://{service}.{self.region}.{self.dns_suffix}") + "/"
        body = canonical_query({"Action": action, "Version": version, **params}).encode()
        answer = self._send("POST", url, service,
                            {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}, body, action)
        return ET.fromstring(answer)

    # --- Auto Scaling and EC2

    def describe_groups(self, names: List[str]) -> Dict[str, Dict[str, Any]]:
        """{group: {"desired", "suspended": [process], "instances": {id: {"lifecycle", "health"}}}}."""
        groups: Dict[str, Dict[str, Any]] = {}
        token = ""
        while True:
            params = {f"AutoScalingGroupNames.member.{i}": n for i, n in enumerate(names, 1)}
            if token:
                params["NextToken"] = token
            root = self.query("autoscaling", AUTOSCALING_VERSION, "DescribeAutoScalingGroups", params)
            result = _child(root, "DescribeAutoScalingGroupsResult")
            for group in _members(_child(result, "AutoScalingGroups")):
                groups[_text(group, "AutoScalingGroupName")] = {
                    "desired": int(_text(group, "DesiredCapacity") or 0),
                    "suspended": [_text(p, "ProcessName") for p in _members(_child(group, "SuspendedProcesses"))],
                    "instances": {_text(i, "InstanceId"): {"lifecycle": _text(i, "LifecycleState"),
                                                           "health": _text(i, "HealthStatus")}
                                  for i in _members(_child(group, "Instances"))}}
            token = _text(result, "NextToken")
            if not token:
                return groups

    def replace_instance(self, instance_id: str) -> None:
        """Terminate through the group, which keeps its desired size and launches another; the termination hook
        holds the instance for the drain handler first."""
        self.query("autoscaling", AUTOSCALING_VERSION, "TerminateInstanceInAutoScalingGroup",
                   {"InstanceId": instance_id, "ShouldDecrementDesiredCapacity": "false"})

    def mark_unhealthy(self, instance_id: str) -> None:
        """Report the instance Unhealthy: its group replaces it under its instance maintenance policy, which on a pool
        whose reservation has a spare slot launches the replacement first and terminates this one once it is
        InService (EC2 Auto Scaling User Guide, "Instance maintenance policies": health check replacements)."""
        self.query("autoscaling", AUTOSCALING_VERSION, "SetInstanceHealth",
                   {"InstanceId": instance_id, "HealthStatus": "Unhealthy", "ShouldRespectGracePeriod": "false"})

    def continue_termination(self, group: str, hook: str, instance_id: str) -> None:
        """CONTINUE the instance's termination lifecycle action: the group terminates it now, without waiting for the
        hook's heartbeat (the fast path for dead hardware, jobs/node_repair.py)."""
        self.query("autoscaling", AUTOSCALING_VERSION, "CompleteLifecycleAction",
                   {"AutoScalingGroupName": group, "LifecycleHookName": hook, "InstanceId": instance_id,
                    "LifecycleActionResult": "CONTINUE"})

    def suspend_launch(self, group: str) -> None:
        self.query("autoscaling", AUTOSCALING_VERSION, "SuspendProcesses",
                   {"AutoScalingGroupName": group, "ScalingProcesses.member.1": "Launch"})

    def reboot_instance(self, instance_id: str) -> None:
        self.query("ec2", EC2_VERSION, "RebootInstances", {"InstanceId.1": instance_id})

    # --- SQS, in the AWS JSON 1.0 protocol botocore's SQS model speaks (botocore 1.44.18 data/sqs/2012-11-05)

    def sqs(self, action: str, params: Mapping[str, Any]) -> Dict[str, Any]:
        url = (self.endpoint or f"https://sqs.{self.region}.{self.dns_suffix}") + "/"
        answer = self._send("POST", url, "sqs", {"Content-Type": "application/x-amz-json-1.0",
                                                  "X-Amz-Target": f"AmazonSQS.{action}"},
                            json.dumps(params).encode(), action)
        return json.loads(answer or b"{}")

    def receive_messages(self, queue_url: str, max_messages: int, wait_s: int,
                         visibility_s: int) -> List[Dict[str, str]]:
        """Up to `max_messages` messages, each {"body", "receipt"}; each invisible to others for `visibility_s`."""
        found = self.sqs("ReceiveMessage", {"QueueUrl": queue_url, "MaxNumberOfMessages": max_messages,
                                            "WaitTimeSeconds": wait_s, "VisibilityTimeout": visibility_s})
        return [{"body": m["Body"], "receipt": m["ReceiptHandle"]} for m in found.get("Messages") or []]

    def delete_message(self, queue_url: str, receipt: str) -> None:
        self.sqs("DeleteMessage", {"QueueUrl": queue_url, "ReceiptHandle": receipt})

    # --- S3

    def _s3_url(self, bucket: str, key: str = "", query: str = "") -> str:
        path = urllib.parse.quote(key, safe="/-_.~")
        base = f"{self.endpoint}/{bucket}" if self.endpoint else f"https://{bucket}.s3.{self.region}.{self.dns_suffix}"
        return f"{base}/{path}" + (f"?{query}" if query else "")

    def list_keys(self, bucket: str, prefix: str, start_after: str = "") -> List[str]:
        """Every key under `prefix` after `start_after`, in S3's order (UTF-8 binary, so time-stamped keys are
        oldest first)."""
        keys: List[str] = []
        token = ""
        while True:
            params = {"list-type": "2", "prefix": prefix}
            if start_after:
                params["start-after"] = start_after
            if token:
                params["continuation-token"] = token
            root = ET.fromstring(self._send("GET", self._s3_url(bucket, query=canonical_query(params)), "s3", {},
                                            operation="ListObjectsV2"))
            keys += [_text(c, "Key") for c in root if _local(c.tag) == "Contents"]
            token = _text(root, "NextContinuationToken")
            if _text(root, "IsTruncated") != "true" or not token:
                return keys

    def get_object(self, bucket: str, key: str) -> bytes:
        return self._send("GET", self._s3_url(bucket, key), "s3", {}, operation="GetObject")


def _error(status: int, body: bytes, retry_after: Optional[str] = None, operation: str = "",
           query_error: Optional[str] = None) -> AwsError:
    """The Query protocol's <ErrorResponse><Error><Code>, EC2's <Response><Errors><Error>, S3's <Error>; in the JSON
    protocol (SQS) the code of `x-amzn-query-error` ("<code>;<Sender|Receiver>"), else the body's __type after its
    '#', as botocore reads them (parsers.py BaseJSONParser._do_error_parse, lines 727-761, and
    _do_query_compatible_error_parse, lines 404-418). A body that is neither (a load balancer's 503 page) has no code:
    its status alone decides a retry, as in botocore."""
    if body.lstrip().startswith(b"{"):
        try:
            found = json.loads(body)
        except ValueError:
            found = {}
        code = str(found.get("__type") or "").split(":", 1)[0].rsplit("#", 1)[-1]
        parts = (query_error or "").split(";")
        if len(parts) == 2 and parts[0]:
            code = parts[0]
        return AwsError(status, code, str(found.get("message", found.get("Message", ""))), retry_after, operation)
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return AwsError(status, "", body[:200].decode("utf-8", "replace"), retry_after, operation)
    error = next((e for e in root.iter() if _local(e.tag) == "Error"), root)
    return AwsError(status, _text(error, "Code"), _text(error, "Message"), retry_after, operation)

