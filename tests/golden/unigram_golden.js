#!/usr/bin/env node
/* unigram_golden.js - writes the reference data that tests/test_unigram.c
 * checks text/unigram.c against: encodings (ids, type ids; singles, pairs,
 * truncation) and decodings of the three tokenizer.json files that
 * tests/golden/unigram_spm.py made from SentencePiece-trained models
 * (xlmr: Precompiled nmt_nfkc + XLM-R's template; bytefb: byte fallback;
 * plain: NFKC, WhitespaceSplit + Metaspace, RobertaProcessing).
 *
 * The reference is Hugging Face's `tokenizers` npm package (Node bindings
 * of the Rust library). It is not a dependency of kinfer and make test
 * never runs this script; regenerate by hand:
 *
 *   mkdir -p /tmp/tokgold && cd /tmp/tokgold && npm install tokenizers@0.23.2
 *   cd <repo> && /usr/bin/python3 tests/golden/unigram_spm.py &&
 *     NODE_PATH=/tmp/tokgold/node_modules node tests/golden/unigram_golden.js
 *
 * Output (overwritten): tests/data/unigram/charsmap.tsv (see sweep()),
 * tests/data/unigram/graphemes.tsv (see graphemes()) and
 * tests/data/unigram/golden.json:
 *   {"reference", "cases": [{tok, text, pair|null, max_len (0 = none),
 *    ids, type_ids (left out when all are 0)}], "decodes": [{tok, ids, text}],
 *    "normalize": [{tok, text, normalized}]}
 * Deterministic: a rerun gives byte-identical output. */
'use strict';
const fs = require('fs');
const path = require('path');
const tk = require('tokenizers');

const REF = 'tokenizers@' + require('tokenizers/package.json').version + ' (npm)';
const DIR = path.join(__dirname, '..', 'data', 'unigram');
const TOKS = ['xlmr', 'bytefb', 'plain'];

const corpus = fs.readFileSync(path.join(DIR, 'corpus.txt'), 'utf8').split('\n').filter(Boolean);
const extra = [
  '', ' ', '   ', '\t\n', 'a', 'A', '▁', '▁▁x', 'x▁y', '  leading and trailing  ',
  'a  b   c    d', 'a\u00a0\u00a0b', 'tab\tsep\ttext', 'new\nline\r\nend',
  '<s>', '</s>', '<s>hello</s>', '<s><s></s>', 'x <mask> y', '<mask>', '   <mask>', 'a<mask>b',
  '<mask><mask>', '<unk>', '<pad> pad', '<0x41>', '<0xE3><0x81>',
  'unknown ඞ ᚠ ꙮ chars', 'ඞඞඞ ᚠᚠ', '😀😃😄', '👩‍💻 🇫🇷🇯🇵 ❤️', '🫠 🪿',
  'ﬁne ﬂow ﬀ', '½ ¼ ¾ x² H₂O ①②③', 'ＡＢＣ ａｂｃ １２３', 'ｶﾀｶﾅ ｶﾞｷﾞ ﾊﾟ', 'ガ ｶ\u3099',
  'e\u0301 é e\u0301\u0301 a\u0308\u0301', 'z\u0336\u0301\u0308\u0300\u0303\u0327',
  '\u0301 leading mark', 'Å Å Å', '한국어 \u1112\u1161\u11ab', 'ǅ Ǆ ǆ',
  'مرحبا بالعالم', 'שָׁלוֹם', 'עברית ו-English mixed', '\u200d\u200c\u200b zero width',
  '\ufeffbom', '\u0000nul\u0000', 'ctl\u0007\u001b', '\u00ad soft hyphen',
  '``quoted\'\'', '``', '“smart” ‘quotes’', '…', '——', '3.14159 1,000,000 007',
  'https://www.example.com/path?query=1&x=2', 'user@example.org',
  'the'.repeat(40), 'ab'.repeat(64), 'x'.repeat(300), '😀'.repeat(20), 'ඞ'.repeat(30),
  'a b c d e f g h i j k l m n o p q r s t u v w x y z',
  'Ⅻ ℃ ℉ ™ ㎏ ㍻ ㌀', '\u3000ideographic\u3000space', '\u2028line sep\u2029para',
  'İstanbul ß ẞ ς σ Σ', 'kÅ Ω Ω', 'ﷺ ﷻ', '\ud83d\udc4b\ud83c\udffd hand',
];
const pairs = [
  ['Hello world', 'the lazy dog'], ['', ''], ['a', ''], ['', 'b'], ['<mask> one', 'two <mask>'],
  ['Café naïve', 'ｶﾀｶﾅ ﬁ ½'], ['😀 ඞ', 'ᚠ 🫠'], ['  spaced  out  ', '\ttabbed\t'],
  [corpus[0], corpus[1]], [corpus[9], corpus[12]], [corpus[13], corpus[14]],
];
const truncs = [3, 4, 5, 6, 8, 11, 16, 24];

