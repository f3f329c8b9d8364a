"""The stack's own check: every job answered once, correctly, and every replica left its note in the shared volume."""
import argparse
import glob
import hashlib
import json
import os
import sys
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("--jobs", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--replicas", type=int, required=True)
args = parser.parse_args()


def read(path):
    with open(path) as handle:
        return json.load(handle)


jobs = read(args.jobs)
with urllib.request.urlopen(os.environ["KV_URL"] + "/kv", timeout=30) as response:
    answers = json.load(response)
notes = [read(path) for path in sorted(glob.glob(os.path.join(args.out, "*.json")))]
done = [job_id for note in notes for job_id in note]
problems = []
if len(notes) != args.replicas:
    problems.append(f"{len(notes)} worker notes in {args.out}, expected {args.replicas}")
if sorted(done) != sorted(job["id"] for job in jobs):
    problems.append(f"jobs done {sorted(done)} are not each job exactly once")
for job in jobs:
    want = hashlib.sha256(job["text"].encode()).hexdigest()
    if answers.get(job["id"], {}).get("answer") != want:
        problems.append(f"job {job['id']}: wrong or missing answer")
if problems:
    sys.exit("check failed: " + "; ".join(problems))
print(f"check: {len(jobs)} jobs answered by {len(notes)} workers, all correct")
