#!/usr/bin/env node
/* bpe_golden.js - writes the reference data that tests/test_bpe.c checks
 * text/bpe.c against: small byte-level BPE tokenizers trained here, the
 * encodings Hugging Face's library gives for a set of inputs (singles,
 * pairs, truncation), and its decodings.
 *
 * The reference is Hugging Face's `tokenizers` npm package (Node bindings
 * of the Rust library, prebuilt for linux-x64-gnu). It is not a dependency
 * of kinfer and `make test` never runs this script; regenerate by hand:
 *
 *   mkdir -p /tmp/tokgold && cd /tmp/tokgold && npm install tokenizers@0.23.2
 *   cd <repo> && NODE_PATH=/tmp/tokgold/node_modules node tests/golden/bpe_golden.js
 *
 * Two settings, each trained by the library's own BPE trainer
 * (Tokenizer.train, BpeTrainer's defaults) over a multilingual corpus this
 * script writes to a temporary folder (accents, CJK, emoji, Arabic and
 * Hebrew, combining marks, whitespace runs, digits, code):
 *   roberta   GPT-2/RoBERTa: ByteLevel pre-tokenizer (GPT-2 regex),
 *             RobertaProcessing, ByteLevel decoder; <s> <pad> </s> <unk>
 *             first, <mask> (lstrip) last, a non-special added token
 *             "[NEW]" (rstrip); merges written as "a b" strings.
 *             roberta_prefix is the same with add_prefix_space true.
 *   llama     Llama-3 style: NFC normalizer, Split with Llama 3's regex +
 *             ByteLevel(use_regex false), ignore_merges, merges as [a, b]
 *             pairs, TemplateProcessing with <|begin_of_text|> (type id 1
 *             for the pair's second half, to see type ids pass through).
 * The learned vocabularies are re-laid out (specials, then the 256 byte
 * characters in byte order, then each merge's product in merge order), so
 * every byte has a token and the ids are RoBERTa-shaped; the library loads
 * each file back before encoding, so files and goldens agree.
 *
 * Output (tests/data/bpe/, overwritten):
 *   tokenizer_<setting>.json
 *   slow/vocab.json, slow/merges.txt, slow/tokenizer_config.json: the
 *     roberta setting as transformers' slow RobertaTokenizer files
 *   golden.json  {"reference", "cases": [...], "decodes": [...]}: a case
 *     {setting, text, pair|null, max_len (0 = none), ids, type_ids,
 *     decoded (skip_special_tokens)}; a decode {setting, ids, text}
 *   pretok.tsv   every scalar value c through the two pre-tokenizers
 *     (roberta's ByteLevel with GPT-2's regex, llama's Split + ByteLevel)
 *     as the probe "a<c>b 1<c>2 <c><c> x": the byte lengths of the pieces,
 *     one line per run of code points that split alike:
 *     LO HI (hex) GPT2-LENGTHS LLAMA-LENGTHS, tab-separated
 *
 * Deterministic: no clock, no unseeded randomness. */
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const tk = require('tokenizers');

const REF = 'tokenizers@' + require('tokenizers/package.json').version + ' (npm)';
const OUT = path.join(__dirname, '..', 'data', 'bpe');
fs.mkdirSync(path.join(OUT, 'slow'), { recursive: true });
const TMP = fs.mkdtempSync(path.join(os.tmpdir(), 'bpegold-'));

/* ---- corpus ------------------------------------------------------------ */
const corpus = [
  'The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away!',
  'Hello, world! Hello world. hello WORLD? I\'m here, you\'re there, it\'s fine, we\'ll see, they\'ve gone, he\'d know.',
  'Kafka and Redis move jobs; the worker encodes text into tokens and tokens into vectors.',
  'Café, naïve, résumé, façade, jalapeño, señor, crème brûlée, Ångström, Über, straße, İstanbul.',
  'cafe\u0301 nai\u0308ve A\u030angstro\u0308m e\u0301\u0301 combining marks stay with their letters.',
  '中文文本和日本語のテキスト、한국어 텍스트。我爱你，你好世界！東京と北京。',
  'Emoji: 😀 😂 👍🏽 👨\u200d👩\u200d👧 🇺🇸 🇫🇷 ❤️ 🔥🔥 ✨🎉 🥰',
  'العربية لغة جميلة. مرحبا بالعالم! السلام عليكم.',
  'עברית היא שפה יפה. שלום עולם! מה שלומך?',
  'Ελληνικά: καλημέρα κόσμε. Русский: привет, мир! Москва.',
  'Numbers: 0 1 2 3 12 123 1234 12345 3.14159 1,000,000 2024-01-01 42% $5.00 €10 ٣١٢',
  'Whitespace:  two   three    four\ttab\t\ttabs\nnewline\n\nblank\r\nwindows   \n  trailing   ',
  'def encode(self, text: str) -> list[int]:\n    return [self.vocab[t] for t in text.split()]\n',
  'for (int i = 0; i < n; i++) { sum += a[i] * b[i]; }  // dot product\n#include <stdio.h>',
  'if x == 1 and y != 2 or z >= 3: print("ok")  # comment\nconst f = (a, b) => a + b;',
  'URLs: https://www.example.com/path?q=1&x=y#frag user@example.com http://example.org/index.html',
];
let text = '';
for (let r = 0; r < 6; r++) text += corpus.join('\n') + '\n';
const corpusFile = path.join(TMP, 'corpus.txt');
fs.writeFileSync(corpusFile, text);

