"""A worker: takes job numbers from Redis until there are none left, writes each result to /work/item-NNNN.out
(the named volume, where the Compose file mounts it), and records it in Redis."""

import os
from pathlib import Path
from urllib.parse import urlsplit

import redis

url = urlsplit(os.environ["REDIS_URL"])
client = redis.Redis(host=url.hostname, port=url.port, db=int(url.path.strip("/") or 0))
items = int(os.environ["ITEMS"])
done = 0
while (number := client.incr("next")) <= items:
    Path(f"/work/item-{number:04d}.out").write_text(f"{number * number}\n")
    client.sadd("done", number)
    done += 1
print(f"worker: {done} jobs done", flush=True)
