#!/usr/bin/env node
/* bpe_sp_golden.js - writes the reference data that tests/test_bpe_sp.c
 * checks text/bpe_sp.c against: small SentencePiece-style BPE tokenizers
 * (Llama 2, Mistral, TinyLlama: characters merged by rank, "▁" for the
 * space, byte fallback to <0xNN> tokens), the encodings Hugging Face's
 * library gives for a set of hard inputs, and its decodings.
 *
 * The reference is Hugging Face's `tokenizers` npm package (Node bindings
 * of the Rust library). It is not a dependency of kinfer and `make test`
 * never runs this script; regenerate by hand:
 *
 *   mkdir -p /tmp/tokgold && cd /tmp/tokgold && npm install tokenizers@0.23.2
 *   cd <repo> && NODE_PATH=/tmp/tokgold/node_modules node tests/golden/bpe_sp_golden.js
 *
 * The merges are learned by the library's own BPE trainer over a small
 * corpus (Metaspace words, so no merge crosses a "▁" boundary); the
 * vocabulary is laid out as Llama 2's is: <unk> <s> </s>, the 256 byte
 * tokens <0x00>..<0xFF>, the corpus's characters, then each merge's
 * product. Characters the corpus lacks (most CJK, emoji) fall back to
 * bytes. Three settings:
 *   legacy  Llama 2 / TinyLlama as first converted: normalizer
 *           Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer,
 *           merges as "a b" strings, fuse_unk, decoder Sequence[Replace
 *           ("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)].
 *   meta    the newer form: no normalizer, Metaspace (prepend_scheme
 *           "first", split false), merges as [a, b] pairs, same decoder.
 *   split   Metaspace (prepend_scheme "always", split true), ignore_merges,
 *           fuse_unk false, bytes 0xF0..0xF4 missing from the vocabulary
 *           (four-byte characters become <unk>), decoder Sequence
 *           [ByteFallback, Metaspace], an lstrip/rstrip added token.
 * Every setting adds <s> in front (TemplateProcessing; a pair is
 * <s> A <s> B with type ids 0 then 1).
 *
 * Output (tests/data/bpe_sp/, overwritten): tokenizer_<setting>.json and
 * golden.json {"reference", "cases": [{setting, text, pair|null, ids,
 * type_ids, decoded}], "decodes": [{setting, ids, text}]}.
 *
 * Deterministic: no clock, no unseeded randomness. */
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const tk = require('tokenizers');

const REF = 'tokenizers@' + require('tokenizers/package.json').version + ' (npm)';
const OUT = path.join(__dirname, '..', 'data', 'bpe_sp');
fs.mkdirSync(OUT, { recursive: true });
const TMP = fs.mkdtempSync(path.join(os.tmpdir(), 'bpespgold-'));
const SP = '\u2581';

/* ---- corpus and training ------------------------------------------------ */
const corpus = [
  'The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away!',
  'Hello, world! Hello world. hello WORLD? I\'m here, you\'re there, it\'s fine.',
  'Kafka and Redis move jobs; the worker encodes text into tokens and tokens into vectors.',
  'Café, naïve, résumé, façade, jalapeño, señor, crème brûlée, Ångström, Über, straße.',
  'Numbers: 0 1 2 3 12 123 1234 3.14159 1,000,000 2024-01-01 42% $5.00',
  'def encode(self, text):\n    return [self.vocab[t] for t in text.split()]\n',
  'for (int i = 0; i < n; i++) { sum += a[i] * b[i]; }  // dot product',
  '中文 文本',
];
let text = '';
for (let r = 0; r < 8; r++) text += corpus.join('\n') + '\n';
const corpusFile = path.join(TMP, 'corpus.txt');
fs.writeFileSync(corpusFile, text);

