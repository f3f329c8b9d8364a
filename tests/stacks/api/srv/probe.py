"""Healthcheck: the URL answers 200 with {"status": "ok", "store": "ok"}."""
import json
import sys
import urllib.request

body = json.load(urllib.request.urlopen(sys.argv[1], timeout=2))
sys.exit(0 if body == {"status": "ok", "store": "ok"} else 1)
