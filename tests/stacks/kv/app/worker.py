"""Pull jobs from the key-value service until the queue is empty; store each answer there, and note it in OUT_DIR.

The service's URL is KV_URL, or (tests/stacks/names, as an application keeps it) the ``queue`` URL of the
settings file named as the first argument."""
import configparser
import hashlib
import json
import os
import socket
import sys
import urllib.request


def kv_url():
    if len(sys.argv) < 2:
        return os.environ["KV_URL"]
    settings = configparser.ConfigParser()
    settings.read(sys.argv[1])
    return settings["kv"]["queue"]


KV = kv_url()
me = f"{socket.gethostname()}-{os.getpid()}"


def call(method, path, body=None):
    request = urllib.request.Request(KV + path, method=method, data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


done = []
while (job := call("POST", "/queue/jobs/pop")["item"]) is not None:
    answer = hashlib.sha256(job["text"].encode()).hexdigest()
    call("PUT", f"/kv/{job['id']}", {"answer": answer, "worker": me})
    done.append(job["id"])
with open(os.path.join(os.environ["OUT_DIR"], f"{me}.json"), "w") as out:
    json.dump(done, out)
print(f"worker: {len(done)} jobs through {KV}", flush=True)