/* ---- training ---------------------------------------------------------- */
const LLAMA_RE = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const llamaPre = { type: 'Sequence', pretokenizers: [
  { type: 'Split', pattern: { Regex: LLAMA_RE }, behavior: 'Isolated', invert: false },
  { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] };

function train(pre) {
  const t = tk.Tokenizer.fromString(JSON.stringify({
    version: '1.0', truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: pre, post_processor: null, decoder: null,
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, vocab: {}, merges: [] } }));
  t.train([corpusFile]);
  const f = path.join(TMP, 'trained.json');
  t.save(f, false);
  return JSON.parse(fs.readFileSync(f, 'utf8')).model.merges
    .map(m => Array.isArray(m) ? m : m.split(' '));
}

/* vocab: first (specials), the byte alphabet in byte order, then each
 * merge's product; returns {vocab, merges} */
function layout(first, merges) {
  const vocab = {};
  let n = 0;
  const add = t => { if (!(t in vocab)) vocab[t] = n++; };
  first.forEach(add);
  const alpha = tk.byteLevelAlphabet();
  /* byteLevelAlphabet is a set; order it by byte (GPT-2's bytes_to_unicode) */
  const b2u = [];
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
    b2u[b] = printable ? b : -1;
  }
  let k = 0;
  for (let b = 0; b < 256; b++) if (b2u[b] < 0) b2u[b] = 256 + k++;
  const byteChars = b2u.map(c => String.fromCodePoint(c));
  if (byteChars.some(c => !alpha.includes(c)) || alpha.length !== 256) throw new Error('alphabet');
  byteChars.forEach(add);
  for (const [a, b] of merges) add(a + b);
  return { vocab, n };
}

const ROB_SPECIAL = ['<s>', '<pad>', '</s>', '<unk>'];
const at = (id, content, o) => Object.assign({ id, content, single_word: false, lstrip: false,
  rstrip: false, normalized: false, special: true }, o || {});

function robertaJson(merges, prefix) {
  const { vocab, n } = layout(ROB_SPECIAL, merges);
  const bl = { type: 'ByteLevel', add_prefix_space: prefix, trim_offsets: true, use_regex: true };
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [at(0, '<s>'), at(1, '<pad>'), at(2, '</s>'), at(3, '<unk>'),
                   at(n, '<mask>', { lstrip: true }),
                   at(n + 1, '[NEW]', { rstrip: true, special: false })],
    normalizer: null, pre_tokenizer: bl,
    post_processor: { type: 'RobertaProcessing', sep: ['</s>', 2], cls: ['<s>', 0],
                      trim_offsets: true, add_prefix_space: prefix },
    decoder: bl,
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '',
             end_of_word_suffix: '', fuse_unk: false, byte_fallback: false,
             vocab, merges: merges.map(m => m.join(' ')) },
  };
}

