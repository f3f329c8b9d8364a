"""Write --jobs job files (job-N.json: two numbers) into --spool, then `ready`; then run until stopped."""

import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--spool", required=True)
parser.add_argument("--jobs", type=int, required=True)
args = parser.parse_args()
time.sleep(1)  # a slow start: the workers are already running and must wait for `ready`
for number in range(args.jobs):
    path = os.path.join(args.spool, f"job-{number}.json")
    with open(path + ".tmp", "w") as out:
        json.dump({"a": number, "b": number * 10}, out)
    os.replace(path + ".tmp", path)
open(os.path.join(args.spool, "ready"), "w").close()
print(f"feeder: {args.jobs} jobs written", flush=True)
while True:
    time.sleep(60)
