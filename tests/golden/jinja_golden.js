#!/usr/bin/env node
/* jinja_golden.js - writes the reference data that tests/test_jinja.c
 * checks text/jinja_*.c against: chat templates in the style of four
 * model families (ChatML, Llama 3, Mistral, Qwen 3), written here for the
 * test, each rendered over several conversations with and without the
 * generation prompt, plus small templates for single features; and what
 * Hugging Face's renderer answers for each (the text, or its error).
 *
 * The reference is Hugging Face's `@huggingface/jinja` npm package (the
 * renderer of transformers.js, with trim_blocks and lstrip_blocks on as
 * transformers renders). It is not a dependency of kinfer and `make test`
 * never runs this script; regenerate by hand:
 *
 *   mkdir -p /tmp/jinja-npm && cd /tmp/jinja-npm && npm install @huggingface/jinja@0.5.11
 *   cd <repo> && NODE_PATH=/tmp/jinja-npm/node_modules node tests/golden/jinja_golden.js
 *
 * Output (tests/data/jinja/golden.json, overwritten):
 *   {"reference", "cases": [{name, template, context, output | error}]}
 * A case with `error` is one the reference refuses (at parse or render);
 * for raise_exception the error is the message the template raised.
 *
 * Where Python's Jinja (which transformers runs) and the reference differ -
 * strip('x') with characters (the reference ignores them), % of a negative
 * number, the `float` test, the select and reject filters - the cases
 * here stay on common ground and tests/test_jinja.c checks Python's answer
 * on its own.
 *
 * Deterministic: no clock, no randomness. */
'use strict';
const fs = require('fs');
const path = require('path');
const { Template } = require('@huggingface/jinja');

/* The package's exports hide package.json: read it beside the entry point. */
const PKG = path.join(path.dirname(require.resolve('@huggingface/jinja')), '..', 'package.json');
const REF = '@huggingface/jinja@' + JSON.parse(fs.readFileSync(PKG, 'utf8')).version + ' (npm)';
const OUT = path.join(__dirname, '..', 'data', 'jinja');
fs.mkdirSync(OUT, { recursive: true });

/* ---- family-style templates ------------------------------------------------ */
const T = {};

/* ChatML: a default system turn when the chat has none. */
T.chatml = `{%- for message in messages %}
    {%- if loop.first and message['role'] != 'system' %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>' + '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
`;

/* Llama 3: headers around each turn, the system text taken out first. */
T.llama3 = `{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set sys_text = messages[0]['content'] | trim %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set sys_text = '' %}
    {%- set turns = messages %}
{%- endif %}
{%- if sys_text %}
    {{- '<|start_header_id|>system<|end_header_id|>\\n\\n' ~ sys_text ~ '<|eot_id|>' }}
{%- endif %}
{%- for m in turns %}
    {%- if m.role not in ['user', 'assistant', 'ipython'] %}
        {{- raise_exception('Unsupported role: ' ~ m.role) }}
    {%- endif %}
    {{- '<|start_header_id|>' ~ m.role ~ '<|end_header_id|>\\n\\n' ~ m.content | trim ~ '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
`;

/* Mistral: [INST] blocks, roles must alternate after an optional system. */
T.mistral = `{%- if messages[0].role == 'system' %}
    {%- set preamble = messages[0].content %}
    {%- set chat = messages[1:] %}
{%- else %}
    {%- set chat = messages %}
{%- endif %}
{{- bos_token }}
{%- for msg in chat %}
    {%- if (msg.role == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if msg.role == 'user' %}
        {%- if loop.last and preamble is defined %}
            {{- '[INST] ' + preamble + '\\n\\n' + msg.content + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + msg.content + '[/INST]' }}
        {%- endif %}
    {%- elif msg.role == 'assistant' %}
        {{- ' ' + msg.content + eos_token }}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported!') }}
    {%- endif %}
{%- endfor %}
`;

/* Qwen 3: a namespace finds the last real user query; assistant turns
 * after it keep their reasoning in <think>, earlier ones lose it. */
T.qwen3 = `{%- set st = namespace(last_user=-1, turns=0) %}
{%- for m in messages %}
    {%- if m.role == 'user' and not m.content.startswith('<tool_response>') %}
        {%- set st.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for m in messages %}
    {%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}
    {%- elif m.role == 'assistant' %}
        {%- set answer = m.content %}
        {%- set thought = '' %}
        {%- if m.reasoning_content is string %}
            {%- set thought = m.reasoning_content %}
        {%- elif '</think>' in m.content %}
            {%- set answer = m.content.split('</think>')[-1].lstrip() %}
            {%- set thought = m.content.split('</think>')[0].rstrip().split('<think>')[-1].lstrip() %}
        {%- endif %}
        {%- set st.turns = st.turns + 1 %}
        {%- if loop.index0 > st.last_user and (loop.last or thought) %}
            {{- '<|im_start|>assistant\\n<think>\\n' + thought.strip() + '\\n</think>\\n\\n' + answer }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + answer }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
`;

