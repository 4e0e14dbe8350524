"""The team's fetch and publish steps: ``{{name}}`` placeholders filled per action.

Why a template and not a built-in downloader: every team already has its tooling and credentials
for its object store (``aws s3 sync``, ``gsutil``, ``s5cmd``, an internal fetcher), and the warmer
should not become one more client to configure. The warmer only decides *where* (``{{staging}}``,
a directory on the node's cache root) and *what* (``{{source}}``, ``{{key}}``, ...); the layout's
bookkeeping (manifest, marker, atomic rename) is done by our own helper steps (:mod:`.steps`).

Substitution, no expressions: ``{{ name }}`` becomes the value, nothing else is touched (``$VAR``
and ``${VAR}`` stay for the shell). Unknown names are rejected when the policy loads
(:func:`extender.core.policy.cross_check`), so rendering cannot fail on a typo at 3 a.m. The same
values are also set as ``WARM_<NAME>`` environment variables.

A value never becomes code. Weights sources, versions, registries and cache keys come from the
policy and the inventory, and pasted into ``sh -c`` as text a value with a quote and a ``;`` was a
command. In a shell script (the argument after ``-c`` of ``sh``, ``bash``, ...) a placeholder
therefore becomes a reference to its ``WARM_<NAME>`` variable, written for the quoting context it
stands in (``"${WARM_SOURCE}"`` outside quotes, ``${WARM_SOURCE}`` inside double quotes, and
closing and reopening single quotes around it), so the shell expands it as one word of data and
never parses it. A here-document in such a script is refused when the policy loads (its body
follows other quoting rules); comments are understood, quotes in them included. Elsewhere
(exec-form ``command`` and ``args``, ``env``, ``image``) no shell reads the text and the value is
put in as it is, one argument.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, assert_never

from extender.core.errors import UnknownNameError
from extender.core.policy import PLACEHOLDER, Policy, StepTemplate
from extender.core.shell import quote_state, script_positions
from extender.core.warming import Action
from extender.warm.steps import CACHE_MOUNT, cache_path, parse_cache_id, staging_path

JSON = dict[str, Any]


def render(text: str, values: Mapping[str, str]) -> str:
    """``text`` with every ``{{name}}`` replaced by ``values[name]`` (a missing name raises KeyError)."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def render_script(script: str, values: Mapping[str, str]) -> str:
    """``script`` with every placeholder replaced by a quoted reference to its environment variable.

    The quoting state (outside quotes, in ``'...'``, in ``"..."``, with backslash escapes, in a
    ``#`` comment: :func:`extender.core.shell.quote_state`) is tracked up to each placeholder,
    so the reference is one word in every context and the value itself never passes through the
    shell's parser.
    """
    out: list[str] = []
    state = ""  # "", "'", '"' or "#" (a comment)
    pos = 0
    for match in PLACEHOLDER.finditer(script):
        text = script[pos:match.start()]
        state = quote_state(text, state, word_start=pos == 0)
        out.append(text)
        name = match.group(1)
        if name not in values:  # as render() does: the policy check makes this unreachable
            raise UnknownNameError(f"no template variable {name!r}")
        ref = "${" + env_name(name) + "}"
        out.append({"": f'"{ref}"', '"': ref, "'": f"'\"{ref}\"'", "#": ref}[state])
        pos = match.end()
    out.append(script[pos:])
    return "".join(out)


def render_argv(argv: list[str], values: Mapping[str, str]) -> list[str]:
    """Render a container's full argv: scripts by :func:`render_script`, other words by :func:`render`."""
    scripts = script_positions(argv)
    return [render_script(w, values) if i in scripts else render(w, values) for i, w in enumerate(argv)]


def env_name(name: str) -> str:
    """``cacheRoot`` -> ``WARM_CACHE_ROOT``."""
    return "WARM_" + re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def container(name: str, template: StepTemplate, values: Mapping[str, str]) -> JSON:
    """The container a template describes, rendered (without resources and mounts: the Job adds them)."""
    env = [{"name": env_name(k), "value": v} for k, v in sorted(values.items())]
    env += [{"name": k, "value": render(v, values)} for k, v in template.env.items()]
    argv = render_argv([*template.command, *template.args], values)
    out: JSON = {
        "name": name,
        "image": render(template.image, values),
        "command": argv[:len(template.command)],
        "env": env,
    }
    if template.args:
        out["args"] = argv[len(template.command):]
    if template.env_from_secrets:
        out["envFrom"] = [{"secretRef": {"name": s}} for s in template.env_from_secrets]
    return out


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
    match kind:
        case "weights":
            values["version"] = name.partition("/")[2]
            values["source"] = profile.weights.source if profile is not None else ""
        case "compile":
            values["key"] = name
        case "adapter":
            adapter = name.partition("/")[2]
            values["adapter"] = adapter
            values["source"] = next((a.source for a in (profile.adapters if profile else ()) if a.name == adapter), "")
        case "snapshot":
            values["version"] = name.partition("/")[2]
        case _:
            assert_never(kind)
    return values


def publish_values(policy: Policy, *, key: str, node: str, workload: str, node_class: str,
                   size: int) -> dict[str, str]:
    """The placeholder values of a compile-cache publish step."""
    return {
        "node": node, "nodeClass": node_class, "workload": workload, "kind": "compile",
        "cacheId": f"compile:{key}", "cacheRoot": CACHE_MOUNT, "registry": policy.warming.registry,
        "bytes": str(size), "key": key, "dir": str(cache_path(PurePosixPath(CACHE_MOUNT), f"compile:{key}")),
    }
