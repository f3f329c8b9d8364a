#!/usr/bin/env python3
"""Correctness check of the word-count example (verify.command).

Independently recounts every chunk of $ALLOCSTACK_TASKS in one pass and compares
the total with the sum of the workers' outputs in $ALLOCSTACK_RESULTS. Exit 0 when
they agree; otherwise one line naming the first word whose count differs.
"""

import json
import os
import re
import sys
from collections import Counter

WORD = re.compile(r"[a-z']+")


def main() -> int:
    with open(os.environ["ALLOCSTACK_TASKS"], encoding="utf-8") as handle:
        tasks = json.load(handle)["tasks"]
    with open(os.environ["ALLOCSTACK_RESULTS"], encoding="utf-8") as handle:
        results = json.load(handle)["results"]
    truth = Counter(word for task in tasks for word in WORD.findall(task["payload"]["text"].lower()))
    claimed: Counter = Counter()
    for result in results:
        claimed.update(json.loads(result["output"])["counts"])
    if claimed != truth:
        word = next(w for w in sorted(set(truth) | set(claimed)) if truth[w] != claimed[w])
        print(f"count of {word!r} is {claimed[word]}, recount says {truth[word]}", file=sys.stderr)
        return 1
    print(f"{sum(truth.values())} words in {len(tasks)} chunks agree", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
