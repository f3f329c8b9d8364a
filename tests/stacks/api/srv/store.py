"""A store: PUT/GET /items/KEY, GET /items (everything)."""
import argparse
import threading
from http.server import ThreadingHTTPServer

from jsonhttp import JSONHandler

parser = argparse.ArgumentParser()
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, required=True)
args = parser.parse_args()
lock, items = threading.Lock(), {}


class Handler(JSONHandler):
    def do_GET(self):
        with lock:
            if self.path == "/health":
                return self.reply(200, {"status": "ok"})
            if self.path == "/items":
                return self.reply(200, dict(items))
        return self.reply(404, {})

    def do_PUT(self):
        key = self.path.removeprefix("/items/")
        with lock:
            items[key] = self.body()
        self.reply(201, {})


ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