async function run() {
  const cases = [], decodes = [], normalize = [];
  for (const name of TOKS) {
    const file = path.join(DIR, name, 'tokenizer.json');
    async function enc(text, pair, maxLen) {
      const tok = tk.Tokenizer.fromFile(file);
      if (maxLen) tok.setTruncation(maxLen, { strategy: 'LongestFirst' });
      const e = pair === null ? await tok.encode(text) : await tok.encode(text, pair);
      const c = { tok: name, text, pair, max_len: maxLen, ids: e.getIds() };
      if (e.getTypeIds().some(x => x !== 0)) c.type_ids = e.getTypeIds();
      cases.push(c);
      return e.getIds();
    }
    const plain = tk.Tokenizer.fromFile(file);
    const texts = corpus.concat(extra);
    for (const t of texts) {
      const ids = await enc(t, null, 0);
      normalize.push({ tok: name, text: t, normalized: plain.getNormalizer().normalizeString(t) });
      decodes.push({ tok: name, ids, text: await plain.decode(ids, true) });
      /* without the specials: the decoder alone on the model's pieces */
      if (corpus.includes(t)) continue;
      const inner = ids.filter(i => !plain.idToToken(i).match(/^<(s|\/s|pad|unk|mask)>$/));
      decodes.push({ tok: name, ids: inner, text: await plain.decode(inner, true) });
    }
    for (const [a, b] of pairs) await enc(a, b, 0);
    /* max_len below the specials is the caller's error in kinfer (ARG) */
    const nspec1 = (await plain.encode('')).getIds().length;
    const nspec2 = (await plain.encode('', '')).getIds().length;
    for (const m of truncs) {
      if (m >= nspec1)
        for (const t of [corpus[0], corpus[12], 'x <mask> y', 'ab'.repeat(20)]) await enc(t, null, m);
      if (m >= nspec2)
        for (const [a, b] of pairs.slice(0, 3).concat(pairs.slice(5))) await enc(a, b, m);
    }
    /* pairs of random words around the limit: which side the odd token
     * goes to depends on where words end (the reference stops
     * tokenizing a sequence at the first word end past max_len) */
    const words = ['the', 'quick', 'brown', 'fox', 'lazy', 'dog', 'hello', 'world', 'café',
                   'naïve', 'ｶﾀｶﾅ', '😀', 'ඞ', 'x', 'y', 'abc', '<mask>', '<s>', 'a  b'];
    let seed = 11;
    const rnd = n => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
    for (let it = 0; it < 40; it++) {
      const A = [], B = [];
      for (let i = 1 + rnd(7); i > 0; i--) A.push(words[rnd(words.length)]);
      for (let i = 1 + rnd(7); i > 0; i--) B.push(words[rnd(words.length)]);
      for (const d of [1, 3, 6, 9]) await enc(A.join(' '), B.join(' '), nspec2 + d);
    }
    /* decoding what encoding never makes: every seventh piece alone, runs of pieces
     * in odd orders, byte pieces that do not form UTF-8 */
    const n = plain.getVocabSize();
    for (let i = 0; i < n; i += 7) decodes.push({ tok: name, ids: [i], text: await plain.decode([i], true) });
    const odd = [];
    for (let i = 0; i + 7 <= n; i += 37) odd.push([i, i + 3, i + 1, i + 7, i + 2]);
    if (name === 'bytefb') {
      const b = x => plain.tokenToId('<0x' + x + '>');
      const w = plain.tokenToId('\u2581');
      odd.push([b('E3'), b('82')], [b('E3'), b('82'), b('AB')], [b('E3'), w, b('82'), b('AB')],
               [b('F0'), b('9F'), b('98'), b('80'), b('80')], [b('80')], [b('C0'), b('80')],
               [b('ED'), b('A0'), b('80')], [b('41'), b('42'), w, b('43')], [w, b('20'), w],
               [b('F4'), b('90'), b('80'), b('80')], [1, b('E3'), 2, b('82'), b('AB')]);
    }
    for (const ids of odd) decodes.push({ tok: name, ids, text: await plain.decode(ids, true) });
  }
  const line = o => '  ' + JSON.stringify(o);
  fs.writeFileSync(path.join(DIR, 'golden.json'),
    '{"reference": ' + JSON.stringify(REF) + ',\n "cases": [\n' + cases.map(line).join(',\n') +
    '\n ],\n "decodes": [\n' + decodes.map(line).join(',\n') + '\n ],\n "normalize": [\n' +
    normalize.map(line).join(',\n') + '\n ]}\n');
  console.log(REF + ': ' + cases.length + ' cases, ' + decodes.length + ' decodes, ' +
              normalize.length + ' normalizations');
}

/* ---- the charsmap sweep ------------------------------------------------
 * Every scalar value alone through xlmr's normalizer (the Precompiled
 * nmt_nfkc charsmap; Replace " {2,}" never fires on one character) into
 * charsmap.tsv, and through plain's (NFKC) into nfkc.tsv. Only
 * what changes is written, one line per run, tab-separated:
 *   LO HI + X [Y ...]   LO..HI map to X Y ..., the last value counting up
 *                       with the code point
 *   LO HI = X [Y ...]   LO..HI all map to X Y ...
 *   LO HI -             LO..HI are removed
 * (hex). */
