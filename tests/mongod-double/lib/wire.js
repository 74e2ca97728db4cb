'use strict';
// Wire codec: frames and parses OP_MSG, OP_QUERY (legacy hello only), OP_REPLY and
// OP_COMPRESSED (zlib, noop). It knows nothing about commands; it turns bytes into
// {requestID, opCode, body, flags, ...} and back, and throws WireError on anything malformed so
// the connection can be closed. snappy and zstd are not offered: Node 20 has neither built in.

const zlib = require('zlib');
const { BSON } = require('bson');
const { annotateOrder, forWire, RAW } = require('./values');

const OP_REPLY = 1;
const OP_QUERY = 2004;
const OP_COMPRESSED = 2012;
const OP_MSG = 2013;
const MAX_MESSAGE_SIZE = 48000000;
// A write command may exceed maxBsonObjectSize by 16 KiB (room for the command envelope).
const MAX_DOC_SIZE = 16 * 1024 * 1024 + 16 * 1024;

const FLAG_CHECKSUM = 1;
const FLAG_MORE_TO_COME = 2;
const FLAG_EXHAUST_ALLOWED = 1 << 16;
const KNOWN_REQUIRED_FLAGS = FLAG_CHECKSUM | FLAG_MORE_TO_COME;

// Stored documents must keep their exact numeric types, so never promote.
const DESERIALIZE_OPTIONS = { promoteValues: false, promoteBuffers: false, bsonRegExp: true, validation: { utf8: false } };

// Replies may approach maxMessageSizeBytes; bson's default scratch buffer is only 17 MiB.
BSON.setInternalBufferSize(MAX_MESSAGE_SIZE + 1024 * 1024);

class WireError extends Error {}

