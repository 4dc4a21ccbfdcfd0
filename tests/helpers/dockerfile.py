"""The Dockerfile read as stages."""

from __future__ import annotations

import re


def stages(text: str) -> dict[str, str]:
    """target name -> its instructions, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    out, name = {}, None
    for line in joined.splitlines():
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line.strip(), re.I)
        if m:
            name = m.group(1)
            out[name] = ""
        elif name:
            out[name] += line + "\n"
    return out
