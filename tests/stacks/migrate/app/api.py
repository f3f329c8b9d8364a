"""The API: notes that it started, refuses to serve without the schema the migration stores, then answers
GET /schema with it."""
import argparse
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--db", required=True)
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--started", required=True)
args = parser.parse_args()
with open(args.started, "w") as note:
    note.write("started\n")
try:
    SCHEMA = urllib.request.urlopen(f"{args.db}/schema", timeout=5).read()
except urllib.error.HTTPError as error:
    sys.exit(f"api: no schema in the database ({error.code}): the migration did not run")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(SCHEMA)))
        self.end_headers()
        self.wfile.write(SCHEMA)

    def log_message(self, *a):
        pass


ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
