"""Store keys as a tree split at ``/``, so the keys under a prefix are found without a scan.

Keys such as ``"job-7/stage-2/part-13"`` share their leading components; removing every key of
a job (``pop_prefix("job-7/")``) walks to that job's subtree and detaches it, touching only
the keys removed (plus, for a prefix that ends inside a component, that component's
siblings). Pure data structure, no locking: the store holds its lock around it.

>>> index = KeyIndex()
>>> for key in ["a/1", "a/2", "ab/1", "b"]:
...     index.add(key)
>>> sorted(index.pop_prefix("a/")), sorted(index.pop_prefix("a")), len(index)
(['a/1', 'a/2'], ['ab/1'], 1)
"""
from __future__ import annotations

SEPARATOR = "/"


class _Dir:
    __slots__ = ("children", "is_key")

    def __init__(self) -> None:
        self.children: dict[str, _Dir] = {}
        self.is_key = False


class KeyIndex:
    """A set of string keys that can remove everything under a prefix in O(matching keys)."""

    def __init__(self) -> None:
        self._root = _Dir()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, key: str) -> None:
        """Add ``key`` (adding a present key changes nothing)."""
        node = self._root
        for part in key.split(SEPARATOR):
            child = node.children.get(part)
            if child is None:
                child = node.children[part] = _Dir()
            node = child
        if not node.is_key:
            node.is_key = True
            self._count += 1

    def discard(self, key: str) -> None:
        """Remove ``key`` if present, pruning directories left empty."""
        path: list[tuple[_Dir, str]] = []
        node = self._root
        for part in key.split(SEPARATOR):
            child = node.children.get(part)
            if child is None:
                return
            path.append((node, part))
            node = child
        if not node.is_key:
            return
        node.is_key = False
        self._count -= 1
        self._prune(path)

    def pop_prefix(self, prefix: str) -> list[str]:
        """Remove and return every key that starts with ``prefix`` (plain string prefix)."""
        *dirs, last = prefix.split(SEPARATOR)
        path: list[tuple[_Dir, str]] = []
        node = self._root
        for part in dirs:
            child = node.children.get(part)
            if child is None:
                return []
            path.append((node, part))
            node = child
        base = SEPARATOR.join(dirs)
        keys: list[str] = []
        for name in [n for n in node.children if n.startswith(last)]:
            sub = node.children.pop(name)
            keys.extend(_walk(sub, f"{base}{SEPARATOR}{name}" if dirs else name))
        self._count -= len(keys)
        self._prune(path)
        return keys

    @staticmethod
    def _prune(path: list[tuple[_Dir, str]]) -> None:
        for parent, part in reversed(path):
            child = parent.children[part]
            if child.is_key or child.children:
                return
            del parent.children[part]


def _walk(node: _Dir, key: str) -> list[str]:
    found: list[str] = []
    stack = [(node, key)]
    while stack:
        current, name = stack.pop()
        if current.is_key:
            found.append(name)
        stack.extend((child, f"{name}{SEPARATOR}{part}")
                     for part, child in current.children.items())
    return found
