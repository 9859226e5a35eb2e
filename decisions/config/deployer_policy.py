"""The deployer's IAM policy, built from what a stack registers and reads.

decisions/config/deployer_actions.yaml maps each AWS resource type token (`aws:ec2/vpc:Vpc`) and provider function
token (`aws:ssm/getParameter:getParameter`) to the IAM actions its create, read, update and delete make, with sources;
`withoutIam` names what makes no AWS call an identity policy governs (Kubernetes objects, provider configurations).
`required_grants` takes the tokens of a plan (every type and function of the stacks to deploy) and gives the actions and
the service-linked roles they need, failing on a token the table does not know; `policy_documents` writes them as IAM
policy documents, one statement per service, split by service into several documents when one would pass the size
IAM allows a customer managed policy.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, List, Mapping, Sequence, Tuple

from pydantic import Field, field_validator, model_validator

from decisions.catalog.data_files import DataModel, load_model

ACTIONS_PATH = Path(__file__).with_name("deployer_actions.yaml")
# IAM's quota for a customer managed policy: 6,144 characters, white space not counted (IAM User Guide, "IAM and AWS
# STS quotas", "Managed policy size").
MANAGED_POLICY_LIMIT = 6144
VERSION = "2012-10-17"
SERVICE_LINKED_ROLE = "iam:CreateServiceLinkedRole"
_ACTION = re.compile(r"^[a-z0-9-]+:[A-Za-z0-9]+\*?$")


class Grant(DataModel):
    """What one resource type or provider function needs: its actions, and the service-linked roles its create may make
    on first use (granted as iam:CreateServiceLinkedRole on those service names only)."""
    actions: Tuple[str, ...]
    service_linked_roles: Tuple[str, ...] = Field((), alias="serviceLinkedRoles")

    @field_validator("actions")
    @classmethod
    def _named_actions(cls, actions: Tuple[str, ...]) -> Tuple[str, ...]:
        if not actions:
            raise ValueError("at least one action (what needs none belongs under withoutIam, with the reason)")
        bad = [a for a in actions if not _ACTION.match(a)]
        if bad:
            raise ValueError(f"not an IAM action (service:Action): {bad}")
        if SERVICE_LINKED_ROLE in actions:
            raise ValueError(f"{SERVICE_LINKED_ROLE} is granted per service name: list them under serviceLinkedRoles")
        if len(set(actions)) != len(actions):
            raise ValueError(f"an action listed twice: {sorted(a for a in set(actions) if actions.count(a) > 1)}")
        return actions


class DeployerActions(DataModel):
    sources: Dict[str, str]          # IAM service prefix -> where its actions and the provider's calls come from
    resources: Dict[str, Grant]      # resource type token -> grant
    invokes: Dict[str, Grant]        # provider function token -> grant
    without_iam: Dict[str, str] = Field(alias="withoutIam")   # token, or a prefix ending in ":", -> why no IAM

    @model_validator(mode="after")
    def _every_service_cites_its_source(self) -> "DeployerActions":
        services = {a.split(":", 1)[0] for grant in (*self.resources.values(), *self.invokes.values())
                    for a in grant.actions}
        unsourced = sorted(services - set(self.sources))
        if unsourced:
            raise ValueError(f"services with no source under `sources`: {unsourced}")
        both = sorted((set(self.resources) | set(self.invokes)) & set(self.without_iam))
        if both:
            raise ValueError(f"tokens both granted and listed as needing no IAM: {both}")
        return self


def load_deployer_actions(path: Path = ACTIONS_PATH) -> DeployerActions:
    return load_model(path, DeployerActions)


class UnmappedTokens(ValueError):
    """Tokens of a plan the table does not know: each needs its actions in deployer_actions.yaml."""

    def __init__(self, tokens: Sequence[str], path: Path = ACTIONS_PATH):
        self.tokens = tuple(tokens)
        super().__init__(f"no IAM actions recorded for {', '.join(self.tokens)}: add each to {path.name} (resources "
                         "or invokes, with its source), or under withoutIam with the reason it makes no AWS call")


def _covers(entry: str, token: str) -> bool:
    """Whether a withoutIam entry (a token, or a prefix ending in ":") covers `token`."""
    return token == entry or (entry.endswith(":") and token.startswith(entry))


def needs_no_iam(token: str, table: DeployerActions) -> bool:
    return any(_covers(entry, token) for entry in table.without_iam)


@dataclass(frozen=True)
class Grants:
    actions: FrozenSet[str]
    service_linked_roles: FrozenSet[str]


def required_grants(types: Iterable[str], invokes: Iterable[str], table: DeployerActions) -> Grants:
    """The actions and service-linked roles the resource `types` and provider functions `invokes` need; every token must
    be in the table (UnmappedTokens names those that are not)."""
    actions, linked, unmapped = set(), set(), []
    for token, granted in [(t, table.resources) for t in sorted(set(types))] + \
                          [(t, table.invokes) for t in sorted(set(invokes))]:
        grant = granted.get(token)
        if grant is None:
            if not needs_no_iam(token, table):
                unmapped.append(token)
            continue
        actions.update(grant.actions)
        linked.update(grant.service_linked_roles)
    if unmapped:
        raise UnmappedTokens(unmapped)
    return Grants(frozenset(actions), frozenset(linked))


def unused_entries(table: DeployerActions, types: Iterable[str], invokes: Iterable[str]) -> List[str]:
    """Entries of the table that none of `types` and `invokes` uses: what the policy would grant for nothing."""
    types, invokes = set(types), set(invokes)
    return sorted([t for t in table.resources if t not in types] + [t for t in table.invokes if t not in invokes]
                  + [e for e in table.without_iam if not any(_covers(e, t) for t in types | invokes)])


def _sid(service: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^a-z0-9]+", service))


def statements(grants: Grants) -> List[Dict]:
    """One statement per service (sorted actions, every resource), then the service-linked roles, by service name."""
    by_service: Dict[str, List[str]] = defaultdict(list)
    for action in sorted(grants.actions):
        by_service[action.split(":", 1)[0]].append(action)
    found = [{"Sid": _sid(service), "Effect": "Allow", "Action": actions, "Resource": "*"}
             for service, actions in sorted(by_service.items())]
    if grants.service_linked_roles:
        found.append({"Sid": "ServiceLinkedRoles", "Effect": "Allow", "Action": SERVICE_LINKED_ROLE, "Resource": "*",
                      "Condition": {"StringEquals": {"iam:AWSServiceName": sorted(grants.service_linked_roles)}}})
    return found


def policy_size(document: Mapping) -> int:
    """The size IAM counts against MANAGED_POLICY_LIMIT: the JSON without white space."""
    return len(json.dumps(document, separators=(",", ":")))


def policy_documents(grants: Grants, limit: int = MANAGED_POLICY_LIMIT) -> List[Dict]:
    """The policy as few documents as fit `limit` each: statements whole and in order, a new document when the next
    would not fit. A statement larger than `limit` on its own raises ValueError."""
    documents: List[Dict] = []
    for statement in statements(grants):
        if policy_size({"Version": VERSION, "Statement": [statement]}) > limit:
            raise ValueError(f"the statement {statement['Sid']} alone is over {limit} characters: split its service")
        if documents and policy_size({**documents[-1], "Statement": documents[-1]["Statement"] + [statement]}) <= limit:
            documents[-1]["Statement"].append(statement)
        else:
            documents.append({"Version": VERSION, "Statement": [statement]})
    return documents


def render(document: Mapping) -> str:
    """A document as the repository keeps it: indented JSON, one action a line, a final newline."""
    return json.dumps(document, indent=2) + "\n"
