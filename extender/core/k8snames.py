"""Kubernetes' names, checked as the API server checks them (apimachinery's validation): DNS-1123
labels and subdomains, qualified names (``[prefix/]name``: label, taint and resource keys), label
values and environment variable names.

One home for rules several documents need: the policy's warm Job fields (so ``extender policy
check`` refuses what Kubernetes would refuse when the first Job is created, with the field's
place), the inventory's node names, and KEDA trigger namespaces. Pure (no I/O).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from extender.core.errors import InvalidValueError

#: A DNS-1123 label (namespace names; at most 63 characters).
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: A DNS-1123 subdomain (node, Secret, ServiceAccount names; at most 253 characters).
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN)
_QUALIFIED_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def _dns_label(value: str) -> str:
    if not DNS_LABEL.fullmatch(value) or len(value) > 63:
        raise InvalidValueError(f"{value!r} is not a valid Kubernetes name (DNS-1123 label): lowercase letters, "
                                "digits and '-', starting and ending with a letter or digit, at most 63 characters")
    return value


def _dns_subdomain(value: str) -> str:
    if not _DNS_SUBDOMAIN.fullmatch(value) or len(value) > 253:
        raise InvalidValueError(f"{value!r} is not a valid Kubernetes name (DNS-1123 subdomain): lowercase "
                                "letters, digits, '-' and '.', starting and ending with a letter or digit, at most "
                                "253 characters")
    return value


def qualified_name_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes qualified name (``[prefix/]name``: label keys, taint keys,
    resource names), or ``None``."""
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or not _DNS_SUBDOMAIN.fullmatch(prefix) or len(prefix) > 253):
        return (f"{value!r}: the prefix before '/' must be a DNS subdomain (lowercase letters, digits, '-' and "
                "'.', at most 253 characters)")
    if not _QUALIFIED_PART.fullmatch(name) or len(name) > 63:
        return (f"{value!r} is not a qualified name: [prefix/]name, the name of letters, digits, '-', '_' and "
                "'.', starting and ending with a letter or digit, at most 63 characters")
    return None


def _qualified_name(value: str) -> str:
    problem = qualified_name_problem(value)
    if problem is not None:
        raise InvalidValueError(problem)
    return value


def optional_qualified_name(value: str) -> str:
    return _qualified_name(value) if value else value


def _label_value(value: str) -> str:
    if value and (not _QUALIFIED_PART.fullmatch(value) or len(value) > 63):
        raise InvalidValueError(f"{value!r} is not a valid label value: letters, digits, '-', '_' and '.', starting "
                                "and ending with a letter or digit, at most 63 characters (or empty)")
    return value


def env_names(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        if not _ENV_NAME.fullmatch(name) or name.startswith(".."):
            raise InvalidValueError(f"{name!r} is not a valid environment variable name: letters, digits, '_', "
                                    "'-' and '.', not starting with a digit or '..'")
    return env


#: A Kubernetes object name that is a DNS-1123 label (a namespace).
DnsLabel = Annotated[str, Field(min_length=1, max_length=63), AfterValidator(_dns_label)]
#: A Kubernetes object name that is a DNS-1123 subdomain (PriorityClass, ServiceAccount, Secret).
DnsSubdomain = Annotated[str, Field(min_length=1, max_length=253), AfterValidator(_dns_subdomain)]
#: A Kubernetes qualified name (``[prefix/]name``): label, annotation, taint and toleration keys.
QualifiedName = Annotated[str, Field(min_length=1, max_length=317), AfterValidator(_qualified_name)]
#: A label's value; also a taint's (or an Equal toleration's) value, which follows the same rule.
LabelValue = Annotated[str, AfterValidator(_label_value)]