let CRC_TABLE = null;
function crc32c(buf, end) {
  if (!CRC_TABLE) {
    CRC_TABLE = new Int32Array(256);
    for (let i = 0; i < 256; i++) {
      let c = i;
      for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
      CRC_TABLE[i] = c;
    }
  }
  let crc = 0xffffffff;
  for (let i = 0; i < end; i++) crc = CRC_TABLE[(crc ^ buf[i]) & 0xff] ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

function readDoc(buf, off, limit) {
  if (off + 5 > limit) throw new WireError('truncated BSON document');
  const size = buf.readInt32LE(off);
  if (size < 5 || off + size > limit) throw new WireError(`bad BSON document size ${size}`);
  if (size > MAX_DOC_SIZE) throw new WireError(`BSON document too large: ${size}`);
  if (buf[off + size - 1] !== 0) throw new WireError('BSON document not terminated');
  let doc;
  try {
    const bytes = buf.subarray(off, off + size);
    doc = BSON.deserialize(bytes, DESERIALIZE_OPTIONS);
    annotateOrder(doc, bytes, 0); // keep "1", "2", ... where the client put them
    // Not enumerable: a copy of the object (Object.assign) is not the document received.
    Object.defineProperty(doc, RAW, { value: { bytes, off: 0 } });
  } catch (e) {
    throw new WireError(`invalid BSON: ${e.message}`);
  }
  return { doc, size };
}

function readCString(buf, off, limit) {
  const end = buf.indexOf(0, off);
  if (end < 0 || end >= limit) throw new WireError('unterminated cstring');
  return { str: buf.toString('utf8', off, end), next: end + 1 };
}

// Parses one complete message (buf holds exactly messageLength bytes).
function parseMessage(buf) {
  const requestID = buf.readInt32LE(4);
  const opCode = buf.readInt32LE(12);
  if (opCode === OP_COMPRESSED) {
    if (buf.length < 25) throw new WireError('short OP_COMPRESSED');
    const originalOpcode = buf.readInt32LE(16);
    const uncompressedSize = buf.readInt32LE(20);
    const compressorId = buf[24];
    if (uncompressedSize < 0 || uncompressedSize > MAX_MESSAGE_SIZE) throw new WireError('bad uncompressedSize');
    if (originalOpcode === OP_COMPRESSED) throw new WireError('nested OP_COMPRESSED');
    const payload = buf.subarray(25);
    let body;
    if (compressorId === 0) body = payload;
    else if (compressorId === 2) {
      try {
        body = zlib.inflateSync(payload, { maxOutputLength: uncompressedSize + 1 });
      } catch (e) {
        throw new WireError(`zlib: ${e.message}`);
      }
    } else throw new WireError(`unsupported compressor id ${compressorId}`);
    if (body.length !== uncompressedSize) throw new WireError('uncompressedSize mismatch');
    const inner = Buffer.alloc(16 + body.length);
    inner.writeInt32LE(inner.length, 0);
    buf.copy(inner, 4, 4, 12);
    inner.writeInt32LE(originalOpcode, 12);
    body.copy(inner, 16);
    const msg = parseMessage(inner);
    msg.compressorId = compressorId;
    return msg;
  }
  if (opCode === OP_MSG) return parseOpMsg(buf, requestID);
  if (opCode === OP_QUERY) return parseOpQuery(buf, requestID);
  throw new WireError(`unsupported opCode ${opCode}`);
}

function parseOpMsg(buf, requestID) {
  if (buf.length < 21) throw new WireError('short OP_MSG');
  const flags = buf.readUInt32LE(16);
  if (flags & 0xffff & ~KNOWN_REQUIRED_FLAGS) throw new WireError(`unknown required OP_MSG flag bits ${flags & 0xffff}`);
  let end = buf.length;
  if (flags & FLAG_CHECKSUM) {
    end -= 4;
    if (end < 21) throw new WireError('short OP_MSG with checksum');
    const want = buf.readUInt32LE(end);
    const got = crc32c(buf, end);
    if (want !== got) throw new WireError('OP_MSG checksum mismatch');
  }
  let off = 20;
  let body = null;
  const sequences = [];
  while (off < end) {
    const kind = buf[off++];
    if (kind === 0) {
      if (body) throw new WireError('more than one kind 0 section');
      const { doc, size } = readDoc(buf, off, end);
      body = doc;
      off += size;
    } else if (kind === 1) {
      if (off + 4 > end) throw new WireError('truncated kind 1 section');
      const size = buf.readInt32LE(off);
      const secEnd = off + size;
      if (size < 5 || secEnd > end) throw new WireError('bad kind 1 section size');
      const { str, next } = readCString(buf, off + 4, secEnd);
      let p = next;
      const docs = [];
      while (p < secEnd) {
        const r = readDoc(buf, p, secEnd);
        docs.push(r.doc);
        p += r.size;
      }
      sequences.push({ id: str, docs });
      off = secEnd;
    } else throw new WireError(`unknown OP_MSG section kind ${kind}`);
  }
  if (!body) throw new WireError('OP_MSG without body');
  for (const s of sequences) {
    if (sequences.filter((x) => x.id === s.id).length > 1) throw new WireError(`duplicate document sequence ${s.id}`);
    if (Object.prototype.hasOwnProperty.call(body, s.id)) throw new WireError(`document sequence ${s.id} duplicates a body field`);
    body[s.id] = s.docs;
  }
  return { requestID, opCode: OP_MSG, flags, body, moreToCome: !!(flags & FLAG_MORE_TO_COME), exhaustAllowed: !!(flags & FLAG_EXHAUST_ALLOWED) };
}

function parseOpQuery(buf, requestID) {
  if (buf.length < 20) throw new WireError('short OP_QUERY');
  const flags = buf.readInt32LE(16);
  const { str: ns, next } = readCString(buf, 20, buf.length);
  if (next + 8 > buf.length) throw new WireError('short OP_QUERY');
  const { doc } = readDoc(buf, next + 8, buf.length);
  // Drivers may wrap the command as {$query: {...}, $readPreference}.
  const body = doc.$query && typeof doc.$query === 'object' ? doc.$query : doc;
  return { requestID, opCode: OP_QUERY, flags, ns, body };
}

function header(len, requestID, responseTo, opCode) {
  const h = Buffer.alloc(16);
  h.writeInt32LE(len, 0);
  h.writeInt32LE(requestID, 4);
  h.writeInt32LE(responseTo, 8);
  h.writeInt32LE(opCode, 12);
  return h;
}

function buildOpMsg(doc, requestID, responseTo, flags = 0) {
  const bson = BSON.serialize(forWire(doc));
  const prefix = Buffer.alloc(5);
  prefix.writeUInt32LE(flags, 0);
  prefix[4] = 0;
  const body = Buffer.concat([prefix, bson]);
  return Buffer.concat([header(16 + body.length, requestID, responseTo, OP_MSG), body]);
}

function buildOpReply(doc, requestID, responseTo) {
  const bson = BSON.serialize(forWire(doc));
  const fixed = Buffer.alloc(20);
  fixed.writeInt32LE(8, 0); // AwaitCapable, as mongod sets it
  fixed.writeBigInt64LE(0n, 4);
  fixed.writeInt32LE(0, 12);
  fixed.writeInt32LE(1, 16);
  return Buffer.concat([header(36 + bson.length, requestID, responseTo, OP_REPLY), fixed, bson]);
}

// Wraps an already built message in OP_COMPRESSED.
function compress(msg, compressorId) {
  const originalOpcode = msg.readInt32LE(12);
  const body = msg.subarray(16);
  const data = compressorId === 2 ? zlib.deflateSync(body) : body;
  const meta = Buffer.alloc(9);
  meta.writeInt32LE(originalOpcode, 0);
  meta.writeInt32LE(body.length, 4);
  meta[8] = compressorId;
  const h = header(16 + 9 + data.length, msg.readInt32LE(4), msg.readInt32LE(8), OP_COMPRESSED);
  return Buffer.concat([h, meta, data]);
}

const COMPRESSORS = { noop: 0, zlib: 2 };

module.exports = {
  OP_REPLY, OP_QUERY, OP_COMPRESSED, OP_MSG, MAX_MESSAGE_SIZE, FLAG_MORE_TO_COME, FLAG_CHECKSUM,
  DESERIALIZE_OPTIONS, COMPRESSORS, WireError, crc32c, parseMessage, buildOpMsg, buildOpReply, compress,
};