/* ---- conversations ---------------------------------------------------------- */
const chats = {
  single: [{ role: 'user', content: 'Hello!' }],
  system: [
    { role: 'system', content: '  You answer in one line.  ' },
    { role: 'user', content: 'What is 2+2?' },
  ],
  multi: [
    { role: 'user', content: 'Bonjour, ça va ?' },
    { role: 'assistant', content: 'Très bien, merci ! 😀' },
    { role: 'user', content: '日本語で答えて。\nLine two.' },
  ],
  system_multi: [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Name a colour.' },
    { role: 'assistant', content: 'Blue.' },
    { role: 'user', content: 'Another, with "quotes" and \\backslash.' },
    { role: 'assistant', content: 'Red.' },
  ],
  think: [
    { role: 'user', content: 'Why is the sky blue?' },
    { role: 'assistant', content: '<think>\nRayleigh scattering.\n</think>\n\nShort light scatters more.' },
    { role: 'user', content: 'And sunsets?' },
    { role: 'assistant', content: '<think>\nLonger path.\n</think>\n\nThe blue is scattered away.' },
  ],
  think_last: [
    { role: 'system', content: 'Think first.' },
    { role: 'user', content: 'Is 7 prime?' },
    { role: 'assistant', content: 'Yes.', reasoning_content: 'Divisors: 1 and 7.' },
  ],
  tool_reply: [
    { role: 'user', content: 'Weather?' },
    { role: 'assistant', content: '<think>\nAsk the tool.\n</think>\n\nChecking.' },
    { role: 'user', content: '<tool_response>sunny</tool_response>' },
    { role: 'assistant', content: '<think>\nIt said sunny.\n</think>\n\nSunny.' },
  ],
  not_alternating: [
    { role: 'user', content: 'one' },
    { role: 'user', content: 'two' },
  ],
  bad_role: [
    { role: 'user', content: 'hi' },
    { role: 'tool', content: '{}' },
  ],
};

const cases = [];
function add(name, template, context) {
  const c = { name, template, context };
  try {
    c.output = new Template(template).render(context);
  } catch (e) {
    c.error = String(e && e.message !== undefined ? e.message : e);
  }
  cases.push(c);
}

const specials = {
  chatml: {},
  llama3: { bos_token: '<|begin_of_text|>', eos_token: '<|eot_id|>' },
  mistral: { bos_token: '<s>', eos_token: '</s>' },
  qwen3: {},
};
for (const fam of Object.keys(T))
  for (const [cname, msgs] of Object.entries(chats))
    for (const agp of [true, false])
      add(`${fam}/${cname}/${agp ? 'gen' : 'nogen'}`, T[fam],
          Object.assign({ messages: msgs, add_generation_prompt: agp }, specials[fam]));
add('qwen3/think/no_thinking', T.qwen3,
    { messages: chats.think, add_generation_prompt: true, enable_thinking: false });

/* ---- single features ------------------------------------------------------- */
const items = { messages: chats.system_multi, add_generation_prompt: true,
                tools: [{ name: 'get_weather', parameters: { city: 'string', days: 3, metric: true, extra: null } }],
                n: 7, x: 2.5, word: 'héllo wörld', empty: '' };
