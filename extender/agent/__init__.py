"""The node agent: scans the node's cache root and reports it to the inventory.

``extender agent`` runs one per node (a DaemonSet). Pieces: :mod:`.layout` (the cache layout,
shared with writers), :mod:`.scan` (filesystem -> what is cached), :mod:`.disk` (NVMe size),
:mod:`.loop` (the reporting loop) and :mod:`.commands` (the CLI). Importing it does no work.
"""