function llamaJson(merges) {
  const { vocab, n } = layout([], merges);
  const bos = '<|begin_of_text|>', eos = '<|end_of_text|>';
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [at(n, bos), at(n + 1, eos), at(n + 2, '<|reserved_0|>'),
                   at(n + 3, 'kinfer', { normalized: true, special: false })],
    normalizer: { type: 'NFC' }, pre_tokenizer: llamaPre,
    post_processor: { type: 'Sequence', processors: [
      { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
      { type: 'TemplateProcessing',
        single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
        pair: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
               { SpecialToken: { id: bos, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { [bos]: { id: bos, ids: [n], tokens: [bos] } } }] },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
             vocab, merges },
  };
}

const gpt2Merges = train({ type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true });
const llamaMerges = train(llamaPre);
const jsons = {
  roberta: robertaJson(gpt2Merges, false),
  roberta_prefix: robertaJson(gpt2Merges, true),
  llama: llamaJson(llamaMerges),
};
const toks = {};
for (const [name, j] of Object.entries(jsons)) {
  const file = path.join(OUT, 'tokenizer_' + name + '.json');
  fs.writeFileSync(file, JSON.stringify(j) + '\n');
  toks[name] = tk.Tokenizer.fromFile(file);
}

/* the roberta setting as the slow tokenizer's files */
{
  const j = jsons.roberta;
  fs.writeFileSync(path.join(OUT, 'slow', 'vocab.json'), JSON.stringify(j.model.vocab) + '\n');
  fs.writeFileSync(path.join(OUT, 'slow', 'merges.txt'),
    '#version: 0.2\n' + j.model.merges.join('\n') + '\n');
  fs.writeFileSync(path.join(OUT, 'slow', 'tokenizer_config.json'), JSON.stringify({
    tokenizer_class: 'RobertaTokenizer', add_prefix_space: false, model_max_length: 512,
    bos_token: '<s>', eos_token: '</s>', sep_token: '</s>', cls_token: '<s>', unk_token: '<unk>',
    pad_token: '<pad>', mask_token: { content: '<mask>', lstrip: true, rstrip: false,
                                      normalized: false, single_word: false } }) + '\n');
}

/* ---- inputs ------------------------------------------------------------ */
const long = (c, n) => c.repeat(n);
const inputs = [
  'Hello, world!', 'hello world', ' hello world', 'The quick brown fox jumps over the lazy dog.',
  "I'm here, you're there, it's fine, we'll see, they've gone, he'd know.", "IT'S HE'LL I'M", "'s 'S 'sss",
  'Café naïve résumé', 'cafe\u0301 nai\u0308ve', 'e\u0301\u0301\u0301', 'A\u030angstro\u0308m', '\u212bngstr\u00f6m',
  '中文文本和日本語のテキスト', '한국어 텍스트', '我爱你，你好世界！',
  '😀', '😀😂', 'hi😀there', '👍🏽', '👨\u200d👩\u200d👧', '🇺🇸🇫🇷', '❤️', '🥰🥰',
  'مرحبا بالعالم!', 'שלום עולם', 'mixed עברית and العربية text',
  '12345', '3.14159', '1,000,000', '2024-01-01', '٣١٢ ١٢', '123456789 abc123def', 'x²',
  '  two   three    four', 'tab\tsep\t\ttabs', 'new\nline\n\nblank', 'cr\r\nlf\r\n', 'trailing   ', '   ',
  ' ', '\n', '\t \n \t', 'a  \n  b', 'nb\u00a0sp', 'ideo\u3000space', 'nel\u0085x', 'mongol\u180evowel',
  'line\u2028sep', 'thin\u2009space', 'zero\u200bwidth',
  'def encode(self, text: str) -> list[int]:\n    return [1, 2]', 'for (int i = 0; i < n; i++) { x += 1; }',
  '#include <stdio.h>', 'a==b!=c>=d', '!!!???...', '"quoted" \'single\'', '$5.00 €10 £3',
  'https://www.example.com/path?q=1&x=y#frag', 'user@example.com',
  '<s>', '</s>', '<s>hello</s>', 'hello <mask> world', 'hello<mask>world', 'x   <mask>', '<mask>',
  '[NEW]', 'a [NEW]   b', '[NEW][NEW]', '<pad><unk>', '<s >', '< s>',
  '<|begin_of_text|>', 'hi<|begin_of_text|>there', '<|end_of_text|> end', 'kinfer', 'the kinfer worker',
  'kinfers', 'ki\u0301nfer', '<|reserved_0|><|reserved_0|>',
  long('a', 300), long('ab', 200), long('中', 100), long('😀', 50), long(' ', 40), long('é', 120),
  long('1', 31), 'Supercalifragilisticexpialidocious', 'pneumonoultramicroscopicsilicovolcanoconiosis',
  '\u0000', 'a\u0000b', '\u0001\u0002', '\ufffd', '\u{10FFFF}', '\ue000', '\ufeffbom',
  '',
];
const pairs = [
  ['hello world', 'how are you'], ['', ''], ['hi', ''], ['', 'hi'], ['<s>', '</s>'],
  ['Café crème', 'naïve Ångström'], ['中文', 'English text'], ['😀', '🇺🇸'],
  ['hello <mask> there', 'and [NEW] here'], ['kinfer', '<|begin_of_text|>'],
];
const w = n => Array.from({ length: n }, (_, i) => ['hello', 'world', 'the', 'fox', 'dog', 'a'][i % 6]).join(' ');
const truncs = [
  [w(10), null, 2, 3, 5, 8, 12, 100],
  [long('é', 20), null, 3, 5, 10],
  [w(5), w(5), 4, 5, 6, 7, 8, 9, 12, 13, 14],
  [w(8), w(3), 4, 6, 7, 8, 9, 10, 14],
  [w(3), w(8), 4, 6, 7, 8, 9, 10, 14],
  [w(20), w(1), 6, 10, 24],
  ['', w(10), 4, 5, 8],
  [w(7), w(6), 6, 7, 8, 9, 16],
  ['Café naïve Ångström 中文 😀', 'hello <mask> world', 6, 9, 12],
];
let lcg = 12345;
const rnd = n => { lcg = (Math.imul(lcg, 1103515245) + 12345) >>> 0; return (lcg >>> 8) % n; };
const alpha = Array.from("abcxyzABC  \t\n\r.,!?-'\"éÉüß中国😀👍\u0301\u0308\u0000\u200b\u00a0ع שİΣ19<>s/mask[NEW]");
const randoms = [];
for (let i = 0; i < 40; i++) {
  let s = '';
  const n = 3 + rnd(40);
  for (let k = 0; k < n; k++) s += alpha[rnd(alpha.length)];
  randoms.push(s);
}

/* ---- encode and decode --------------------------------------------------- */
async function run() {
  const cases = [], decodes = [];
  async function enc(setting, t, pair, maxLen) {
    const tok = toks[setting];
    if (maxLen) tok.setTruncation(maxLen, { strategy: 'LongestFirst' });
    else tok.disableTruncation();
    const e = pair === null ? await tok.encode(t) : await tok.encode(t, pair);
    const ids = e.getIds();
    cases.push({ setting, text: t, pair, max_len: maxLen, ids, type_ids: e.getTypeIds(),
                 decoded: await tok.decode(ids, true) });
  }
  for (const setting of Object.keys(toks)) {
    for (const s of inputs) await enc(setting, s, null, 0);
    for (const [a, b] of pairs) await enc(setting, a, b, 0);
    for (const s of randoms) await enc(setting, s, null, 0);
  }
  for (const setting of ['roberta', 'llama'])
    for (const [a, b, ...ms] of truncs)
      for (const m of ms) await enc(setting, a, b, m);
  for (const na of [0, 1, 3, 6])
    for (const nb of [0, 1, 3, 6])
      for (const m of [4, 5, 6, 8, 9]) await enc('roberta', w(na), w(nb), m);
  /* decodings of id lists that cut characters in the middle, specials
   * among them: every byte token alone, prefixes of multi-byte text */
  for (const setting of ['roberta', 'llama']) {
    const tok = toks[setting];
    tok.disableTruncation();
    const size = tok.getVocabSize(true);
    const dec = async ids => decodes.push({ setting, ids, text: await tok.decode(ids, true) });
    for (const s of ['😀 中文 é', '👨\u200d👩\u200d👧', 'Ångström ع ש']) {
      const ids = (await tok.encode(s)).getIds();
      for (let k = 0; k <= ids.length; k++) await dec(ids.slice(0, k));
      for (let k = 1; k < ids.length; k++) await dec(ids.slice(k));
    }
    for (let i = 0; i < 60; i++) {
      const n = 1 + rnd(8), ids = [];
      for (let k = 0; k < n; k++) ids.push(rnd(4) === 0 ? rnd(size) : ((setting === 'roberta' ? 4 : 0) + 128 + rnd(128)));
      await dec(ids);
    }
  }
  const body = a => a.map(c => '  ' + JSON.stringify(c)).join(',\n');
  fs.writeFileSync(path.join(OUT, 'golden.json'),
    '{"reference": ' + JSON.stringify(REF) + ',\n "cases": [\n' + body(cases) +
    '\n],\n "decodes": [\n' + body(decodes) + '\n]}\n');
  sweep();
  fs.rmSync(TMP, { recursive: true, force: true });
  console.log(REF + ': ' + cases.length + ' cases, ' + decodes.length + ' decodes; vocab ' +
    Object.entries(toks).map(([k, t]) => k + ' ' + t.getVocabSize(true)).join(', '));
}
/* ---- pre-tokenizer sweep ------------------------------------------------ */
function sweep() {
  const g = toks.roberta.getPreTokenizer(), l = toks.llama.getPreTokenizer();
  const hex = v => v.toString(16).toUpperCase().padStart(4, '0');
  const lines = [];
  let open = null;
  for (let cp = 0; cp <= 0x10ffff; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    const c = String.fromCodePoint(cp);
    const s = 'a' + c + 'b 1' + c + '2 ' + c + c + ' x';
    /* pieces come back as byte characters: one per byte */
    const key = g.preTokenizeString(s).map(p => p[0].length).join(',') + '\t' +
                l.preTokenizeString(s).map(p => p[0].length).join(',');
    if (open && open[2] === key) { open[1] = cp; continue; }
    if (open) lines.push(hex(open[0]) + '\t' + hex(open[1]) + '\t' + open[2]);
    open = [cp, cp, key];
  }
  lines.push(hex(open[0]) + '\t' + hex(open[1]) + '\t' + open[2]);
  fs.writeFileSync(path.join(OUT, 'pretok.tsv'),
    '# ' + REF + ': pre-tokenizer pieces per code point, written by tests/golden/bpe_golden.js\n' +
    lines.join('\n') + '\n');
}

run().catch(e => { console.error(e); process.exit(1); });
