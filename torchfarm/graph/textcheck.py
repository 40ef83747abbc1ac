"""Text in a graph's arguments, checked by where Inductor may write it.

Inductor writes some string arguments into the source it generates without escaping
them: an assert's message into a C++ string literal (`throw std::runtime_error("{msg}")`,
torch/_inductor/codegen/cpp.py), a fallback op's string argument into AOTInductor's C++
wrapper as `"{val}"` (cpp_wrapper_cpu.py `val_to_arg_str`). A torch op's schema says
only `str`. A graph whose text held a quote wrote C++ and assembly into a kernel the
worker compiled and signed, as a flex attention scale of text did (hopcheck.py). So the
farm takes text of two kinds, on both sides (graphcheck.py calls `check_node_texts`):

- a message (an assert's, or an argument of a custom op, which reaches no template):
  printable, without `"`, `\\` or `??`, so it stays inside any string literal it is
  written into;
- any other text (a mode, an einsum equation, a device, an attribute's name): letters,
  digits and ` _.,:+->`, which is no code wherever it is written.

The SDK's encoder makes a message one the farm takes (`as_message`), so an honest
assert's quotes never send its graph elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from torchfarm.graph.graph_errors import MalformedGraph
from torchfarm.v1 import graph_pb2

MAX_TEXT_CHARS = 256
"""Characters of a text argument that is no message: a mode, an equation, a name."""

MAX_MESSAGE_CHARS = 1024
"""Characters of a message: the farm's copy of an assert's; the SDK cuts longer ones."""

PLAIN = re.compile(r"[-A-Za-z0-9 _.,:+>]*\Z")
"""Text that is no message: no quote, bracket, brace, semicolon or line break."""

_OUT_OF_LITERAL = ('"', "\\", "??")
"""What could end a C string literal early, or (as a trigraph) make a backslash."""


MESSAGE_TAKERS = frozenset({"torch._C._autograd._saved_tensors_hooks_disable"})
"""Calls that take a message and are no assert: the error a saved-tensor hook's use
raises while `torch.func.grad` has them off (graphcheck.FUNCTORCH_GRAD)."""


def is_message(target: str) -> bool:
    """Whether `target`'s text arguments are messages: torch's asserts
    (`torch._assert_async`, `aten._assert_scalar`, ...) take one."""
    return target in MESSAGE_TAKERS or any("assert" in part for part in target.split(".")[-2:])


def check_text(text: str, where: str, *, message: bool) -> None:
    """Raises MalformedGraph unless `text` is a message (`message`) or plain text the
    farm takes."""
    if message:
        if len(text) > MAX_MESSAGE_CHARS or not text.isprintable() or any(s in text for s in _OUT_OF_LITERAL):
            raise MalformedGraph(
                f"{where}: a message is at most {MAX_MESSAGE_CHARS} printable characters without "
                f"'\"', '\\' or '??'"
            )
    elif len(text) > MAX_TEXT_CHARS or not PLAIN.match(text):
        raise MalformedGraph(
            f"{where}: a text argument is at most {MAX_TEXT_CHARS} letters, digits and ' _.,:+->', "
            f"not {text[:40]!r}"
        )


def check_node_texts(node: graph_pb2.Node, where: str, *, message: bool) -> None:
    """Checks every text in the node's arguments (dict keys included)."""
    for arg in [*node.args, *(kw.value for kw in node.kwargs)]:
        for text in texts(arg):
            check_text(text, where, message=message)


def as_message(text: str) -> str:
    """`text` (an assert's message) as one the farm takes: `"` and `\\` become `'` and
    `/`, what is unprintable a space, `??` `?`, and it is cut to MAX_MESSAGE_CHARS."""
    text = "".join(c if c.isprintable() else " " for c in text.replace('"', "'").replace("\\", "/"))
    while "??" in text:
        text = text.replace("??", "?")
    return text[:MAX_MESSAGE_CHARS]


def texts(arg: graph_pb2.Argument) -> Iterator[str]:
    """Every string in `arg`, dict keys included."""
    kind = arg.WhichOneof("kind")
    if kind == "str_value":
        yield arg.str_value
    elif kind in ("list", "tuple", "immutable_dict"):
        for item in getattr(arg, kind).items:
            yield from texts(item)
    elif kind == "slice":
        for part in (arg.slice.start, arg.slice.stop, arg.slice.step):
            yield from texts(part)