function train() {
  const t = tk.Tokenizer.fromString(JSON.stringify({
    version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: { type: 'Metaspace', replacement: SP, prepend_scheme: 'always', split: true },
    post_processor: null, decoder: null,
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, vocab: {}, merges: [] } }));
  t.train([corpusFile]);
  const f = path.join(TMP, 'trained.json');
  t.save(f, false);
  const m = JSON.parse(fs.readFileSync(f, 'utf8')).model;
  return { chars: Object.keys(m.vocab).filter(k => Array.from(k).length === 1).sort(),
           merges: m.merges.map(x => Array.isArray(x) ? x : x.split(' ')) };
}
const trained = train();

const hex2 = b => '<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>';
function layout(skipBytes) {
  const vocab = {};
  let n = 0;
  const add = t => { if (!(t in vocab)) vocab[t] = n++; };
  ['<unk>', '<s>', '</s>'].forEach(add);
  for (let b = 0; b < 256; b++) if (!skipBytes(b)) add(hex2(b));
  trained.chars.forEach(add);
  for (const [a, b] of trained.merges) add(a + b);
  return { vocab, n };
}
const at = (id, content, o) => Object.assign({ id, content, single_word: false, lstrip: false,
  rstrip: false, normalized: false, special: true }, o || {});
const post = {
  type: 'TemplateProcessing',
  single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
  pair: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
         { SpecialToken: { id: '<s>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
  special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } } };
const llamaDec = { type: 'Sequence', decoders: [
  { type: 'Replace', pattern: { String: SP }, content: ' ' }, { type: 'ByteFallback' },
  { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] };
const specials = [at(0, '<unk>'), at(1, '<s>'), at(2, '</s>')];

function spJson(setting) {
  const skip = setting === 'split' ? b => b >= 0xf0 && b <= 0xf4 : () => false;
  const { vocab, n } = layout(skip);
  const model = { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null,
                  end_of_word_suffix: null, fuse_unk: setting !== 'split', byte_fallback: true,
                  ignore_merges: setting === 'split', vocab,
                  merges: setting === 'legacy' ? trained.merges.map(m => m.join(' ')) : trained.merges };
  const j = { version: '1.0', truncation: null, padding: null, added_tokens: specials.slice(),
              normalizer: null, pre_tokenizer: null, post_processor: post, decoder: llamaDec, model };
  if (setting === 'legacy') {
    j.normalizer = { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: SP },
      { type: 'Replace', pattern: { String: ' ' }, content: SP }] };
  } else if (setting === 'meta') {
    j.pre_tokenizer = { type: 'Metaspace', replacement: SP, prepend_scheme: 'first', split: false };
  } else {
    j.pre_tokenizer = { type: 'Metaspace', replacement: SP, prepend_scheme: 'always', split: true };
    j.decoder = { type: 'Sequence', decoders: [{ type: 'ByteFallback' },
      { type: 'Metaspace', replacement: SP, prepend_scheme: 'always', split: true }] };
    j.added_tokens.push(at(n, '[INST]', { lstrip: true, rstrip: true }));
  }
  return j;
}
const toks = {};
for (const s of ['legacy', 'meta', 'split']) {
  const file = path.join(OUT, 'tokenizer_' + s + '.json');
  fs.writeFileSync(file, JSON.stringify(spJson(s)) + '\n');
  toks[s] = tk.Tokenizer.fromFile(file);
}

