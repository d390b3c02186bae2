"""The controller's artifact store: a directory served to the hosts over HTTP.

Hosts never reach the internet: the controller stages what they install (apt repository,
wheelhouse, model files, tools) under one directory, and `pdctl store serve` publishes it.
Byte ranges are supported so interrupted downloads resume instead of starting over.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import os
import re
import sys

# apt: the signed repository; wheels: the wheelhouse and its locks; locks: the locks clearsigned
# (what hosts read); hub: the model's pinned revision in the Hub's API layout; models, tools.
LAYOUT = ("apt", "wheels", "locks", "hub", "models", "tools")


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files with single-range GET (RFC 9110 `bytes=START-[END]`)."""

    def send_head(self):
        self._range = None
        header = self.headers.get("Range")
        path = self.translate_path(self.path)
        if not header or not os.path.isfile(path):
            return super().send_head()
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", header.strip())
        size = os.path.getsize(path)
        if not m or int(m.group(1)) >= size:
            self.send_error(416, "Requested Range Not Satisfiable")
            return None
        start = int(m.group(1))
        end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
        f = open(path, "rb")  # noqa: SIM115 - closed by copyfile's caller
        f.seek(start)
        self._range = end - start + 1
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        self.send_header("Content-Length", str(self._range))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return f

    def copyfile(self, source, outputfile):
        remaining = getattr(self, "_range", None)
        if remaining is None:
            return super().copyfile(source, outputfile)
        while remaining > 0:
            chunk = source.read(min(1 << 20, remaining))
            if not chunk:
                break
            outputfile.write(chunk)
            remaining -= len(chunk)

    def log_message(self, format, *args):  # noqa: A002 - signature from the base class
        sys.stderr.write("%s %s\n" % (self.address_string(), format % args))


def serve(directory: str, bind: str, port: int):
    for sub in LAYOUT:
        os.makedirs(os.path.join(directory, sub), exist_ok=True)
    handler = functools.partial(_Handler, directory=directory)
    server = http.server.ThreadingHTTPServer((bind, port), handler)
    print("serving %s on http://%s:%d/" % (directory, bind, port), flush=True)
    server.serve_forever()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m pdctl.store", description=__doc__)
    p.add_argument("--dir", required=True)
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8780)
    args = p.parse_args(argv)
    serve(args.dir, args.bind, args.port)


if __name__ == "__main__":
    main()
