"""The check: every job is recorded in Redis and its result is in /work, correct; it cannot write there (:ro)."""

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import redis

url = urlsplit(os.environ["REDIS_URL"])
client = redis.Redis(host=url.hostname, port=url.port, db=int(url.path.strip("/") or 0))
items = int(os.environ["ITEMS"])
recorded = {int(number) for number in client.smembers("done")}
if recorded != set(range(1, items + 1)):
    sys.exit(f"check: {len(recorded)} of {items} jobs recorded")
for number in recorded:
    if Path(f"/work/item-{number:04d}.out").read_text() != f"{number * number}\n":
        sys.exit(f"check: item {number} is wrong")
try:
    Path("/work/tampered").write_text("x")
except OSError:
    pass
else:
    sys.exit("check: /work is writable, though mounted :ro")
print(f"check: {items} jobs, each result in /work and correct", flush=True)
