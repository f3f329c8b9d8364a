"""A tiny key-value service with a queue: POST /queue/NAME appends, POST /queue/NAME/pop takes, PUT/GET /kv/KEY."""
import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--load", help="a JSON list of jobs for the queue 'jobs'")
args = parser.parse_args()
lock, queues, values = threading.Lock(), {"jobs": []}, {}
if args.load:
    with open(args.load) as jobs:
        queues["jobs"] = json.load(jobs)


class Handler(BaseHTTPRequestHandler):
    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        length = int(self.headers.get("Content-Length", 0))
        return json.loads(self.rfile.read(length)) if length else None

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, {"status": "ok"})
        if self.path == "/kv":
            with lock:
                return self.reply(200, dict(values))
        return self.reply(404, {"error": self.path})

    def do_POST(self):
        parts = self.path.strip("/").split("/")
        with lock:
            if parts[0] == "queue" and len(parts) == 3 and parts[2] == "pop":
                queue = queues.setdefault(parts[1], [])
                return self.reply(200, {"item": queue.pop(0) if queue else None})
            if parts[0] == "queue" and len(parts) == 2:
                queues.setdefault(parts[1], []).append(self.body())
                return self.reply(201, {})
        return self.reply(404, {"error": self.path})

    def do_PUT(self):
        parts = self.path.strip("/").split("/")
        if parts[0] == "kv" and len(parts) == 2:
            with lock:
                values[parts[1]] = self.body()
            return self.reply(201, {})
        return self.reply(404, {"error": self.path})

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    request_queue_size = 64  # the stdlib's 5 drops connections when replicas and probes arrive at once


Server((args.host, args.port), Handler).serve_forever()
