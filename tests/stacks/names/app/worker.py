"""Pull jobs from the queue named in the settings file until it is empty; store each answer, note it in OUT_DIR."""
import hashlib
import json
import os
import socket
import sys
import urllib.request

from settings import url

KV = url(sys.argv[1], "queue")
me = f"{socket.gethostname()}-{os.getpid()}"


def call(method, path, body=None):
    request = urllib.request.Request(KV + path, method=method, data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


done = []
while (job := call("POST", "/queue/jobs/pop")["item"]) is not None:
    call("PUT", f"/kv/{job['id']}", {"answer": hashlib.sha256(job["text"].encode()).hexdigest(), "worker": me})
    done.append(job["id"])
with open(os.path.join(os.environ["OUT_DIR"], f"{me}.json"), "w") as out:
    json.dump(done, out)
print(f"worker: {len(done)} jobs through {KV}", flush=True)
