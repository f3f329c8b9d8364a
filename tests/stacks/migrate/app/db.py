"""A tiny database: GET /schema answers the schema version a migration stored (404 before), PUT /schema stores it."""
import argparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STORE: dict[str, bytes] = {}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        value = STORE.get(self.path)
        self.send_response(200 if value is not None else 404)
        self.send_header("Content-Length", str(len(value or b"")))
        self.end_headers()
        self.wfile.write(value or b"")

    def do_PUT(self):
        STORE[self.path] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


parser = argparse.ArgumentParser()
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, required=True)
args = parser.parse_args()
ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
