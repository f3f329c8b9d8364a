"""Read a URL of the stack's settings file; run as `settings.py FILE KEY`, it is the health check: GET that URL."""
import configparser
import sys
import urllib.request


def url(path, key):
    settings = configparser.ConfigParser()
    settings.read(path)
    return settings["kv"][key]


if __name__ == "__main__":
    with urllib.request.urlopen(url(sys.argv[1], sys.argv[2]), timeout=2) as response:
        sys.exit(0 if response.status == 200 else 1)