function sweep(name, file, what) {
  const norm = tk.Tokenizer.fromFile(path.join(DIR, name, 'tokenizer.json')).getNormalizer();
  const hex = v => v.toString(16).toUpperCase().padStart(4, '0');
  const lines = [];
  let open = null; /* [lo, hi, mode, values] */
  function flush() {
    if (!open) return;
    const [lo, hi, mode, v] = open;
    lines.push([hex(lo), hex(hi)].concat(v.length ? [mode].concat(v.map(hex)) : ['-']).join('\t'));
    open = null;
  }
  for (let cp = 0; cp <= 0x10ffff; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    const c = String.fromCodePoint(cp);
    const o = norm.normalizeString(c);
    if (o === c) { flush(); continue; }
    const v = Array.from(o).map(x => x.codePointAt(0));
    if (open && open[1] === cp - 1 && open[3].length === v.length &&
        open[3].slice(0, -1).every((x, i) => x === v[i])) {
      const last = open[3][v.length - 1], k = cp - open[0];
      if (v.length === 0 || ((open[2] === '+' || open[0] === open[1]) && last + k === v[v.length - 1])) {
        open[1] = cp; open[2] = '+'; continue;
      }
      if ((open[2] === '=' || open[0] === open[1]) && last === v[v.length - 1]) {
        open[1] = cp; open[2] = '='; continue;
      }
    }
    flush();
    open = [cp, cp, '=', v];
  }
  flush();
  fs.writeFileSync(path.join(DIR, file),
    '# ' + REF + ': ' + what + ' per code point, written by tests/golden/unigram_golden.js\n' +
    lines.join('\n') + '\n');
  return lines.length;
}

/* ---- graphemes ----------------------------------------------------------
 * The reference's Precompiled looks a grapheme under 6 bytes up whole: a
 * mapped character followed by a mark in the same grapheme becomes the
 * character's mapping alone (the mark is lost). Every code point the
 * charsmap changes, the Hangul jamo and every 97th syllable, each followed
 * by each of a few marks, through xlmr's normalizer; written as one FNV-1a
 * 64 hash per mark over all the outputs (each followed by a 0xFF byte),
 * in code point order, plus the first differing examples:
 *   mark MARK_HEX COUNT HASH_HEX
 *   ex INPUT_HEX OUTPUT_HEX          (UTF-8 bytes, hex)
 */
const GRAPHEME_MARKS = ['0301', '3099', '200D', 'FE0F', '0308 0301'];
function graphemes() {
  const norm = tk.Tokenizer.fromFile(path.join(DIR, 'xlmr', 'tokenizer.json')).getNormalizer();
  const set = [];
  for (let cp = 1; cp <= 0x10ffff; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    const c = String.fromCodePoint(cp);
    if (norm.normalizeString(c) !== c || (cp >= 0x1100 && cp <= 0x11ff) ||
        (cp >= 0x3130 && cp <= 0x318f) || (cp >= 0xac00 && cp <= 0xd7a3 && (cp - 0xac00) % 97 === 0))
      set.push(cp);
  }
  const hexb = str => Buffer.from(str, 'utf8').toString('hex').toUpperCase();
  const lines = [];
  const ex = [];
  for (const mk of GRAPHEME_MARKS) {
    const m = mk.split(' ').map(h => String.fromCodePoint(parseInt(h, 16))).join('');
    let h = 0xcbf29ce484222325n;
    const P = 0x100000001b3n, MASK = (1n << 64n) - 1n;
    for (const cp of set) {
      const c = String.fromCodePoint(cp);
      const o = norm.normalizeString(c + m);
      for (const b of Buffer.concat([Buffer.from(o, 'utf8'), Buffer.from([0xff])]))
        h = ((h ^ BigInt(b)) * P) & MASK;
      if (ex.length < 40 && o !== norm.normalizeString(c) + norm.normalizeString(m))
        ex.push('ex\t' + hexb(c + m) + '\t' + hexb(o));
    }
    lines.push('mark\t' + mk + '\t' + set.length + '\t' + h.toString(16).toUpperCase().padStart(16, '0'));
  }
  fs.writeFileSync(path.join(DIR, 'graphemes.tsv'),
    '# ' + REF + ': xlmr normalizer over code point + mark, written by tests/golden/unigram_golden.js\n' +
    lines.concat(ex).join('\n') + '\n');
  return set.length;
}

run().then(() => console.log('charsmap.tsv: ' + sweep('xlmr', 'charsmap.tsv', 'xlmr normalizer') +
                             ' runs; nfkc.tsv: ' + sweep('plain', 'nfkc.tsv', 'NFKC (plain)') +
                             ' runs; graphemes.tsv: ' + graphemes() + ' code points'))
  .catch(e => { console.error(e); process.exit(1); });
