"""A fake HAProxy 2.6 runtime API on a real UNIX socket, for frontdoor_server's tests.

Its answers are built from real captures (tests/fixtures/haproxy: the full 2.6 `show stat` header and
rows, `show servers state`) and it keeps HAProxy's model of a server: admin bits (srv_admin_state) set
by `set server B/S state ready|drain|maint`, and a health status that the test scripts; a P/D router's
check-only backend (be_check_SERVER, its server `router`) keeps the check address that
`set server be_check_SERVER/router check-addr A port P` sets. Like HAProxy
in non-interactive mode it reads one command, answers it and closes the connection."""
from __future__ import annotations

import os
import shutil
import socketserver
import tempfile
import threading
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "haproxy"
SHOW_STAT = (FIXTURES / "show-stat.txt").read_text()
SHOW_SERVERS_STATE = (FIXTURES / "show-servers-state.txt").read_text()

STAT_HEADER = SHOW_STAT.splitlines()[0]
STAT_COLUMNS = STAT_HEADER[2:].split(",")
_STAT_ROWS = {line.split(",")[1]: line.split(",") for line in SHOW_STAT.splitlines()[1:] if line}
STATE_HEADER = SHOW_SERVERS_STATE.splitlines()[1]
STATE_COLUMNS = STATE_HEADER[2:].split()
_STATE_ROW = SHOW_SERVERS_STATE.splitlines()[2].split()   # lab-decode-0, ready and UP

FMAINT, CMAINT, FDRAIN = 0x01, 0x04, 0x08
MAINT_BITS, DRAIN_BITS = 0x23, 0x18


def _fields(template, columns, **values):
    fields = list(template)
    for name, value in values.items():
        fields[columns.index(name)] = str(value)
    return fields


class Server:
    def __init__(self, sid, admin, health):
        self.sid = sid
        self.admin = admin
        self.health = list(health)   # one status per `show stat`, the last one stays
        self.scur = [0]              # sessions, likewise

    @staticmethod
    def _next(seq):
        return seq.pop(0) if len(seq) > 1 else seq[0]

    def read(self):
        """(status, scur) as one `show stat` shows them, moving the scripted sequences on."""
        scur = self._next(self.scur)
        if self.admin & MAINT_BITS:
            return "MAINT", scur
        health = self._next(self.health)
        if self.admin & DRAIN_BITS and health.startswith("UP"):
            return "DRAIN", scur
        return health, scur


