#!/usr/bin/env python3
"""Worker program of the word-count example: one text chunk in (stdin JSON), its word counts out (stdout JSON).

Payload: ``{"text": "..."}``. Output: ``{"words": N, "counts": {"word": n, ...}}`` with
sorted keys, so the same chunk always gives the same bytes (and the same SHA-256).
"""

import json
import re
import sys
from collections import Counter

WORD = re.compile(r"[a-z']+")


def count(text: str) -> dict:
    words = WORD.findall(text.lower())
    return {"words": len(words), "counts": dict(sorted(Counter(words).items()))}


def main() -> int:
    payload = json.load(sys.stdin)
    if not isinstance(payload.get("text"), str):
        print("payload.text must be a string", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(count(payload["text"]), sort_keys=True, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
