#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the seed corpus of fuzz_response: server byte sequences that follow
the server SETTINGS the target feeds itself, answering the Range call on
stream 1 and the Watch stream on stream 3. HPACK uses literal fields without
indexing or Huffman coding, so no library is needed. Run from anywhere:
  test/fuzz/gen_corpus.py   (writes test/fuzz/corpus/*)
"""
import os
import struct

DATA, HEADERS, RST, SETTINGS, PING, GOAWAY, WINUP = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


def hpack(headers):
    out = b""
    for name, value in headers:
        n, v = name.encode(), value.encode()
        out += b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v
    return out


def grpc(msg):
    return b"\x00" + struct.pack(">I", len(msg)) + msg


RESP = [(":status", "200"), ("content-type", "application/grpc")]
OK = [("grpc-status", "0")]
# RangeResponse{header{revision 5}, kvs[{key "k", value "v"}], count 1}
RANGE = bytes.fromhex("0a021805") + bytes.fromhex("12060a016b2a0176") + bytes.fromhex("2001")
# WatchResponse{header{revision 5}, watch_id 7, created true}
WATCH_CREATED = bytes.fromhex("0a021805") + bytes.fromhex("1007") + bytes.fromhex("1801")
# WatchResponse{watch_id 7, events[{type PUT, kv{key "k", value "v"}}]}
ev_kv = b"\x0a\x01k\x2a\x01v"
ev = b"\x12" + bytes([len(ev_kv)]) + ev_kv
WATCH_EVENT = b"\x10\x07" + b"\x5a" + bytes([len(ev)]) + ev

settings_ack = frame(SETTINGS, ACK, 0)
seeds = {
    "range_ok": settings_ack
    + frame(HEADERS, END_HEADERS, 1, hpack(RESP))
    + frame(DATA, 0, 1, grpc(RANGE))
    + frame(HEADERS, END_HEADERS | END_STREAM, 1, hpack(OK)),
    "range_trailers_only_error": settings_ack
    + frame(HEADERS, END_HEADERS | END_STREAM, 1,
            hpack(RESP + [("grpc-status", "14"), ("grpc-message", "etcdserver: no leader")])),
    "range_split_message": settings_ack
    + frame(HEADERS, END_HEADERS, 1, hpack(RESP))
    + frame(DATA, 0, 1, grpc(RANGE)[:3])
    + frame(DATA, 0, 1, grpc(RANGE)[3:])
    + frame(HEADERS, END_HEADERS | END_STREAM, 1, hpack(OK)),
    "watch_created_event": settings_ack
    + frame(HEADERS, END_HEADERS, 3, hpack(RESP))
    + frame(DATA, 0, 3, grpc(WATCH_CREATED))
    + frame(DATA, 0, 3, grpc(WATCH_EVENT))
    + frame(PING, 0, 0, b"12345678")
    + frame(WINUP, 0, 0, struct.pack(">I", 1 << 20)),
    "rst_refused": settings_ack + frame(RST, 0, 1, struct.pack(">I", 7))
    + frame(RST, 0, 3, struct.pack(">I", 8)),
    "goaway": settings_ack + frame(GOAWAY, 0, 0, struct.pack(">II", 1, 11) + b"too_many_pings"),
    "oversized_prefix": settings_ack
    + frame(HEADERS, END_HEADERS, 1, hpack(RESP))
    + frame(DATA, 0, 1, b"\x00\x7f\xff\xff\xff"),
    "garbage_protobuf": settings_ack
    + frame(HEADERS, END_HEADERS, 1, hpack(RESP))
    + frame(DATA, 0, 1, grpc(b"\xff\xff\xff"))
    + frame(HEADERS, END_HEADERS | END_STREAM, 1, hpack(OK)),
}

outdir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
os.makedirs(outdir, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(outdir, name), "wb") as f:
        f.write(data)
