#!/usr/bin/env node
/* wordpiece_golden.js - writes the reference data that tests/test_wordpiece.c
 * checks text/wordpiece.c against: the test vocabulary, one tokenizer.json
 * per normalizer setting, the encoded cases, and a sweep of every code
 * point through each normalizer step and the pre-tokenizer.
 *
 * The reference is Hugging Face's `tokenizers` npm package (Node bindings
 * of the Rust library, prebuilt for linux-x64-gnu). It is not a dependency
 * of kinfer and `make test` never runs this script; regenerate by hand:
 *
 *   mkdir -p /tmp/tokgold && cd /tmp/tokgold && npm install tokenizers@0.23.2
 *   cd <repo> && NODE_PATH=/tmp/tokgold/node_modules node tests/golden/wordpiece_golden.js
 *
 * Output (all under tests/data/wordpiece/, overwritten):
 *   vocab.txt               one token per line, id = line number
 *   tokenizer.json          what the library saves for the uncased setting
 *                           (bert-base-uncased's), tokenizer_<setting>.json
 *                           for each other setting
 *   golden.json             {"reference", "settings", "cases": [...]}, each
 *                           case {setting, text, pair|null, max_len (0 = no
 *                           truncation), ids, type_ids, tokens}
 *   unicode.tsv             the per-code-point sweep (format below)
 *
 * Deterministic: no clock, no unseeded randomness, so a rerun with the same
 * package version gives byte-identical files. */
'use strict';
const fs = require('fs');
const path = require('path');
const tk = require('tokenizers');

const REF = 'tokenizers@' + require('tokenizers/package.json').version + ' (npm)';
const OUT = path.join(__dirname, '..', 'data', 'wordpiece');
fs.mkdirSync(OUT, { recursive: true });

/* ---- vocabulary ------------------------------------------------------ */
const vocab = [];
const seen = new Set();
function add(tok) {
  if (seen.has(tok)) return;
  seen.add(tok);
  vocab.push(tok);
}
function addWithCont(tok) { add(tok); add('##' + tok); }

['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'].forEach(add);
for (let i = 0; i < 5; i++) add('[unused' + i + ']');
/* printable ASCII as whole tokens; letters and digits also as pieces,
 * except ##q so that a word like "foxq" has an unmatchable piece */
