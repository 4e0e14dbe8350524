"""vLLM's own compile cache inside a compile-cache key directory, recognised without any marker of ours.

Attribution. A serving pod points ``VLLM_CACHE_ROOT`` inside ``<root>/compile/<key>/`` (the key
from ``extender cachekey``): the directory's name is the key, so whatever vLLM writes there is that
key's cache. A vLLM cache directory elsewhere (``~/.cache/vllm`` in the pod) is not attributed to
any key: vLLM names its trees by a hash of its own (config, environment, traced source files,
compiler), which cannot be turned into ours, and ours hashes the GPU product of the node class,
which the agent does not know. So the pods that should leave reusable compile caches set
``VLLM_CACHE_ROOT`` (and for non-vLLM engines ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``)
under the key directory.

What vLLM writes under ``VLLM_CACHE_ROOT`` (default ``~/.cache/vllm``, or ``$XDG_CACHE_HOME/vllm``:
``vllm-project/vllm`` ``vllm/envs.py``)::

    torch_compile_cache/<hash>/rank_<r>_<dp>/<prefix>/     vllm/compilation/backends.py
        cache_key_factors.json, computation_graph.py       written before compiling starts
        vllm_compile_cache.py                              the index of compiled graphs, written after
        ...                                                artifacts of the standalone compiler
    torch_compile_cache/<hash>/rank_<r>_<dp>/vllm_compile_cache.py
                                                           earlier releases (v0.8 among them): the
                                                           same files, without the <prefix>/ level
    torch_compile_cache/<hash>/rank_<r>_<dp>/inductor_cache/, triton_cache/
                                                           Inductor's and Triton's caches, redirected
                                                           there (vllm/compilation/compiler_interface.py)
    torch_compile_cache/torch_aot_compile/<hash>/rank_<r>_<dp>/model
    torch_aot_compile/<hash>/rank_<r>_<dp>/model           the AOT-compiled model (earlier releases put
                                                           it here), saved once compiling is done
                                                           (vllm/compilation/decorators.py)

Present. ``VLLM_CACHE_ROOT`` may be the key directory itself or one directory below it (for
example ``<key>/vllm`` next to ``<key>/inductor``). When such a vLLM tree is there, the key counts
as present only once vLLM saved what it loads on the next start: a non-empty
``vllm_compile_cache.py`` or AOT ``model`` file. The files vLLM writes *before* compiling
(``cache_key_factors.json``, ``computation_graph.py``) would otherwise make a pod that died during
its first compile look like a warm cache, and vLLM does not load graphs its index does not list.
Without a vLLM tree the rule of :mod:`extender.layout` stays: any file counts.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator

#: Where vLLM's trees start below ``VLLM_CACHE_ROOT``.
COMPILE_TREE = "torch_compile_cache"
AOT_TREE = "torch_aot_compile"
#: What a finished compile leaves: the index of compiled graphs, the AOT-compiled model.
INDEX_FILE = "vllm_compile_cache.py"
AOT_FILE = "model"

OnError = Callable[[str, OSError], None]


def _subdirs(path: str, on_error: OnError) -> Iterator[str]:
    """Paths of the real sub-directories of ``path`` (symbolic links are not followed)."""
    try:
        with os.scandir(path) as it:
            entries = [e for e in it if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return
    except OSError as exc:
        on_error(path, exc)
        return
    for e in sorted(entries, key=lambda e: e.name):
        yield e.path


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _nonempty_file(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0


def cache_roots(key_dir: str, on_error: OnError) -> list[str]:
    """The ``VLLM_CACHE_ROOT`` directories in a key directory: itself or a child that holds a vLLM tree."""
    candidates = [key_dir, *_subdirs(key_dir, on_error)]
    return [c for c in candidates if _is_dir(os.path.join(c, COMPILE_TREE)) or _is_dir(os.path.join(c, AOT_TREE))]


def _ranks(hash_dir: str, on_error: OnError) -> Iterator[str]:
    return (r for r in _subdirs(hash_dir, on_error) if os.path.basename(r).startswith("rank_"))


def compiled(vllm_root: str, on_error: OnError) -> bool:
    """Did vLLM save a finished compile under this ``VLLM_CACHE_ROOT`` (an index or an AOT model)?"""
    tree = os.path.join(vllm_root, COMPILE_TREE)
    for hash_dir in _subdirs(tree, on_error):
        if os.path.basename(hash_dir) == AOT_TREE:
            continue
        for rank in _ranks(hash_dir, on_error):
            # <prefix>/ below the rank directory; earlier releases put the index in the rank directory
            if any(_nonempty_file(os.path.join(p, INDEX_FILE)) for p in (rank, *_subdirs(rank, on_error))):
                return True
    for aot in (os.path.join(tree, AOT_TREE), os.path.join(vllm_root, AOT_TREE)):
        for hash_dir in _subdirs(aot, on_error):
            if any(_nonempty_file(os.path.join(r, AOT_FILE)) for r in _ranks(hash_dir, on_error)):
                return True
    return False


def vllm_state(key_dir: str, on_error: OnError) -> bool | None:
    """``None`` when the key directory holds no vLLM tree; else whether one holds a finished compile."""
    roots = cache_roots(key_dir, on_error)
    if not roots:
        return None
    return any(compiled(r, on_error) for r in roots)
