"""Safe YAML reading with line numbers: each document comes back as plain data plus a map
from field paths to the line they were written on, so validation errors can point at the
line. Size, depth and node-count limits stop hostile input (alias bombs, deep nesting)."""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_NODES = 50_000

Path = tuple[object, ...]

# libyaml's safe loader when the wheel has it (5–10x faster); both keep line marks.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def shown(value: object, limit: int = 60) -> str:
    """``repr`` of a user's value, cut short: an error must not echo ten kilobytes back."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 4] + "...'"


class SourceError(ValueError):
    """The text is not YAML corral will read; carries the line when known."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.message = message
        self.line = line


@dataclass
class Document:
    index: int  # 0-based position in the file
    data: object
    line: int  # first line of the document
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Path) -> int:
        """The line of ``path`` or of its nearest written ancestor."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.line


def load_documents(text: str) -> list[Document]:
    if len(text.encode("utf-8", errors="replace")) > MAX_BYTES:
        raise SourceError(f"the file is larger than {MAX_BYTES // 1024} KiB")
    loader = _Loader(text)
    docs: list[Document] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            lines: dict[Path, int] = {}
            _walk(node, (), lines, 0, [0])
            data = loader.construct_document(node)
            docs.append(Document(len(docs), data, node.start_mark.line + 1, lines))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at_end = exc.problem_mark is not None and exc.problem_mark.line >= text.rstrip("\n").count("\n") + 1
        if exc.context_mark is not None and at_end:
            mark = exc.context_mark  # an unclosed bracket at the end: point where it opened
        line = mark.line + 1 if mark else None
        problem = str(exc.problem or exc.context)
        if "nesting depth" in problem:  # libyaml (PyYAML >= 6.0.4) stops far past our own limit
            raise SourceError(f"the document nests deeper than {MAX_DEPTH} levels", line) from None
        raise SourceError(f"invalid YAML: {problem}", line) from None
    except yaml.YAMLError as exc:
        raise SourceError(f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    return docs


def _walk(node: yaml.Node, path: Path, lines: dict[Path, int], depth: int, count: list[int]) -> None:
    count[0] += 1
    if count[0] > MAX_NODES:
        raise SourceError(f"the document has more than {MAX_NODES} YAML nodes (alias expansion?)",
                          node.start_mark.line + 1)
    if depth > MAX_DEPTH:
        raise SourceError(f"the document nests deeper than {MAX_DEPTH} levels", node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[object, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            line = key_node.start_mark.line + 1
            if isinstance(key_node, yaml.ScalarNode) and key != "<<":
                if key in seen:  # YAML would keep the last one silently
                    shown = key if len(key) <= 60 else key[:57] + "..."
                    raise SourceError(f"duplicate key {shown!r}: on line {seen[key]} and again on line {line}", line)
                seen[key] = line
            lines.setdefault(path + (key,), line)
            _walk(value_node, path + (key,), lines, depth + 1, count)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.setdefault(path + (i,), item.start_mark.line + 1)
            _walk(item, path + (i,), lines, depth + 1, count)
