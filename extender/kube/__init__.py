"""Everything that talks to the Kubernetes API; the only package that imports ``kubernetes``.

Importing it does no work: clients are built by the commands (``extender sync``, the agent's
``--label-nodes``) when they start. The official client is untyped, so its objects never leave this
package: callers see plain JSON dicts, our pydantic models and our errors
(:mod:`extender.kube.errors`).
"""