const features = {
  loop_vars: `{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.length }}/{{ loop.first }}/{{ loop.last }};{% endfor %}`,
  for_else: `{% for m in messages if m.role == 'tool' %}{{ m.content }}{% else %}no tools{% endfor %}`,
  for_filter: `{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content }} {% endfor %}`,
  slices: `{{ messages[1:] | length }} {{ messages[-2:] | map(attribute='role') | join(',') }} {% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %} {{ word[1:4] }} {{ word[::-1] }} {{ word[-3:] }}`,
  ternary: `{{ 'yes' if add_generation_prompt else 'no' }} {{ 'a' if false }}|{{ n if n > 5 else 0 }}`,
  logic: `{{ true and 'x' }} {{ false or 'y' }} {{ not empty }} {{ 'u' in 'user' }} {{ 'z' not in 'user' }} {{ 3 in [1, 2, 3] }} {{ 'name' in tools[0] }}`,
  tests: `{{ missing is defined }} {{ n is defined }} {{ none is none }} {{ word is string }} {{ tools[0] is mapping }} {{ n is number }} {{ n is integer }} {{ n is odd }} {{ n is even }} {{ true is boolean }} {{ missing is undefined }} {{ n is not string }} {{ tools is iterable }}`,
  filters: `{{ '  pad  ' | trim }}|{{ word | upper }}|{{ 'MiXed' | lower }}|{{ 'user' | capitalize }}|{{ messages | length }}|{{ word | length }}|{{ missing | default('dflt') }}|{{ empty | default('e', true) }}|{{ messages | first | tojson }}|{{ (messages | last).content }}|{{ ['a', 'b', 'c'] | join('-') }}|{{ word | replace('l', 'L') }}`,
  items: `{% for k, v in tools[0].parameters | items %}{{ k }}={{ v }};{% endfor %}{% for k, v in tools[0].parameters.items() %}[{{ k }}]{% endfor %}`,
  tojson: `{{ tools | tojson }}\n{{ tools[0] | tojson(indent=2) }}\n{{ word | tojson }} {{ 'tab\\tquote"' | tojson }} {{ none | tojson }} {{ [1, 2.5, true] | tojson }}`,
  methods: `{{ '  a b  '.strip() }}|{{ 'a,b,,c'.split(',') | length }}|{{ ' a  b c '.split() | join('+') }}|{{ 'Hello'.startswith('He') }}|{{ 'Hello'.endswith(('x', 'lo')) }}|{{ word.upper() }}|{{ tools[0].get('name') }}|{{ tools[0].get('none', 'fallback') }}|{{ 'a-b-c'.replace('-', '+') }}|{{ 'a:b:c'.split(':', 1)[1] }}`,
  set_ns: `{% set ns = namespace(count=0, text='') %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.text = ns.text ~ m.role[0] %}{% set inner = 'scoped' %}{% endfor %}{{ ns.count }} {{ ns.text }} [{{ inner }}]`,
  set_block: `{% set greeting %}Hi {{ messages[1].content | lower }}{% endset %}{{ greeting | upper }}`,
  arith: `{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ n * 2 + 1 }} {{ x * 2 }} {{ 1 + 0.5 }} {{ n - 10 }} {{ 10 / 4 }} {{ 0.1 + 0.2 }}`,
  compare: `{{ n == 7 }} {{ n != 7 }} {{ n < 10 }} {{ n >= 7.0 }} {{ 'a' == 'a' }} {{ messages[0].role == 'system' }} {{ none == none }}`,
  concat: `{{ 'a' ~ 1 ~ true ~ 2.5 }} {{ 'a' + 'b' }} {{ [1] + [2, 3] }} {{ tools[0].parameters }}`,
  undefined_prints_empty: `[{{ missing }}][{{ missing.attr }}][{{ none }}][{{ messages[99] }}]`,
  macro: `{% macro turn(role, text='(none)') %}<{{ role }}>{{ text }}</{{ role }}>{% endmacro %}{{ turn('user', 'hi') }}{{ turn('assistant') }}{{ turn(role='x', text='y') }}`,
  whitespace: `A\n  {% if true %}\n  B\n  {% endif %}\n  {# comment #}\n  C {{- ' D ' -}} E\n{%- for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\nF\n`,
  whitespace_crlf: `a\r\n  {% if true %}\r\n  b\r\n  {%- endif %}\r\n\t{# c #}\r\nd\r  {% set x = 1 %}e`,
  raw_dict_list: `{% set d = {'k': 'v', 'n': 1} %}{{ d.k }}{{ d['n'] }} {{ d | length }} {{ [1, 'two', none] }}`,
  break_continue: `{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{% if loop.index0 == 3 %}{% break %}{% endif %}{{ m.role }};{% endfor %}`,
  selectattr: `{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='content') | join('|') }}`,
  string_filter: `{{ 3 | string }}{{ true | string }}{{ [1, 'a'] | string }}{{ 2.0 }}{{ -0.5 }}`,
  dictsort: `{% for k, v in {'b': 2, 'A': 1, 'c': 0} | dictsort %}{{ k }}{{ v }}{% endfor %}`,
  dict_loop: `{% for key in tools[0].parameters %}{{ key }},{% endfor %}`,
  errors_raise: `{{ raise_exception('Custom failure: ' ~ messages[0].role) }}`,
};
for (const [name, tpl] of Object.entries(features)) add(`feature/${name}`, tpl, items);

fs.writeFileSync(path.join(OUT, 'golden.json'),
                 JSON.stringify({ reference: REF, cases }, null, 1) + '\n');
console.log(`wrote ${cases.length} cases to ${path.join(OUT, 'golden.json')}`);