for (let c = 0x21; c < 0x7f; c++) add(String.fromCharCode(c));
for (const c of 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789')
  if (c !== 'q') add('##' + c);
const words = `the of and to in is you that it he was for on are as with his they i at be
this have from or one had by word but not what all were we when your can said there use an
each which she do how their if will up other about out many then them these so some her would
make like him into time has look two more write go see number no way could people my than first
water been call who oil its now find long down day did get come made may part hello world quick
brown fox jumps over lazy dog cafe naive angstrom token tokenizer tokenizers model text test unit
https http www example com org path user mail email state art don t s re ll ve m d new york line
tab zero width space soft hyphen joiner control bell null replacement character string strings
sentence pair first second truncate truncation longest short long very words split punctuation
quote quotes dash dashes emoji flag flags number numbers url urls query fragment index html
straße strasse istanbul paris london berlin tokyo über resume résumé façade facade jalapeño
jalapeno señor senor crème creme brûlée brulee cliché cliche fiancée fiancee naïve ångström café
ok yes hi hey friend how are today aaa un able happy happiness run running runs ran play played
playing player players`.split(/\s+/).filter(Boolean);
words.forEach(add);
['s', 'es', 'ed', 'ing', 'ly', 'er', 'ers', 'est', 'tion', 'ment', 'ness', 'able', 'ful', 'less',
 'aa', 'aaaa', 'izer', 'ize', 'ized', 'un', 're', 'ate', 'ation', 'al', 'ic', 'ist', 'ism', 'ity',
 'ous', 'ive', 'ize', 'en', 'on', 'an', 'in', 'at', 'it', 'or', 'ar', 'ch', 'sh', 'th', 'll', 'ss',
 'com', 'org', 'net', '00', '000', '24', '14'].forEach(t => add('##' + t));
/* cased forms */
['Hello', 'World', 'The', 'I', 'Quick', 'Brown', 'Fox', 'Café', 'Naïve', 'Ångström', 'New', 'York',
 'Paris', 'London', 'Berlin', 'Tokyo', 'Über', 'Straße', 'STRASSE', 'Istanbul', 'İstanbul', 'TEST',
 'Token', 'URL', 'OK', 'Hi'].forEach(add);
/* Latin letters with diacritics, both cases, and as pieces */
for (const c of 'éèêëáàâäåãçíìîïñóòôöõøúùûüýÿßæœđłšžčřğışİÉÈÀÅÖÜÇÑØÆŒĐŁŠŽ') addWithCont(c);
/* bare combining marks as pieces: visible when accents are kept */
['\u0301', '\u0300', '\u0308', '\u030a', '\u0307', '\u0327', '\u0303', '\u0302'].forEach(m => add('##' + m));
add('i\u0307'); /* what Rust's lowercase makes of U+0130 */
/* CJK ideographs (URO, Ext A, Ext B, compatibility), kana, Hangul + jamo */
for (const c of '中国人日本语語文字我你好的是学生大小上下天地山水火木金土月年时間東京北汉漢爱家豈丽')
  add(c);
['\u3400', '\u4DB5', '\u{20000}', '\u{2A6D6}', '\uF900', '\u{2F800}', '\u4E3D', '\u8C48'].forEach(add);
for (const c of 'のはですこれにほんごテキストがをとも') addWithCont(c);
['これは', 'です', 'テキスト', '한국어', '한', 'ᄒ', 'ᄀ', 'ᄋ'].forEach(add);
for (const c of 'ᅡᆫᅮᆨᅥᄀᄋ') add('##' + c);
/* CJK and Unicode punctuation, symbols */
for (const c of '。、「」『』！？，：；（）〜・ー—–‐“”‘’«»…¿¡§¶•·‰†‡′″‹›€£¥©™°±×÷→∞½²ﬁ¬')
  add(c);
/* emoji: single code points, skin tone, ZWJ family members, flags, VS16 */
['😀', '😂', '👍', '❤', '🔥', '✨', '🎉', '👨', '🇺', '🇫'].forEach(add);
['🏽', '👩', '👧', '🇸', '🇷', '\ufe0f', '❤', '😀'].forEach(t => add('##' + t));
/* Greek and Cyrillic */
['α', 'β', 'γ', 'δ', 'ε', 'λ', 'μ', 'π', 'σ', 'ς', 'ω', 'ο', 'αβγ', 'οδος', 'οδοσ', 'καλημερα',
 'καλημέρα', 'ελληνικα', 'Σ', 'Ω', 'ΟΔΟΣ', 'привет', 'мир', 'москва', 'Привет', 'Москва', 'п', 'м'
].forEach(add);
for (const c of 'αβγδελμπσςωοιηκνрмивета') add('##' + c);
/* characters whose treatment depends on the reference's Unicode tables */
['\u0264', '\u{10D70}', '\u{10D71}', '\uA7CD', '\u1C8A'].forEach(add);
['\u{1D158}', '\u{1D15F}'].forEach(add);
['\u{1D165}', '\u{1D16D}'].forEach(t => add('##' + t));
/* digits and number pieces */
['2024', '100', '3', '14', '1000', '٣', '١٢'].forEach(add);

fs.writeFileSync(path.join(OUT, 'vocab.txt'), vocab.join('\n') + '\n');
const vocabMap = {};
vocab.forEach((t, i) => { vocabMap[t] = i; });

/* ---- settings ---------------------------------------------------------- */
/* strip_accents: null means "follow lowercase", as in bert-base-uncased. */
const settings = {
  uncased:       { clean_text: true,  handle_chinese_chars: true,  strip_accents: null,  lowercase: true,  post: 'template' },
  cased:         { clean_text: true,  handle_chinese_chars: true,  strip_accents: null,  lowercase: false, post: 'bert' },
  lower_nostrip: { clean_text: true,  handle_chinese_chars: true,  strip_accents: false, lowercase: true,  post: 'bert' },
  strip_cased:   { clean_text: true,  handle_chinese_chars: true,  strip_accents: true,  lowercase: false, post: 'template' },
  nochinese:     { clean_text: true,  handle_chinese_chars: false, strip_accents: null,  lowercase: true,  post: 'template' },
  noclean:       { clean_text: false, handle_chinese_chars: true,  strip_accents: null,  lowercase: true,  post: 'bert' },
};
const SPECIAL = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'];

function tokenizerJson(s) {
  const cls = vocabMap['[CLS]'], sep = vocabMap['[SEP]'];
  const post = s.post === 'bert'
    ? { type: 'BertProcessing', sep: ['[SEP]', sep], cls: ['[CLS]', cls] }
    : {
        type: 'TemplateProcessing',
        single: [{ SpecialToken: { id: '[CLS]', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
                 { SpecialToken: { id: '[SEP]', type_id: 0 } }],
        pair: [{ SpecialToken: { id: '[CLS]', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
               { SpecialToken: { id: '[SEP]', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } },
               { SpecialToken: { id: '[SEP]', type_id: 1 } }],
        special_tokens: {
          '[CLS]': { id: '[CLS]', ids: [cls], tokens: ['[CLS]'] },
          '[SEP]': { id: '[SEP]', ids: [sep], tokens: ['[SEP]'] },
        },
      };
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: SPECIAL.map(c => ({ id: vocabMap[c], content: c, single_word: false, lstrip: false,
                                      rstrip: false, normalized: false, special: true })),
    normalizer: { type: 'BertNormalizer', clean_text: s.clean_text, handle_chinese_chars: s.handle_chinese_chars,
                  strip_accents: s.strip_accents, lowercase: s.lowercase },
    pre_tokenizer: { type: 'BertPreTokenizer' },
    post_processor: post,
    decoder: { type: 'WordPiece', prefix: '##', cleanup: true },
    model: { type: 'WordPiece', unk_token: '[UNK]', continuing_subword_prefix: '##',
             max_input_chars_per_word: 100, vocab: vocabMap },
  };
}

const jsonName = name => name === 'uncased' ? 'tokenizer.json' : 'tokenizer_' + name + '.json';
const toks = {};
for (const [name, s] of Object.entries(settings)) {
  const file = path.join(OUT, jsonName(name));
  tk.Tokenizer.fromString(JSON.stringify(tokenizerJson(s))).save(file, true);
  /* encode with what was saved, so the file and the goldens agree */
  toks[name] = tk.Tokenizer.fromFile(file);
}

/* ---- inputs ------------------------------------------------------------ */
const long = (c, n) => c.repeat(n);
const inputs = [
  // plain English, mixed case
  'Hello, world!', 'the quick brown fox jumps over the lazy dog', 'The QUICK Brown fOX',
  'I don\'t think so; they\'re here, aren\'t they?', 'Tokenizers split words into pieces: playing, played, players.',
  'unhappiness is unable', 'running runs ran', 'hello  world   spaced', '  leading and trailing  ',
  // accents, precomposed and decomposed
  'café', 'Café', 'CAFÉ', 'naïve', 'Naïve', 'Ångström', 'ÅNGSTRÖM', 'cafe\u0301', 'nai\u0308ve',
  'A\u030angstro\u0308m', 'résumé façade jalapeño señor', 'crème brûlée', 'Über straße', 'e\u0301\u0301\u0301',
  '\u212bngstr\u00f6m', 'ǅ ǆ Ǆ', 'ﬁne ﬁ',
  // CJK
  '中国人', '我爱你', '日本語のテキスト', '中文English混合text', 'これは日本語です。', '한국어', '한국어 텍스트',
  '\u3400\u4DB5\u4DB6', '\u{20000}\u{2A6D6}\u{2A6DF}\u{2A6E0}', '\uF900\u{2F800}', '\u9FFF\u9FFE\uA000',
  '\u{2A700}\u{2B740}\u{2B81F}\u{2B820}\u{2B920}\u{2CEAF}\u{2CEB0}', 'a中b', '中,国', '（中国）「日本」',
  // emoji
  '😀', '😀😂', 'hi😀there', '👍🏽', '👨\u200d👩\u200d👧', '🇺🇸', '🇫🇷🇺🇸', '❤️', '❤\ufe0f love', '🔥🔥🔥', '✨🎉', '\u{1F970}',
  // control characters and whitespace
  'a\u0001b', 'tab\tseparated\tvalues', 'new\nline', 'cr\r\nlf', 'bell\u0007', 'del\u007fete',
  'a\u0000b', '\u0000', 'x\u0000\u0000y', 'a\ufffdb', '\ufffd', 'zero\u200bwidth', 'zero\u200b width',
  'nb\u00a0sp', 'ideo\u3000space', 'line\u2028sep', 'para\u2029sep', 'nel\u0085x', 'thin\u2009space',
  'en\u2002em\u2003', '\ufeffbom', 'soft\u00adhyphen', 'joiner\u200dzw', 'vt\u000bff\u000c', 'lrm\u200erlm\u200f',
  '\u180emongolian', 'ogham\u1680space', 'narrow\u202fnbsp', 'math\u205fspace', 'private\ue000use', '\u{F0000}',
  // punctuation of every kind
  '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~', 'a+b=c', 'x^2', '`code`', '|pipe|', '~tilde', '$5.00',
  'em—dash en–dash hy‐phen', '“quoted” ‘single’ «guillemets»', 'wait…', '¿qué? ¡sí!', '§1 ¶2 • item',
  '。、「」『』！？', '‰†‡′″‹›', '±×÷→∞', '© ™ ° €5 £3 ¥9', '¬x', 'a.b.c', '...', '---', '##', '#hashtag',
  // numbers and URLs
  '123', '2024', '3.14', '1,000,000', '2024-01-01', '٣ ١٢', '½ ²', 'https://www.example.com/path?q=1&x=y#frag',
  'user@example.com', 'http://example.org/index.html',
  // long words (the limit is 100 characters per word, counted in chars)
  long('a', 99), long('a', 100), long('a', 101), long('a', 102), long('é', 100), long('é', 101),
  long('İ', 50), long('İ', 51), long('中', 150), long('a', 100) + ' ok', long('😀', 100), long('😀', 101),
  'aaaaaa', 'aaaaaaaaa',
  // unmatchable pieces
  'foxq', 'qq', 'жук', 'hello жук world', 'ab\u0378c',
  // literal special tokens
  '[CLS] hi [SEP]', '[MASK]', 'hello[MASK]world', '[mask]', '[ CLS ]', '[CLS][SEP]', '[[CLS]]', '[UNK]',
  '[PAD] [PAD]', '[SEP', 'MASK]', '[MASK][MASK]', 'x[UNK]y', '[unused0]', '[CLS]\u0000[SEP]', 'é[MASK]É',
  // case oddities
  'İstanbul', 'istanbul', 'ISTANBUL', 'ıi', 'İ', 'straße STRASSE ẞ', 'ΟΔΟΣ', 'οδος', 'Σ σ ς', 'Привет, мир!',
  'МОСКВА', 'καλημέρα', 'ΚΑΛΗΜΈΡΑ',
  // characters whose class the reference's Unicode tables decide
  'a\u0890b', 'a\u2E43b', 'x\u07FDy', 'a\u1734', 'x\u166Dy', '\uA7CB', '\u{10D50}\u{10D51}', '\u1C89',
  'a\u0898', '\u{11938}', '\u{1D158}\u{1D16D}\u{1D165}', '\u{1D15F}', '\u{1D158}\u{1D165}\u{1D16D}',
  // empty and whitespace-only
  '', ' ', '   ', '\t\n\r', '\u00a0\u3000', '\u0001\u0002', '\u200b',
];

const pairs = [
  ['hello world', 'how are you today'], ['', ''], ['hi', ''], ['', 'hi'], ['[CLS]', '[SEP]'],
  ['Café crème', 'naïve Ångström'], ['中国人', 'English text'], ['a\u0000b', 'c\u0001d'],
  ['😀', '🇺🇸'], ['[MASK] is here', 'and [MASK] there'],
];

/* truncation: [text, pair|null, max_len...] */
const w = n => Array.from({ length: n }, (_, i) => ['hello', 'world', 'the', 'fox', 'dog', 'a'][i % 6]).join(' ');
const truncs = [
  [w(10), null, 2, 3, 5, 8, 11, 12, 13, 100],
  ['playing players runs', null, 2, 3, 4, 5, 6],
  [long('a', 20), null, 5, 10],
  [w(5), w(5), 3, 4, 5, 6, 7, 8, 9, 12, 13, 14],
  [w(6), w(6), 3, 4, 7, 8, 15],
  [w(8), w(3), 3, 4, 6, 7, 8, 9, 10, 14, 15],
  [w(3), w(8), 3, 4, 6, 7, 8, 9, 10, 14, 15],
  [w(20), w(1), 5, 6, 10, 24],
  [w(1), w(20), 5, 6, 10, 24],
  ['', w(10), 3, 5, 8],
  [w(10), '', 3, 5, 8],
  [w(7), w(6), 6, 7, 8, 9, 16],
  [w(6), w(7), 6, 7, 8, 9, 16],
  ['Café naïve Ångström 中国人 😀', 'hello [MASK] world', 6, 9, 12],
];

/* a few fixed pseudo-random strings over an alphabet of awkward
 * characters (a 32-bit LCG, so reruns are identical) */
let lcg = 12345;
const rnd = n => { lcg = (Math.imul(lcg, 1103515245) + 12345) >>> 0; return (lcg >>> 8) % n; };
const alpha = Array.from('abcxyzABC  \t\n.,!?-\'"éÉüß中国😀👍\u0301\u0308\u0000\u0001\u200b\u00a0ÅİΣς[]MASK#');
const randoms = [];
for (let i = 0; i < 40; i++) {
  let s = '';
  const n = 5 + rnd(40);
  for (let k = 0; k < n; k++) s += alpha[rnd(alpha.length)];
  randoms.push(s);
}

/* ---- encode ------------------------------------------------------------ */
async function run() {
  const cases = [];
  async function enc(setting, text, pair, maxLen) {
    const tok = toks[setting];
    if (maxLen) tok.setTruncation(maxLen, { strategy: 'LongestFirst' });
    else tok.disableTruncation();
    const e = pair === null ? await tok.encode(text) : await tok.encode(text, pair);
    cases.push({ setting, text, pair, max_len: maxLen, ids: e.getIds(), type_ids: e.getTypeIds(),
                 tokens: e.getTokens() });
  }
  for (const setting of Object.keys(settings))
    for (const s of inputs) await enc(setting, s, null, 0);
  for (const setting of ['uncased', 'cased'])
    for (const [a, b] of pairs) await enc(setting, a, b, 0);
  for (const setting of ['uncased', 'strip_cased'])
    for (const [a, b, ...ms] of truncs)
      for (const m of ms) await enc(setting, a, b, m);
  /* a grid of pair lengths x limits, for longest_first's tie rules */
  for (const na of [0, 1, 2, 4, 6, 7, 9])
    for (const nb of [0, 1, 2, 4, 6, 7, 9])
      for (const m of [3, 4, 5, 6, 8, 9, 12]) await enc('uncased', w(na), w(nb), m);
  for (const setting of ['uncased', 'cased', 'noclean'])
    for (const s of randoms) await enc(setting, s, null, 0);
  for (let i = 0; i + 1 < randoms.length; i += 4) await enc('uncased', randoms[i], randoms[i + 1], 0);

  const settingsOut = {};
  for (const [name, s] of Object.entries(settings))
    settingsOut[name] = { clean_text: s.clean_text, handle_chinese_chars: s.handle_chinese_chars,
                          strip_accents: s.strip_accents, lowercase: s.lowercase,
                          json: jsonName(name) };
  const body = cases.map(c => '  ' + JSON.stringify(c)).join(',\n');
  fs.writeFileSync(path.join(OUT, 'golden.json'),
    '{"reference": ' + JSON.stringify(REF) + ',\n "settings": ' + JSON.stringify(settingsOut) +
    ',\n "cases": [\n' + body + '\n]}\n');

  /* sanity: the library's own vocab.txt reader agrees with our ids */
  const fromFile = await tk.WordPiece.fromFile(path.join(OUT, 'vocab.txt'));
  const check = new tk.Tokenizer(fromFile);
  for (const t of vocab)
    if (check.tokenToId(t) !== vocabMap[t]) throw new Error('vocab.txt reader disagrees on ' + t);

  sweep();
  console.log(REF + ': ' + cases.length + ' cases, ' + vocab.length + ' tokens');
}

/* ---- unicode sweep -----------------------------------------------------
 * Every scalar value goes alone through four single-step normalizers and,
 * as "a<c>b", through the pre-tokenizer. Only behaviour other than "left as
 * it is" is written, one line per run, tab-separated:
 *   clean  LO HI del|sp       clean_text drops / turns into a space
 *   strip  LO HI -            strip_accents drops the character
 *   strip  LO HI X [Y ...]    strip_accents gives X Y ... (hex); along a
 *   lower  LO HI X [Y ...]    run the last value counts up with the code
 *                             point (so A-Z -> a-z is one line)
 *   cjk    LO HI              handle_chinese_chars puts spaces around it
 *   pre    LO HI ws|punct     the pre-tokenizer splits on it / isolates it
 */
function sweep() {
  const mk = o => tk.bertNormalizer(Object.assign({ cleanText: false, handleChineseChars: false,
                                                    stripAccents: false, lowercase: false }, o));
  const nClean = mk({ cleanText: true }), nStrip = mk({ stripAccents: true });
  const nLower = mk({ lowercase: true }), nCjk = mk({ handleChineseChars: true });
  const pre = tk.bertPreTokenizer();
  const cps = s => Array.from(s).map(c => c.codePointAt(0));
  const lines = [];
  const open = {}; /* kind -> [lo, hi, key, values] */
  function emit(kind, cp, key, values) {
    const o = open[kind];
    if (o && o[1] === cp - 1 && o[2] === key &&
        (values === null || (o[3].length === values.length &&
          o[3].slice(0, -1).every((v, i) => v === values[i]) &&
          o[3][o[3].length - 1] + (cp - o[0]) === values[values.length - 1]))) {
      o[1] = cp;
      return;
    }
    flush(kind);
    open[kind] = [cp, cp, key, values];
  }
  function flush(kind) {
    const o = open[kind];
    if (!o) return;
    const hex = v => v.toString(16).toUpperCase().padStart(4, '0');
    lines.push([kind, hex(o[0]), hex(o[1])].concat(o[3] === null ? [o[2]] : o[3].length ? o[3].map(hex) : ['-'])
      .join('\t'));
    open[kind] = null;
  }
  for (let cp = 0; cp <= 0x10ffff; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    const c = String.fromCodePoint(cp);
    const cl = nClean.normalizeString(c);
    if (cl === '') emit('clean', cp, 'del', null);
    else if (cl === ' ' && cp !== 0x20) emit('clean', cp, 'sp', null);
    else if (cl !== c) throw new Error('clean ' + cp);
    const st = nStrip.normalizeString(c);
    if (st !== c) emit('strip', cp, 'map', cps(st));
    const lo = nLower.normalizeString(c);
    if (lo !== c) emit('lower', cp, 'map', cps(lo));
    const cj = nCjk.normalizeString(c);
    if (cj === ' ' + c + ' ') emit('cjk', cp, 'cjk', null);
    else if (cj !== c) throw new Error('cjk ' + cp);
    const n = pre.preTokenizeString('a' + c + 'b').length;
    if (n === 2) emit('pre', cp, 'ws', null);
    else if (n === 3) emit('pre', cp, 'punct', null);
    else if (n !== 1) throw new Error('pre ' + cp);
  }
  for (const k of Object.keys(open)) flush(k);
  lines.sort((x, y) => {
    const [kx, ax] = x.split('\t'), [ky, ay] = y.split('\t');
    return kx < ky ? -1 : kx > ky ? 1 : parseInt(ax, 16) - parseInt(ay, 16);
  });
  fs.writeFileSync(path.join(OUT, 'unicode.tsv'),
    '# ' + REF + ': per-code-point reference, written by tests/golden/wordpiece_golden.js\n' +
    lines.join('\n') + '\n');
}

run().catch(e => { console.error(e); process.exit(1); });