/* ---- inputs ------------------------------------------------------------ */
const inputs = [
  '', ' ', '  ', '   ', 'Hello world', ' Hello world', '  Hello  world  ', 'hello\nworld',
  '\n', '\n\n', 'a\n\nb', 'tab\there', '\t\t', ' \t \n ', 'trailing ', 'the fox runs away!',
  'The quick brown fox jumps over the lazy dog.', "I'm here, you're there",
  'Café naïve résumé', 'cafe\u0301', 'e\u0301\u0301', 'Ångström Über straße',
  '中文', '中文文本和日本語のテキスト', '한국어 텍스트', '我爱你', 'ひらがな',
  '😀', '😀😂', 'hi😀there', ' 😀 ', '👍🏽', '👨\u200d👩\u200d👧', '🇺🇸', '❤️', '\u{10FFFF}',
  'مرحبا', 'שלום', 'Ελληνικά', 'Русский', 'x²', '\u0000', 'a\u0000b', '\u0001\u0002\u007f',
  '\ufffd', '\ue000', '\ufeffbom', 'nb\u00a0sp', 'ideo\u3000space', SP, SP + SP + 'x', 'a' + SP + 'b',
  '<s>', '</s>', '<unk>', '<s>hello</s>', 'hello <s> world', 'hello<s>world', ' <s> ', '<s> ',
  '<s><s>', '< s>', '<s >', '</s>end', 'text</s>', '<0x41>', '<0xF0>',
  '[INST] hi [/INST]', 'a [INST] b', '[INST]', 'x   [INST]   y',
  'def encode(self, text):\n    return [1, 2]', 'for (int i = 0; i < n; i++) { x += 1; }',
  '$5.00 €10 £3', '3.14159 1,000,000', 'https://www.example.com/path?q=1&x=y#frag',
  'a'.repeat(200), 'ab'.repeat(100), ' '.repeat(30), '中'.repeat(40), '😀'.repeat(20),
  'the '.repeat(30), 'Supercalifragilisticexpialidocious',
];
const pairs = [['hello world', 'how are you'], ['', ''], ['hi', ''], ['', 'hi'],
  ['中文', 'English'], ['😀', ' x '], ['<s>', '</s>']];
let lcg = 4242;
const rnd = n => { lcg = (Math.imul(lcg, 1103515245) + 12345) >>> 0; return (lcg >>> 8) % n; };
const alpha = Array.from('abcxyzTHE  \t\n.,!?-\'éü中文😀👍\u0301\u0000' + SP + '<s>[INST]ع');
for (let i = 0; i < 40; i++) {
  let s = '';
  const n = 1 + rnd(30);
  for (let k = 0; k < n; k++) s += alpha[rnd(alpha.length)];
  inputs.push(s);
}

/* ---- encode and decode --------------------------------------------------- */
async function run() {
  const cases = [], decodes = [];
  for (const [setting, tok] of Object.entries(toks)) {
    const enc = async (t, pair) => {
      const e = pair === null ? await tok.encode(t) : await tok.encode(t, pair);
      const ids = e.getIds();
      cases.push({ setting, text: t, pair, ids, type_ids: e.getTypeIds(),
                   decoded: await tok.decode(ids, true) });
    };
    for (const s of inputs) await enc(s, null);
    for (const [a, b] of pairs) await enc(a, b);
    /* decodings that cut byte runs: prefixes and suffixes of encodings,
     * and random ids weighted towards byte tokens */
    const dec = async ids => decodes.push({ setting, ids, text: await tok.decode(ids, true) });
    for (const s of ['😀 中文 é', 'ab👨\u200d👩\u200d👧 x', ' 한국어 ']) {
      const ids = (await tok.encode(s)).getIds();
      for (let k = 0; k <= ids.length; k++) await dec(ids.slice(0, k));
      for (let k = 1; k < ids.length; k++) await dec(ids.slice(k));
    }
    const size = tok.getVocabSize(true);
    for (let i = 0; i < 60; i++) {
      const n = 1 + rnd(8), ids = [];
      for (let k = 0; k < n; k++) ids.push(rnd(3) === 0 ? rnd(size) : 3 + 128 + rnd(100));
      await dec(ids);
    }
  }
  const body = a => a.map(c => '  ' + JSON.stringify(c)).join(',\n');
  fs.writeFileSync(path.join(OUT, 'golden.json'),
    '{"reference": ' + JSON.stringify(REF) + ',\n "cases": [\n' + body(cases) +
    '\n],\n "decodes": [\n' + body(decodes) + '\n]}\n');
  fs.rmSync(TMP, { recursive: true, force: true });
  console.log(REF + ': ' + cases.length + ' cases, ' + decodes.length + ' decodes; vocab ' +
    Object.entries(toks).map(([k, t]) => k + ' ' + t.getVocabSize(true)).join(', '));
}
run().catch(e => { console.error(e); process.exit(1); });
