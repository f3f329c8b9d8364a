"""Wait for the feeder's `ready` in --spool (at most 60 s), then answer every job N with N % replicas == index."""

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--spool", required=True)
args = parser.parse_args()
index, replicas = int(os.environ["ALLOCSTACK_REPLICA_INDEX"]), int(os.environ["ALLOCSTACK_WORKERS"])
deadline = time.monotonic() + 60
waited = 0
while not os.path.exists(os.path.join(args.spool, "ready")):
    if time.monotonic() > deadline:
        sys.exit("worker: the feeder wrote no jobs within 60 s")
    time.sleep(0.1)
    waited += 1
answered = 0
for name in sorted(os.listdir(args.spool)):
    if name.startswith("job-") and name.endswith(".json") and int(name[4:-5]) % replicas == index:
        with open(os.path.join(args.spool, name)) as job:
            numbers = json.load(job)
        with open(os.path.join(args.spool, f"answer-{name[4:-5]}.txt"), "w") as out:
            out.write(str(numbers["a"] + numbers["b"]))
        answered += 1
print(f"worker {index}: waited {waited * 0.1:.1f} s for the feeder, answered {answered} jobs", flush=True)
