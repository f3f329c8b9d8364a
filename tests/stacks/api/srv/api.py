"""The API: POST /next hands out 1..COUNT, POST /answer stores an answer in the store, GET /answers reads them back."""
import argparse
import json
import os
import threading
import urllib.request
from http.server import ThreadingHTTPServer

from jsonhttp import JSONHandler

parser = argparse.ArgumentParser()
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--count", type=int, required=True)
args = parser.parse_args()
STORE = os.environ["STORE_URL"]
lock, pending = threading.Lock(), list(range(1, args.count + 1))


def store(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(STORE + path, data=data, method=method), timeout=5) as answer:
        return json.load(answer)


class Handler(JSONHandler):
    def do_GET(self):
        if self.path == "/health":  # healthy only when the store answers too
            return self.reply(200, {"status": "ok", "store": store("GET", "/health")["status"]})
        if self.path == "/answers":
            return self.reply(200, store("GET", "/items"))
        return self.reply(404, {})

    def do_POST(self):
        body = self.body() or {}
        if self.path == "/next":
            with lock:
                return self.reply(200, {"n": pending.pop(0) if pending else None})
        if self.path == "/answer":
            store("PUT", f"/items/{body['n']}", {"value": body["value"], "worker": body["worker"]})
            return self.reply(201, {})
        return self.reply(404, {})


ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
