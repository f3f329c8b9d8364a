"""The check: every job answered once, correctly, read back from the service the settings file names; and each name
of the settings file resolved to where the service is."""
import glob
import hashlib
import json
import os
import socket
import sys
import urllib.request
from urllib.parse import urlsplit

from settings import url

settings, jobs_file, out = sys.argv[1:4]
names = {key: urlsplit(url(settings, key)).hostname for key in ("health", "queue", "answers")}
resolved = {name: socket.gethostbyname(name) for name in names.values()}
with open(jobs_file) as handle:
    jobs = json.load(handle)
with urllib.request.urlopen(url(settings, "answers") + "/kv", timeout=30) as response:
    answers = json.load(response)
done = []
for path in glob.glob(os.path.join(out, "*.json")):
    with open(path) as handle:
        done += json.load(handle)
problems = []
if sorted(done) != sorted(job["id"] for job in jobs):
    problems.append(f"jobs done {sorted(done)} are not each job exactly once")
problems += [f"job {job['id']}: wrong or missing answer" for job in jobs
             if answers.get(job["id"], {}).get("answer") != hashlib.sha256(job["text"].encode()).hexdigest()]
if problems:
    sys.exit("check failed: " + "; ".join(problems))
print(f"check: {len(jobs)} jobs answered; names resolved: "
      + ", ".join(f"{name} -> {address}" for name, address in sorted(resolved.items())), flush=True)
