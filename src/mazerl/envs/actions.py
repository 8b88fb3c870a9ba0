"""Turn a model's reply into a maze action.

The reply must end with `<action>ACTION</action>`, ACTION one of right/up/left/down/stop; the last
match counts, case-insensitively. VisGym's tuple form is accepted as well: `('move', 0..3)` (0 right,
1 up, 2 left, 3 down) and `('stop', 'stop')`. Anything else is a parse failure.
"""

from __future__ import annotations

import re

from ..mazes.layout import MOVE_NAMES

ACTIONS: tuple[str, ...] = (*MOVE_NAMES, "stop")
ACTION_FORMAT_HELP = (
    "Invalid action. End your reply with <action>ACTION</action>, where ACTION is one of: "
    + ", ".join(ACTIONS)
    + "."
)

_TAG = re.compile(r"<action>\s*([a-z]+)\s*</action>", re.IGNORECASE)
_LAST_TAG = re.compile(r"<action>\s*([a-z]+)\s*</action>$", re.IGNORECASE)
_TUPLE = re.compile(r"""\(\s*['"](move|stop)['"]\s*,\s*(?:(\d+)|['"]stop['"])\s*\)""", re.IGNORECASE)
# Replies longer than this are only searched near their end: the action must end the reply, and
# a 10k-character reply must not cost a 10k-character regex scan per turn for no reason.
_TAIL_CHARS = 2048


def parse_action(reply: object) -> str | None:
    """The action named by `reply`, or None when it names no valid action."""
    if isinstance(reply, tuple) and len(reply) == 2:
        reply = repr(reply)
    if not isinstance(reply, str) or not reply:
        return None
    text = reply[-_TAIL_CHARS:]
    if "(" not in text:  # fast path: tags only (the common case in a rollout)
        end = text.lower().rfind("</action>")
        if end < 0:
            return None
        m = _LAST_TAG.search(text, 0, end + len("</action>"))
        if m is None:
            return None
        word = m.group(1).lower()
        return word if word in ACTIONS else None
    last: tuple[int, str | None] | None = None
    for m in _TAG.finditer(text):
        word = m.group(1).lower()
        last = (m.start(), word if word in ACTIONS else None)
    for m in _TUPLE.finditer(text):
        if last is not None and m.start() < last[0]:
            continue
        kind = m.group(1).lower()
        if kind == "stop":
            last = (m.start(), "stop" if m.group(2) is None else None)
        else:
            idx = m.group(2)
            last = (m.start(), MOVE_NAMES[int(idx)] if idx is not None and int(idx) < 4 else None)
    return None if last is None else last[1]