class FakeHAProxy:
    def __init__(self, path, backend="be_routers", level="admin"):
        self.path = path
        self.backend = backend
        self.level = level
        self.servers = {}
        self.checks = {}   # P/D router -> [check address, check port] of be_check_<router>/router
        self.commands = []
        # What a server's checks read after it leaves maintenance, one per `show stat` (the last stays).
        self.rejoin = ["DOWN", "DOWN", "UP"]
        self._lock = threading.Lock()
        self._server = None

    def add(self, name, admin=0, health=("UP",)):
        self.servers[name] = Server(len(self.servers) + 1, admin, health)
        return self.servers[name]

    @property
    def sets(self):
        return [c for c in self.commands if c.startswith("set ")]

    @property
    def stat_reads(self):
        return self.commands.count("show stat")

    # ------------------------------------------------------------ the runtime API

    def answer(self, command):
        with self._lock:
            self.commands.append(command)
            words = command.split()
            if command == "show stat":
                return self._show_stat()
            if words[:3] == ["show", "servers", "state"] and len(words) > 3 and words[3].startswith("be_check_"):
                return self._show_check_state(words[3][len("be_check_"):])
            if words[:2] == ["set", "server"] and len(words) == 7 and words[3:6:2] == ["check-addr", "port"]:
                return self._set_check_addr(words[2], words[4], words[6])
            if words[:3] == ["show", "servers", "state"]:
                if len(words) > 3 and words[3] != self.backend:
                    return "Can't find backend.\n\n"
                return self._show_servers_state()
            if words[:2] == ["set", "server"] and len(words) == 5 and words[3] == "state":
                return self._set_state(words[2], words[4])
            return "Unknown command: '%s'\n\n" % words[0] if words else "\n"

    def _show_stat(self):
        rows = [STAT_HEADER, ",".join(_STAT_ROWS["FRONTEND"])]
        total, usable = 0, 0
        for name, srv in self.servers.items():
            status, scur = srv.read()
            total += scur
            usable += status.startswith("UP")
            rows.append(",".join(_fields(_STAT_ROWS["lab-decode-0"], STAT_COLUMNS, pxname=self.backend,
                                         svname=name, status=status, scur=scur, sid=srv.sid)))
        rows.append(",".join(_fields(_STAT_ROWS["BACKEND"], STAT_COLUMNS, pxname=self.backend, scur=total,
                                     status="UP" if usable else "DOWN")))
        return "\n".join(rows) + "\n\n"

    def _show_servers_state(self):
        lines = ["1", STATE_HEADER]
        for name, srv in self.servers.items():
            running = not srv.admin & MAINT_BITS and srv.health[0].startswith("UP")
            lines.append(" ".join(_fields(_STATE_ROW, STATE_COLUMNS, be_name=self.backend, srv_id=srv.sid,
                                          srv_name=name, srv_op_state=2 if running else 0,
                                          srv_admin_state=srv.admin)))
        return "\n".join(lines) + "\n\n"

    def _show_check_state(self, router):
        if router not in self.checks:
            return "Can't find backend.\n\n"
        addr, port = self.checks[router]
        row = _fields(_STATE_ROW, STATE_COLUMNS, be_name="be_check_" + router, srv_id=1, srv_name="router",
                      srv_check_addr=addr, srv_check_port=port)
        return "\n".join(["1", STATE_HEADER, " ".join(row)]) + "\n\n"

    def _set_check_addr(self, target, addr, port):
        if self.level != "admin":
            return "Permission denied\n\n"
        backend, _, name = target.partition("/")
        if not backend.startswith("be_check_") or backend[len("be_check_"):] not in self.checks:
            return "No such backend.\n\n"
        if name != "router":
            return "No such server.\n\n"
        self.checks[backend[len("be_check_"):]] = [addr, int(port)]
        return "\n"

    def _set_state(self, target, state):
        if self.level != "admin":
            return "Permission denied\n\n"
        backend, _, name = target.partition("/")
        if backend != self.backend:
            return "No such backend.\n\n"
        if name not in self.servers:
            return "No such server.\n\n"
        if state not in ("ready", "drain", "maint"):
            return "'set server <srv> state' expects 'ready', 'drain' and 'maint'.\n\n"
        srv = self.servers[name]
        was_maint = srv.admin & MAINT_BITS
        if state == "maint":
            srv.admin = (srv.admin | FMAINT) & ~FDRAIN
        else:
            srv.admin = (srv.admin | FDRAIN if state == "drain" else srv.admin & ~FDRAIN) & ~FMAINT
            if was_maint:
                srv.health = list(self.rejoin)
        return "\n"

    # ------------------------------------------------------------ the socket

    def start(self):
        fake = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                command = self.rfile.readline().decode().strip()
                self.wfile.write(fake.answer(command).encode())

        self._server = socketserver.ThreadingUnixStreamServer(self.path, Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self):
        if self._server:
            self._server.shutdown()
            self._server.server_close()


def short_socket_dir():
    """A directory for a UNIX socket whose path fits sun_path (108 bytes): pytest's tmp_path may not."""
    return tempfile.mkdtemp(prefix="hap", dir="/tmp")


def front_door(level="admin"):
    """The front door of the captures: lab-decode-0 ready and UP, lab-decode-0-standby configured
    `disabled` (FMAINT + CMAINT), lab-decode-1 ready and UP. Returns (fake, cleanup)."""
    directory = short_socket_dir()
    fake = FakeHAProxy(os.path.join(directory, "admin.sock"), level=level)
    fake.add("lab-decode-0")
    fake.add("lab-decode-0-standby", admin=FMAINT | CMAINT, health=("DOWN",))
    fake.checks["lab-decode-0"] = ["10.89.64.13", 8100]   # its check asks the plan's decode
    fake.add("lab-decode-1")
    fake.start()

    def cleanup():
        fake.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return fake, cleanup
