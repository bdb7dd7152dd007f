#!/usr/bin/env python3
"""unigram_spm.py - trains the small SentencePiece Unigram models that
tests/test_unigram.c runs, and writes each as the tokenizer.json Hugging
Face's converter would make of it. tests/golden/unigram_golden.js then
loads these files with the `tokenizers` npm package (the reference) and
writes the goldens; make test never runs either script.

  apt-get install python3-sentencepiece      # Debian 12: 0.1.97
  /usr/bin/python3 tests/golden/unigram_spm.py

Output, all under tests/data/unigram/ (overwritten):
  corpus.txt          the multilingual training text (also the goldens' source)
  xlmr/tokenizer.json XLM-R's layout: Precompiled nmt_nfkc charsmap (the same
                      table XLM-R's tokenizer.json carries) + Replace " {2,}",
                      Metaspace (always, split), <s> A </s></s> B </s>,
                      <mask> with lstrip, Metaspace decoder
  bytefb/tokenizer.json byte_fallback: NFKC + Replace + Strip, Metaspace
                      (first, no split), a Llama-like template and decoder
                      chain (Replace, ByteFallback, Fuse, Strip)
  plain/tokenizer.json NFKC, WhitespaceSplit + Metaspace (never prepended),
                      RobertaProcessing, Metaspace decoder
Deterministic (sentencepiece's trainer runs single-threaded here)."""
import base64
import json
import os
import sys

import sentencepiece as spm

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'data', 'unigram')

CORPUS = """The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away!
Hello world, hello tokenizer. Tokenizers split text into pieces, and pieces into ids.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 1,000,000 and 007.
Café, naïve, résumé, façade, jalapeño, crème brûlée, fiancée, Ångström, señor, Straße.
Über den Wolken muss die Freiheit wohl grenzenlos sein. Grüße aus München und Köln.
Le cœur a ses raisons que la raison ne connaît point. Où est la bibliothèque ?
El veloz murciélago hindú comía feliz cardillo y kiwi. ¿Dónde está el baño? ¡Olé!
Português: ação, coração, informação, não, São Paulo. Polski: zażółć gęślą jaźń.
Türkçe: İstanbul, ığdır, şeker, çiçek, öğrenci. Čeština: příliš žluťoučký kůň.
Русский: Съешь же ещё этих мягких французских булок да выпей чаю. Привет, мир!
Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε.
العربية: مرحبا بالعالم. اللغة العربية جميلة جدا. السلام عليكم ورحمة الله.
עברית: שלום עולם. עברית היא שפה שמית. תודה רבה לכולם.
中文：你好，世界。我们在学习分词器。今天天气很好，我们去公园散步吧。
日本語：こんにちは世界。トークナイザーのテストです。東京は日本の首都です。ｶﾀｶﾅ
한국어: 안녕하세요 세계. 토크나이저 테스트입니다. 서울은 한국의 수도입니다.
हिन्दी: नमस्ते दुनिया। यह एक परीक्षण है। ภาษาไทย: สวัสดีชาวโลก
Emoji: 😀 😃 😄 👍 🎉 ❤️ 👩‍💻 🇫🇷 🇯🇵 ✨ and more 🙂 smiles.
Full-width: ＡＢＣ ａｂｃ １２３ ｱｲｳ and ligatures ﬁ ﬂ ﬀ, fractions ½ ¼, superscripts x² H₂O.
Combining: e\u0301 a\u0300 o\u0308 n\u0303 c\u0327, Zalgo z\u0336\u0301\u0308a\u0337\u0300l\u0303g\u0327o.
Whitespace   runs	tabs
newlines\u00a0nbsp\u3000ideographic space\u2003em space.
Punctuation: "quotes" 'single' «guillemets» „Anführung“ — dashes – and … ellipsis.
URLs: https://www.example.com/path?query=1&x=2 and mail user@example.org.
Code: def f(x): return x ** 2  # comment; int main(void) { return 0; }
the the the of of and and to to in in is is you you that that it it was was for for
sentence pair first second truncate truncation longest short long very words split
"""


def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i


def fields(b):
    """(field number, wire type, value) of a serialized protobuf message."""
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError('wire type %d' % wt)
        yield f, wt, v


def charsmap(model_bytes):
    """ModelProto.normalizer_spec (3).precompiled_charsmap (2)."""
    for f, _, v in fields(model_bytes):
        if f == 3:
            for g, _, w in fields(v):
                if g == 2:
                    return bytes(w)
    raise ValueError('no precompiled_charsmap')


def train(prefix, vocab_size, byte_fallback, rule, coverage=0.98):
    spm.SentencePieceTrainer.train(
        input=os.path.join(OUT, 'corpus.txt'), model_prefix=prefix, model_type='unigram',
        vocab_size=vocab_size, character_coverage=coverage, byte_fallback=byte_fallback,
        normalization_rule_name=rule, num_threads=1, seed_sentencepiece_size=20000,
        minloglevel=2, split_digits=False, hard_vocab_limit=False)
    sp = spm.SentencePieceProcessor(model_file=prefix + '.model')
    pieces = [(sp.id_to_piece(i), float(sp.get_score(i))) for i in range(sp.get_piece_size())]
    with open(prefix + '.model', 'rb') as f:
        cm = charsmap(f.read())
    return pieces, cm


def added(i, content, special=True, lstrip=False):
    return {'id': i, 'content': content, 'single_word': False, 'lstrip': lstrip,
            'rstrip': False, 'normalized': False, 'special': special}


