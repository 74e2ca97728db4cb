'use strict';
// Unit tests for the unified-format matcher (no server needed):
//   node --test tests/conformance/test/
const test = require('node:test');
const assert = require('node:assert');
const { Long, Binary, ObjectId } = require('mongodb');
const { match, exactMatch } = require('../lib/match');

const ents = {
  get: (id) => ({ saved: { a: 1 } }[id]),
  getSessionLsid: (id) => ({ s0: { id: new Binary(Buffer.alloc(16, 1), 4) } }[id]),
};
const ok = (e, a, root = true) => assert.doesNotThrow(() => match(e, a, { entities: ents }, '', root));
const bad = (e, a, root = true) => assert.throws(() => match(e, a, { entities: ents }, '', root), /./);

test('root documents allow extra fields, nested ones do not', () => {
  ok({ x: 1 }, { x: 1, y: 2 });
  bad({ x: 1, y: 1 }, { x: 1 });
  bad({ x: { y: 1 } }, { x: { y: 1, z: 1 } });
  bad({ x: 1 }, { x: 1, y: 2 }, false);
});

test('arrays need the same length and order', () => {
  ok([1, 2], [1, 2]);
  bad([1, 2], [1, 2, 3]);
  bad([1, 2], [2, 1]);
  bad([{ x: 1 }], [{ x: 1, y: 1 }]);
});

test('flexible numerics', () => {
  ok({ n: 1 }, { n: Long.fromNumber(1) });
  ok({ n: Long.fromNumber(3) }, { n: 3 });
  bad({ n: 1 }, { n: 1.5 });
  bad({ n: 1 }, { n: '1' });
});

test('$$exists, $$unsetOrMatches, $$type, $$lte', () => {
  ok({ a: { $$exists: false } }, { b: 1 });
  bad({ a: { $$exists: false } }, { a: null });
  ok({ a: { $$exists: true } }, { a: null });
  bad({ a: { $$exists: true } }, {});
  ok({ a: { $$unsetOrMatches: 2 } }, {});
  ok({ a: { $$unsetOrMatches: 2 } }, { a: 2 });
  bad({ a: { $$unsetOrMatches: 2 } }, { a: 3 });
  ok({ $$unsetOrMatches: { x: 1 } }, undefined);
  ok({ a: { $$type: ['int', 'long'] } }, { a: Long.fromNumber(5) });
  ok({ a: { $$type: 'string' } }, { a: 'x' });
  bad({ a: { $$type: 'string' } }, { a: 1 });
  bad({ a: { $$type: 'string' } }, {});
  ok({ a: { $$type: 'double' } }, { a: 0.25 });
  ok({ a: { $$type: 'objectId' } }, { a: new ObjectId() });
  ok({ a: { $$lte: 5 } }, { a: 5 });
  bad({ a: { $$lte: 5 } }, { a: 6 });
});

test('$$sessionLsid, $$matchesEntity, $$matchAsDocument, $$matchAsRoot', () => {
  ok({ lsid: { $$sessionLsid: 's0' } }, { lsid: { id: new Binary(Buffer.alloc(16, 1), 4) } });
  bad({ lsid: { $$sessionLsid: 's0' } }, { lsid: { id: new Binary(Buffer.alloc(16, 2), 4) } });
  ok({ v: { $$matchesEntity: 'saved' } }, { v: { a: 1 } });
  ok({ j: { $$matchAsDocument: { a: 1 } } }, { j: '{"a": 1}' });
  bad({ j: { $$matchAsDocument: { a: 1 } } }, { j: '{"a": 1, "b": 2}' });
  ok({ j: { $$matchAsDocument: { $$matchAsRoot: { a: 1 } } } }, { j: '{"a": 1, "b": 2}' });
  ok({ x: { $$matchAsRoot: { a: 1 } } }, { x: { a: 1, b: 2 } });
});

test('outcome comparison is exact', () => {
  assert.doesNotThrow(() => exactMatch([{ _id: 1, x: 1 }], [{ x: 1, _id: 1 }]));
  assert.throws(() => exactMatch([{ _id: 1 }], [{ _id: 1, x: 1 }]));
  assert.throws(() => exactMatch([{ _id: 1, x: { a: 1 } }], [{ _id: 1, x: { a: 1, b: 2 } }]));
  assert.throws(() => exactMatch([{ _id: 1 }], []));
});
