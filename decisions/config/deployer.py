"""Who runs Pulumi, and how: the stack's `aws:` provider settings, the identity they resolve to, and the
arguments that make `aws eks get-token` (the Kubernetes provider's credential) act as that same identity.
Pure: no Pulumi.

One identity does everything. The explicit AWS provider is built from the stack's `aws:` keys (an
explicit provider does not read them by itself), every provider function goes through it, and the
kubeconfig's `aws eks get-token` gets the same profile and role. The cluster gives that identity's IAM
principal (for an assumed role, the role, which the session context names) cluster-admin access, unless
it is already one of `cluster.adminRoleArns`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Tuple

from decisions.config.errors import ConfigError, ConfigIssue

# The `aws:` keys gpu-cloud passes to its AWS provider (stack config key -> provider argument).
AWS_PROVIDER_KEYS = {
    "region": "region",
    "profile": "profile",
    "assumeRoles": "assume_roles",
    "allowedAccountIds": "allowed_account_ids",
}
# No externalId: `aws eks get-token --role-arn` cannot pass one, so the Kubernetes provider could not act as
# the role the AWS provider assumed.
ASSUME_ROLE_KEYS = {"roleArn": "role_arn", "sessionName": "session_name", "duration": "duration"}
ROOT_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:root$")
ASSUMED_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:sts::\d{12}:assumed-role/[^/]+/.+$")


@dataclass(frozen=True)
class AwsSettings:
    region: Optional[str] = None
    profile: Optional[str] = None
    assume_role: Optional[Mapping[str, str]] = None          # provider argument names -> values
    allowed_account_ids: Tuple[str, ...] = ()

    def token_args(self) -> List[str]:
        """`aws eks get-token` arguments that make it the provider's identity."""
        args = ["--profile", self.profile] if self.profile else []
        if self.assume_role:
            args += ["--role-arn", self.assume_role["role_arn"]]
        return args


def aws_settings(values: Mapping[str, Any]) -> AwsSettings:
    """The provider settings from the stack's `aws:` keys (key without namespace -> value), or ConfigError."""
    issues: List[ConfigIssue] = []
    unknown = sorted(set(values) - set(AWS_PROVIDER_KEYS))
    for key in unknown:
        issues.append(ConfigIssue(f"aws:{key}", f"is not passed to gpu-cloud's AWS provider; supported: "
                                                f"{', '.join(AWS_PROVIDER_KEYS)}"))
    roles = values.get("assumeRoles") or []
    assume_role = None
    if not isinstance(roles, list) or len(roles) > 1 or any(not isinstance(r, dict) for r in roles):
        issues.append(ConfigIssue("aws:assumeRoles", "must be a list of at most one role ({roleArn, sessionName, "
                                                     "duration}): `aws eks get-token` assumes one role"))
    elif roles:
        role = roles[0]
        bad = sorted(set(role) - set(ASSUME_ROLE_KEYS))
        if bad or not role.get("roleArn"):
            issues.append(ConfigIssue("aws:assumeRoles[0]", f"needs roleArn; allowed keys: {', '.join(ASSUME_ROLE_KEYS)}"
                                                            + (f" (unknown: {', '.join(bad)})" if bad else "")))
        else:
            assume_role = {ASSUME_ROLE_KEYS[k]: str(v) for k, v in role.items()}
    allowed = values.get("allowedAccountIds", [])
    if not isinstance(allowed, list) or not all(isinstance(v, str) for v in allowed):
        issues.append(ConfigIssue("aws:allowedAccountIds", "must be a list of account IDs"))
    if issues:
        raise ConfigError(issues)
    return AwsSettings(
        region=values.get("region"), profile=values.get("profile"), assume_role=assume_role,
        allowed_account_ids=tuple(allowed))


def deployer_principal(caller_arn: str, issuer_arn: Optional[str]) -> str:
    """The IAM principal an access entry names for the caller: an assumed role's role (with its path, which
    only the session context knows), or the IAM user itself. The account root cannot have an access entry."""
    if ROOT_ARN.match(caller_arn):
        raise ConfigError([ConfigIssue("aws:profile", f"Pulumi runs as the account root ({caller_arn}); EKS gives the "
                                                      "root no access entry: run as an IAM role")])
    if ASSUMED_ROLE_ARN.match(caller_arn):
        if not issuer_arn:
            raise ValueError(f"no session issuer for {caller_arn}")
        return issuer_arn
    return caller_arn
