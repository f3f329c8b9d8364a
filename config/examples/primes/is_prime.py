#!/usr/bin/env python3
"""One task of the primes example: payload {"n": N} on stdin, "prime" or "composite" on stdout."""
import json
import sys

n = json.load(sys.stdin)["n"]
if not isinstance(n, int) or n < 2:
    sys.exit(f"n must be an integer of at least 2, not {n!r}")  # stderr, exit 1: the task fails
prime = all(n % d for d in range(2, int(n**0.5) + 1))
sys.stdout.write("prime" if prime else "composite")  # no newline: stdout is kept byte for byte
