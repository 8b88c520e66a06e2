#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/seeds/<target>/ (run from anywhere).

Seeds are real examples: the dCache billing fixtures and CloudEvents of the gateway's own
unit tests (read from the Rust sources, so they stay in step), XRootD notify lines, an SSE
stream and inotify events, the trigger rules of functions/src/trigger.rs's docs, JWTs minted
with the `jwt` target's key (each failing one check) and with another key, macaroons minted
with the `macaroon` target's key (V1 and V2JSON, with dCache caveats), and attach-protocol
frames. Needs Python 3 with `cryptography` (Ed25519) for the JWTs.

The fuzzers grow these into fuzz/corpus/<target>/ (kept small with `cargo fuzz cmin`).
"""

import base64
import hashlib
import hmac
import json
import pathlib
import re
import struct

FUZZ = pathlib.Path(__file__).resolve().parent
MAIN = FUZZ.parent
SEEDS = FUZZ / "seeds"


def write(target, name, data):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def rust_raw_consts(path):
    """`const NAME: &str = r#"..."#;` constants of a Rust file."""
    text = (MAIN / path).read_text()
    return dict(re.findall(r'const (\w+): &str = r#"(.*?)"#;', text, re.S))


# --- event_decide: byte 0 = mode, byte 1 = policy bits, then the message -----------------------
ALL_TYPES = 0x3F
for name, body in rust_raw_consts("gateway/src/event/dcache.rs").items():
    write("event_decide", f"dcache-{name.lower()}", bytes([0, ALL_TYPES]) + body.encode())
write("event_decide", "dcache-transfer-default-policy",
      bytes([0, 0x01]) + rust_raw_consts("gateway/src/event/dcache.rs")["TRANSFER"].encode())
for name, body in rust_raw_consts("gateway/src/event/cloudevents.rs").items():
    write("event_decide", f"ce-structured-{name.lower()}", bytes([1, ALL_TYPES]) + body.encode())
    write("event_decide", f"ce-structured-ct-{name.lower()}", bytes([2, ALL_TYPES]) + body.encode())
binary = [
    ("ce-binary-generic", "ce-specversion: 1.0\nce-id: b-1\nce-source: //lab.example/daq\nce-type: org.example.daq.closed\n"
     "ce-subject: /data/raw/bin.dat\nce-time: 2026-03-14T10:15:30Z\ncontent-type: application/json\n\n"
     '{"kind":"write","size":5}'),
    ("ce-binary-opaque", "Ce-Specversion: 1.0\nCE-ID: b-2\nce-source: s\nce-type: t\nce-subject: /data/raw/x\n"
     "content-type: application/octet-stream\n\n\x00\x01 not json"),
    ("ce-binary-bridged", "ce-specversion: 1.0\nce-id: 9\nce-source: xrootd://h\nce-type: org.htfaas.storage.xrootd-notify.rm\n\n"
     '{"kind":"remove","msg_type":"rm","path":"/store/a"}'),
]
for name, text in binary:
    write("event_decide", name, bytes([3, ALL_TYPES]) + text.encode())
write("event_decide", "subject-other", bytes([4, ALL_TYPES]) + b"storage.cloudevents.\n{}")
write("event_decide", "subject-ce", bytes([4, ALL_TYPES]) + b"storage.cloudevents.a.b\n" +
      rust_raw_consts("gateway/src/event/cloudevents.rs")["GENERIC"].encode())

# --- bridge_lines: byte 0 = parser (0 xrootd, 1 SSE, 2 inotify) ---------------------------------
TID = "alice.1234:56@client.example.org"
for i, line in enumerate([
    f"{TID} closew /store/in/run17.dat 12",
    f"{TID} create 664 /store/a.dat",
    f"{TID} mv /store/tmp/a.part /store/a.dat",
    f"{TID} rm /store/a.dat",
    f"{TID}\tclosew\t/store/a.dat\r",
    "faasadmi.2:28@[::127.0.0.1] closew /store/a/b.txt 11",
    "unknown.9:29@[::127.0.0.1] create 664 /store/out/result.txt",
    f"{TID} trunc /store/a.dat",
    f"{TID} mkdir 755 /store/dir",
]):
    write("bridge_lines", f"xrootd-{i}", b"\x00" + line.encode())
sse = (
    "\ufeffid: 1\nevent: inotify\ndata: {\"event\":{\"name\":\"f.dat\",\"mask\":[\"IN_CLOSE_WRITE\"]},"
    "\"subscription\":\"https://frontend/api/v1/events/channels/c/subscriptions/inotify/L2RhdGE\"}\n\n"
    ": a comment\r\nid: 2\r\nevent: SYSTEM\r\ndata: {\"type\":\"NEW_SUBSCRIPTION\"}\r\n\r\n"
    "data: line one\rdata: line two\r\rid:\n\n"
)
write("bridge_lines", "sse-stream", b"\x01" + sse.encode())
for i, ev in enumerate([
    '{"name":"f.dat","mask":["IN_CLOSE_WRITE"],"cookie":"c1"}',
    '{"name":"sub","mask":["IN_CREATE","IN_ISDIR"]}',
    '{"name":"sub","mask":["IN_ISDIR","IN_MOVED_FROM"],"cookie":"9"}',
    '{"mask":["IN_Q_OVERFLOW"]}',
    '{"mask":["IN_IGNORED"]}',
    '{"name":"new.h5","mask":["IN_MOVED_TO"],"cookie":7}',
]):
    write("bridge_lines", f"inotify-{i}", b"\x02" + ev.encode())

# --- trigger_rule: the rule, then NUL and the event's shape -------------------------------------
RULES = [
    'path glob "/data/raw/**" and name suffix ".h5"',
    'path prefix "/data/run42/" and size >= 1MB and not name glob "*.tmp"',
    'kind in ["write", "restore"] and class == "exp:raw"',
    '(owner == "alice" or owner == "bob") and size in 1kB..10GiB',
    'source == "xrootd-notify" and type == "closew" and path suffix ".root"',
    'path glob "/data/raw/**" and (size in 1kB..2GiB or not name suffix ".tmp")',
    'kind in ["write", "restore"] and class glob "exp:*" and owner != "bob"',
    'owner == "C=\\"x\\\\y\\"" and NOT Size > 1kb',
    'not not owner == "alice" or size < 5MiB and size != 5000kB',
]
for i, rule in enumerate(RULES):
    write("trigger_rule", f"rule-{i}", rule.encode() + b"\x00" + bytes([0, 0, 7, 42]) + b"/data/raw/run42.h5")
    write("trigger_rule", f"rule-{i}-bare", rule.encode())


# --- jwt: tokens the verifiers must refuse ------------------------------------------------------
def b64u(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def jwt(seed, claims, kid="fuzz", alg="EdDSA"):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.from_private_bytes(seed)
    head = b64u(json.dumps({"typ": "JWT", "alg": alg, "kid": kid}, separators=(",", ":")).encode())
    body = b64u(json.dumps(claims, separators=(",", ":")).encode())
    sig = key.sign(f"{head}.{body}".encode())
    return f"{head}.{body}.{b64u(sig)}"


TRUSTED, OTHER = bytes([7] * 32), bytes([9] * 32)
FAR = 4102444800  # 2100-01-01
submit = {"iss": "htfaas-fuzz", "sub": "alice", "aud": "htfaas-scheduler", "exp": FAR, "iat": 1700000000,
          "jti": "j-1", "jobs": 1, "cpus": 1, "memory_mb": 512, "runtime_s": 60,
          "function": "sha256:" + "ab" * 32, "group": "g"}
attach = {"iss": "htfaas-fuzz", "sub": "site", "aud": "htfaas-scheduler/attach", "exp": FAR, "iat": 1700000000,
          "jti": "j-2", "annex": "gpu"}
api = {"iss": "htfaas-fuzz", "sub": "alice", "aud": "htfaas-api", "scope": "developer", "iat": 1700000000,
       "exp": FAR, "jti": "j-3"}
try:
    for name, claims in [("submit", submit), ("attach", attach), ("api", api)]:
        write("jwt", f"{name}-other-key", jwt(OTHER, claims))
        write("jwt", f"{name}-expired", jwt(TRUSTED, {**claims, "exp": 1700000100}))
        write("jwt", f"{name}-not-before-2100", jwt(TRUSTED, {**claims, "nbf": FAR}))
        write("jwt", f"{name}-wrong-issuer", jwt(TRUSTED, {**claims, "iss": "someone-else"}))
        write("jwt", f"{name}-wrong-audience", jwt(TRUSTED, {**claims, "aud": "htfaas-elsewhere"}))
    write("jwt", "unknown-kid", jwt(TRUSTED, {**submit, "exp": 1700000100}, kid="other"))
    write("jwt", "alg-none", jwt(TRUSTED, {**submit, "exp": 1700000100}, alg="none"))
    write("jwt", "alg-hs256", jwt(TRUSTED, {**submit, "exp": 1700000100}, alg="HS256"))
    write("jwt", "api-unknown-scope", jwt(TRUSTED, {**api, "scope": "root", "exp": 1700000100}))
except ImportError:
    print("no `cryptography` module: JWT seeds skipped")


# --- macaroon: minted with the target's key -----------------------------------------------------
def mac_key(secret):
    return hmac.new(b"macaroons-key-generator", secret, hashlib.sha256).digest()


def macaroon_v1(secret, location, ident, caveats):
    sig = hmac.new(mac_key(secret), ident.encode(), hashlib.sha256).digest()
    for c in caveats:
        sig = hmac.new(sig, c.encode(), hashlib.sha256).digest()

    def packet(k, v):
        body = k.encode() + b" " + v + b"\n"
        return b"%04x" % (len(body) + 4) + body

    raw = packet("location", location.encode()) + packet("identifier", ident.encode())
    raw += b"".join(packet("cid", c.encode()) for c in caveats) + packet("signature", sig)
    return raw, sig


KEY = b"htfaas-fuzz-macaroon-key"
CAVEATS = [
    [],
    ["activity:DOWNLOAD", "path:/data/raw"],
    ["iid:a1b2c3", "before:2100-01-01T00:00:00Z", "path:/data", "activity:DOWNLOAD,LIST", "ip:192.0.2.0/24",
     "max-upload:1048576"],
    ["activity:UPLOAD,DELETE", "path:/out/f/", "before:2026-01-01T00:00:00.000Z"],
]
for i, cav in enumerate(CAVEATS):
    raw, sig = macaroon_v1(KEY, "https://storage.example:2880", f"id-{i}", cav)
    write("macaroon", f"v1-{i}", base64.urlsafe_b64encode(raw).rstrip(b"="))
    write("macaroon", f"v1-std-padded-{i}", base64.standard_b64encode(raw))
    v2json = {"v": 2, "l": "https://storage.example:2880", "i": f"id-{i}",
              "c": [{"i": c} for c in cav], "s64": b64u(sig)}
    write("macaroon", f"v2json-{i}", json.dumps(v2json))
raw, _ = macaroon_v1(b"another key", "loc", "id-x", ["activity:DOWNLOAD"])
write("macaroon", "v1-other-key", base64.urlsafe_b64encode(raw).rstrip(b"="))


# V2 binary: version 2, then (type varint, length varint, bytes) fields, EOS = 0.
def v2_binary(secret, location, ident, caveats):
    _, sig = macaroon_v1(secret, location, ident, caveats)

    def field(t, v):
        return bytes([t, len(v)]) + v

    out = b"\x02" + field(1, location.encode()) + field(2, ident.encode()) + b"\x00"
    for c in caveats:
        out += field(2, c.encode()) + b"\x00"
    return out + b"\x00" + field(6, sig)


write("macaroon", "v2-binary", base64.urlsafe_b64encode(v2_binary(KEY, "loc", "id-v2", ["activity:DOWNLOAD"])))

# --- attach_protocol: byte 0 even = EP → scheduler, odd = scheduler → EP -------------------------
EP = [
    {"type": "hello", "name": "ep-1", "slots": {"cpus": 4, "memory_mb": 8192, "runtime_s": 3600}, "protocol": 1},
    {"type": "hello", "name": "ep-gpu", "slots": {"cpus": 64, "memory_mb": 262144, "runtime_s": 86400, "gpus": 2,
                                                  "disk_mb": 100000}, "protocol": 1, "annex": "gpu",
     "labels": {"site": "desy", "rack": "r17", "gpu": "A100"}},
    {"type": "hello", "name": "", "slots": {"cpus": 0, "memory_mb": 0, "runtime_s": 0}, "protocol": 2,
     "labels": {"": "\u0007"}},
    {"type": "finished", "job_id": "j-1", "outcome": {"kind": "exited", "exit_code": 0},
     "usage": {"wall_ms": 10, "cpu_ms": 5, "peak_memory_bytes": 65536, "bytes_in": 1, "bytes_out": 2,
               "instructions": 1000},
     "outputs": [{"path": "/out/f/a.txt", "size": 2, "sha256": "00" * 32}], "log": "ok\n"},
    {"type": "finished", "job_id": "j-2", "outcome": {"kind": "trapped", "message": "unreachable"},
     "usage": {"wall_ms": 0, "cpu_ms": 0, "peak_memory_bytes": 0, "bytes_in": 0, "bytes_out": 0},
     "outputs": [], "log": ""},
    {"type": "draining"},
]
for i, m in enumerate(EP):
    write("attach_protocol", f"ep-{i}", b"\x00" + json.dumps(m).encode())
SCHED = [
    {"type": "welcome", "ep_id": "ep-1"},
    {"type": "cancel", "job_id": "j-1", "reason": "revoked"},
    {"type": "assign", "job_id": "j-1",
     "function": {"name": "f", "version": 1, "digest": "sha256:" + "ab" * 32, "module_url": "https://gw/modules/ab"},
     "resources": {"cpus": 1, "memory_mb": 256, "runtime_s": 60},
     "input": {"name": "run42.h5", "url": "https://storage/data/run42.h5", "macaroon": "MDAx"},
     "output": {"url": "https://storage/out/f/", "macaroon": "MDAy"},
     "args": ["--fast"], "env": [["RUST_LOG", "info"]]},
]
for i, m in enumerate(SCHED):
    write("attach_protocol", f"scheduler-{i}", b"\x01" + json.dumps(m).encode())

print("seeds written to", SEEDS)
