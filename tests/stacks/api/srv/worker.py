"""Take numbers from the API until there are none; answer each with the sum of its divisors."""
import json
import os
import socket
import urllib.request

API = os.environ["API_URL"]
me = f"{socket.gethostname()}-{os.getpid()}"


def post(path, body):
    request = urllib.request.Request(API + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.load(answer)


while (n := post("/next", {})["n"]) is not None:
    post("/answer", {"n": n, "value": sum(d for d in range(1, n + 1) if n % d == 0), "worker": me})
