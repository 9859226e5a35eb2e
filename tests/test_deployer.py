"""Who runs Pulumi: the stack's aws: settings, the principal that gets cluster admin, get-token's arguments."""
import pytest

from decisions.config.deployer import AwsSettings, aws_settings, deployer_principal
from decisions.config.errors import ConfigError


def test_settings_pass_profile_role_and_allowed_accounts():
    settings = aws_settings({"region": "us-east-1", "profile": "platform", "allowedAccountIds": ["123456789012"],
                             "assumeRoles": [{"roleArn": "arn:aws:iam::123456789012:role/deploy", "sessionName": "ci"}]})
    assert settings == AwsSettings(region="us-east-1", profile="platform", allowed_account_ids=("123456789012",),
                                   assume_role={"role_arn": "arn:aws:iam::123456789012:role/deploy", "session_name": "ci"})
    # get-token must act as the same identity the provider is
    assert settings.token_args() == ["--profile", "platform", "--role-arn", "arn:aws:iam::123456789012:role/deploy"]
    assert aws_settings({"region": "eu-west-1"}).token_args() == []


@pytest.mark.parametrize("values,path,message", [
    ({"accessKey": "x"}, "aws:accessKey", "is not passed to gpu-cloud's AWS provider; supported: region, profile"),
    ({"assumeRoles": [{"roleArn": "arn:aws:iam::1:role/a"}, {"roleArn": "arn:aws:iam::1:role/b"}]}, "aws:assumeRoles",
     "at most one role"),
    ({"assumeRoles": [{"roleArn": "arn:aws:iam::1:role/a", "externalId": "x"}]}, "aws:assumeRoles[0]", "unknown: externalId"),
    ({"assumeRoles": [{"sessionName": "ci"}]}, "aws:assumeRoles[0]", "needs roleArn"),
    ({"allowedAccountIds": "123456789012"}, "aws:allowedAccountIds", "must be a list"),
])
def test_settings_gpu_cloud_cannot_honour_are_refused_by_key(values, path, message):
    with pytest.raises(ConfigError) as raised:
        aws_settings(values)
    (issue,) = raised.value.issues
    assert issue.path == path and message in issue.message


@pytest.mark.parametrize("caller,issuer,principal", [
    ("arn:aws:sts::123456789012:assumed-role/deploy/ci-42", "arn:aws:iam::123456789012:role/ci/deploy",
     "arn:aws:iam::123456789012:role/ci/deploy"),          # the role, with the path the session ARN drops
    ("arn:aws:iam::123456789012:user/alice", None, "arn:aws:iam::123456789012:user/alice"),
])
def test_the_principal_is_the_sessions_role_or_the_user(caller, issuer, principal):
    assert deployer_principal(caller, issuer) == principal


def test_the_account_root_cannot_deploy():
    with pytest.raises(ConfigError) as raised:
        deployer_principal("arn:aws:iam::123456789012:root", None)
    assert "run as an IAM role" in str(raised.value)