def metaspace(scheme, split):
    return {'type': 'Metaspace', 'replacement': '\u2581', 'prepend_scheme': scheme,
            'split': split}


def write(name, tok):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, 'tokenizer.json'), 'w', encoding='utf-8') as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write('\n')


def base(added_tokens, normalizer, pre, post, decoder, vocab, unk_id, byte_fallback):
    return {'version': '1.0', 'truncation': None, 'padding': None, 'added_tokens': added_tokens,
            'normalizer': normalizer, 'pre_tokenizer': pre, 'post_processor': post,
            'decoder': decoder,
            'model': {'type': 'Unigram', 'unk_id': unk_id, 'vocab': vocab,
                      'byte_fallback': byte_fallback}}


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, 'corpus.txt'), 'w', encoding='utf-8') as f:
        f.write(CORPUS)
    tmp = '/tmp/kinfer_unigram_spm'
    os.makedirs(tmp, exist_ok=True)

    # XLM-R: fairseq's layout (<s> <pad> </s> <unk>, then spm's pieces after
    # its own three specials, <mask> last), the converter's normalizer,
    # pre-tokenizer, template and decoder.
    pieces, cm = train(tmp + '/xlmr', 500, False, 'nmt_nfkc')
    vocab = [['<s>', 0.0], ['<pad>', 0.0], ['</s>', 0.0], ['<unk>', 0.0]]
    vocab += [[p, s] for p, s in pieces[3:]]
    vocab.append(['<mask>', 0.0])
    mask = len(vocab) - 1
    tok = base([added(0, '<s>'), added(1, '<pad>'), added(2, '</s>'), added(3, '<unk>'),
                added(mask, '<mask>', lstrip=True)],
               {'type': 'Sequence', 'normalizers': [
                   {'type': 'Precompiled',
                    'precompiled_charsmap': base64.b64encode(cm).decode('ascii')},
                   {'type': 'Replace', 'pattern': {'Regex': ' {2,}'}, 'content': ' '}]},
               metaspace('always', True),
               {'type': 'TemplateProcessing',
                'single': [{'SpecialToken': {'id': '<s>', 'type_id': 0}},
                           {'Sequence': {'id': 'A', 'type_id': 0}},
                           {'SpecialToken': {'id': '</s>', 'type_id': 0}}],
                'pair': [{'SpecialToken': {'id': '<s>', 'type_id': 0}},
                         {'Sequence': {'id': 'A', 'type_id': 0}},
                         {'SpecialToken': {'id': '</s>', 'type_id': 0}},
                         {'SpecialToken': {'id': '</s>', 'type_id': 0}},
                         {'Sequence': {'id': 'B', 'type_id': 0}},
                         {'SpecialToken': {'id': '</s>', 'type_id': 0}}],
                'special_tokens': {
                    '<s>': {'id': '<s>', 'ids': [0], 'tokens': ['<s>']},
                    '</s>': {'id': '</s>', 'ids': [2], 'tokens': ['</s>']}}},
               metaspace('always', True), vocab, 3, False)
    write('xlmr', tok)

    # Byte fallback: spm's own layout (<unk> <s> </s>, then <0x00>..<0xFF>).
    pieces, _ = train(tmp + '/bytefb', 900, True, 'identity')
    vocab = [[p, s] for p, s in pieces]
    tok = base([added(0, '<unk>'), added(1, '<s>'), added(2, '</s>')],
               {'type': 'Sequence', 'normalizers': [
                   {'type': 'NFKC'},
                   {'type': 'Replace', 'pattern': {'String': '``'}, 'content': '"'},
                   {'type': 'Strip', 'strip_left': True, 'strip_right': True}]},
               metaspace('first', False),
               {'type': 'TemplateProcessing',
                'single': [{'SpecialToken': {'id': '<s>', 'type_id': 0}},
                           {'Sequence': {'id': 'A', 'type_id': 0}}],
                'pair': [{'SpecialToken': {'id': '<s>', 'type_id': 0}},
                         {'Sequence': {'id': 'A', 'type_id': 0}},
                         {'SpecialToken': {'id': '<s>', 'type_id': 1}},
                         {'Sequence': {'id': 'B', 'type_id': 1}}],
                'special_tokens': {'<s>': {'id': '<s>', 'ids': [1], 'tokens': ['<s>']}}},
               {'type': 'Sequence', 'decoders': [
                   {'type': 'Replace', 'pattern': {'String': '\u2581'}, 'content': ' '},
                   {'type': 'ByteFallback'}, {'type': 'Fuse'},
                   {'type': 'Strip', 'content': ' ', 'start': 1, 'stop': 0}]},
               vocab, 0, True)
    write('bytefb', tok)

    # Plain: no Precompiled, WhitespaceSplit then Metaspace that never
    # prepends, RoBERTa's processor.
    pieces, _ = train(tmp + '/plain', 700, False, 'identity')
    vocab = [[p, s] for p, s in pieces]
    tok = base([added(0, '<unk>'), added(1, '<s>'), added(2, '</s>')],
               {'type': 'NFKC'},
               {'type': 'Sequence', 'pretokenizers': [{'type': 'WhitespaceSplit'},
                                                      metaspace('never', True)]},
               {'type': 'RobertaProcessing', 'sep': ['</s>', 2], 'cls': ['<s>', 1],
                'trim_offsets': True, 'add_prefix_space': True},
               metaspace('never', True), vocab, 0, False)
    write('plain', tok)


if __name__ == '__main__':
    sys.exit(main())
