"""The cache warmer's executor: turns the planner's actions (:mod:`extender.core.warming`) into Kubernetes Jobs.

Pieces: :mod:`.steps` (what runs on the node: evict, stage, finish, the cache layout's writer
side), :mod:`.templates` (the team's own fetch and publish commands, rendered per action),
:mod:`.jobspec` (Job and Event objects, pure), :mod:`.checks` (what the inventory says about an
action: done, safe to evict, node warm), :mod:`.publish` (which compile caches to publish),
:mod:`.executor` (the API calls), :mod:`.taints` (new nodes kept tainted until warm),
:mod:`.metrics`, :mod:`.loop` (:class:`~extender.warm.loop.WarmLoop`, one tick inside the
scaler's leader tick) and :mod:`.commands` (``extender warm ...``). Importing it does no work.
How it fits together: docs/warming.md.
"""
