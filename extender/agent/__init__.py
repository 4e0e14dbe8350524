"""The node agent: scans the node's cache root and reports it to the inventory.

``extender agent`` runs one per node (a DaemonSet). Pieces: :mod:`.scan` (the cache root, in the
layout of :mod:`extender.layout`, -> what is cached), :mod:`.vllm_cache` (vLLM's own compile tree
inside a key directory), :mod:`.hub` (Hugging Face hub caches pods fill themselves, mapped to
profiles by the policy), :mod:`.disk` (NVMe size), :mod:`.loop` (the reporting loop) and
:mod:`.commands` (the CLI). Importing it does no work.
"""
