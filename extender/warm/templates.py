"""The team's fetch and publish steps: ``{{name}}`` placeholders filled per action.

Why a template and not a built-in downloader: every team already has its tooling and credentials
for its object store (``aws s3 sync``, ``gsutil``, ``s5cmd``, an internal fetcher), and the warmer
should not become one more client to configure. The warmer only decides *where* (``{{staging}}``,
a directory on the node's cache root) and *what* (``{{source}}``, ``{{key}}``, ...); the layout's
bookkeeping (manifest, marker, atomic rename) is done by our own helper steps (:mod:`.steps`).

Substitution is plain text, no expressions: ``{{ name }}`` becomes the value, nothing else is
touched (``$VAR`` and ``${VAR}`` stay for the shell). Unknown names are rejected when the policy
loads (:func:`extender.core.policy.cross_check`), so rendering cannot fail on a typo at 3 a.m.
The same values are also set as ``WARM_<NAME>`` environment variables.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from extender.core.cachekey import compile_cache_key
from extender.core.errors import UnknownNameError
from extender.core.policy import PLACEHOLDER, NodeClass, Policy, Profile, StepTemplate
from extender.core.warming import Action
from extender.warm.steps import CACHE_MOUNT, cache_path, parse_cache_id, staging_path

JSON = dict[str, Any]


def render(text: str, values: Mapping[str, str]) -> str:
    """``text`` with every ``{{name}}`` replaced by ``values[name]`` (a missing name raises KeyError)."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def env_name(name: str) -> str:
    """``cacheRoot`` -> ``WARM_CACHE_ROOT``."""
    return "WARM_" + re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def container(name: str, template: StepTemplate, values: Mapping[str, str]) -> JSON:
    """The container a template describes, rendered (without resources and mounts: the Job adds them)."""
    env = [{"name": env_name(k), "value": v} for k, v in sorted(values.items())]
    env += [{"name": k, "value": render(v, values)} for k, v in template.env.items()]
    out: JSON = {
        "name": name,
        "image": render(template.image, values),
        "command": [render(c, values) for c in template.command],
        "env": env,
    }
    if template.args:
        out["args"] = [render(a, values) for a in template.args]
    if template.env_from_secrets:
        out["envFrom"] = [{"secretRef": {"name": s}} for s in template.env_from_secrets]
    return out


def compile_key_of(profile: Profile, node_class: NodeClass) -> str | None:
    """The profile's compile-cache key on a class (``None`` without ``compile.key``)."""
    if profile.compile.key is None:
        return None
    return compile_cache_key(profile.compile.key, gpu_product=node_class.gpu.product,
                             tensor_parallel=profile.parallelism.tensor,
                             pipeline_parallel=profile.parallelism.pipeline)


def action_values(policy: Policy, action: Action, node_class: str = "") -> dict[str, str]:
    """The placeholder values of one warm action (names in :data:`extender.core.policy.TEMPLATE_VARS`).

    ``node_class``: the class of the action's node, as the inventory classifies it.
    """
    try:
        profile = policy.profile(action.workload)
    except UnknownNameError:
        profile = None
    kind, name = parse_cache_id(action.cache)
    root = PurePosixPath(CACHE_MOUNT)
    values = {
        "node": action.node, "workload": action.workload, "kind": kind, "cacheId": action.cache,
        "cacheRoot": CACHE_MOUNT, "registry": policy.warming.registry, "bytes": str(action.bytes),
        "nodeClass": node_class,
    }
    if kind == "image":
        return values
    values["staging"] = str(staging_path(root, action.cache))
    values["dest"] = str(cache_path(root, action.cache))
    if kind == "weights":
        values["version"] = name.partition("/")[2]
        values["source"] = profile.weights.source if profile is not None else ""
    elif kind == "compile":
        values["key"] = name
    return values


def publish_values(policy: Policy, *, key: str, node: str, workload: str, node_class: str,
                   size: int) -> dict[str, str]:
    """The placeholder values of a compile-cache publish step."""
    return {
        "node": node, "nodeClass": node_class, "workload": workload, "kind": "compile",
        "cacheId": f"compile:{key}", "cacheRoot": CACHE_MOUNT, "registry": policy.warming.registry,
        "bytes": str(size), "key": key, "dir": str(cache_path(PurePosixPath(CACHE_MOUNT), f"compile:{key}")),
    }
