//! Small templates, one or a few constructs each, that chat templates use:
//! printing, tojson, Python methods, Jinja2 filters and tests, loops,
//! namespaces, whitespace control, generation blocks, errors. Rendered with
//! [`VARS`] and a short conversation by prep-chat and by transformers.

/// The variables every construct is rendered with (besides `messages`,
/// `tools` and `add_generation_prompt`).
pub const VARS: &str = r#"{
 "bos_token": "<s>", "eos_token": "</s>",
 "x": [1, "a", null, true, 1.5, "it's"],
 "d": {"k": "it's", "n": 1, "f": 1e-05, "l": [1, 2], "t": true, "z": null, "q": "say \"hi\"", "both": "'\"", "u": "é中😀\u200d\u0007\u00a0"},
 "s": "  Hello, World! hello\tworld  \n",
 "lines": "a\nb\r\nc\n\nd\u2028e",
 "f": 1e16, "g": 0.1, "h": 2.5, "big": 1.5e300, "tiny": 1e-7, "i": 42, "neg": -7, "e": "", "t": true, "n": null,
 "words": "they're bill's friends-from the UK (ǆungla) [x]",
 "csv": "a,b,,c",
 "nested": {"a": {"b": [1, {"c": "deep"}]}}
}"#;

/// The conversation the constructs see.
pub const MESSAGES: &str = r#"[
 {"role": "system", "content": "Sys «prompt»"},
 {"role": "user", "content": "Héllo 😀"},
 {"role": "assistant", "content": "Ça va? 中文", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1.5}}}]},
 {"role": "user", "content": "  bye  "}
]"#;

/// The documents of the `documents` construct.
pub const DOCUMENTS: &str =
    r#"[{"title": "Doc «1»", "text": "Body\nwith a newline", "score": 0.5}]"#;

/// Constructs that render in transformers but that prep refuses (see the
/// crate docs): (name, source).
pub const REFUSED: &[(&str, &str)] = &[
    ("percent-format", "{{ '%s-%d' % ('a', 3) }}"),
    (
        "generation-in-macro",
        "{% macro m() %}{% generation %}x{% endgeneration %}{% endmacro %}a{{ m() }}b",
    ),
    (
        "generation-in-set-block",
        "{% set v %}{% generation %}x{% endgeneration %}{% endset %}a{{ v }}",
    ),
];

/// Constructs that fail in transformers but that prep renders: Python's
/// iterators (`dict.items()`, `range()`, the `select`, `map` and `reverse`
/// filters' generators), which `json.dumps` refuses, are lists to
/// minijinja. (name, source).
pub const LENIENT: &[(&str, &str)] = &[
    ("tojson-range", "{{ range(3) | tojson }}"),
    ("tojson-map", "{{ x | map('string') | tojson }}"),
    ("tojson-reverse", "{{ x | reverse | tojson }}"),
    ("tojson-select", "{{ x | select('string') | tojson }}"),
    ("tojson-items", "{{ d.items() | tojson }}"),
];

/// (name, source) of each construct.
pub const CONSTRUCTS: &[(&str, &str)] = &[
    // Printing is Python's str().
    ("print-values", "{{ x }}|{{ d }}|{{ n }}|{{ t }}|{{ f }}|{{ g }}|{{ tiny }}|{{ big }}|{{ i }}|{{ neg }}|{{ undefined_var }}|{{ nested }}|{{ h }}"),
    ("print-tuples", "{{ (1, 'a') }}{{ (1,) }}{{ () }}{{ ('x', [1, (2,)]) }}"),
    ("print-float-list", "{{ [1e-05, 1e16, 0.1, 2.0, -0.0, 1e300 * 10, 123456789.125] }}"),
    ("print-literals", "{{ 1e16 }} {{ 1.0 }} {{ 1e-5 }} {{ 3 }} {{ none }} {{ True }} {{ false }} {{ 'a\\'b' }}"),
    ("arithmetic", "{{ 1 / 3 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ -7 // 2 }} {{ 1.0 * 3 }} {{ 0.1 + 0.2 }} {{ 10 ** 20 }} {{ 4 / 2 }}"),
    ("repeat", "{{ 'ab' * 3 }}|{{ [1] * 2 }}|{{ '=' * 0 }}"),
    ("concat-tilde", "{{ 'a' ~ 1 ~ none ~ true ~ 2.5 ~ undefined_var ~ 'z' }}"),
    ("concat-plus", "{{ 'a' + 'b' }}{{ [1] + [2] }}{{ x + [7] }}"),
    ("concat-str-int", "{{ 'abc' + 1 }}"),
    ("concat-undefined", "{{ undefined_var + 'a' }}"),
    ("string-filter", "{{ x | string }}|{{ d | string }}|{{ n | string }}|{{ g | string }}|{{ undefined_var | string }}|{{ tiny | string }}"),
    ("join-mixed", "{{ x | join(', ') }}|{{ x | join }}|{{ 'abc' | join('-') }}|{{ d | join(',') }}"),
    ("join-attribute", "{{ messages | map(attribute='role') | join('|') }}|{{ messages | join(',', attribute='role') }}"),
    // tojson is json.dumps.
    ("tojson-default", "{{ d | tojson }}|{{ x | tojson }}|{{ messages | tojson }}"),
    ("tojson-indent", "{{ d | tojson(indent=2) }}\n{{ x | tojson(indent=4) }}\n{{ nested | tojson(indent='\\t') }}"),
    ("tojson-options", "{{ d | tojson(sort_keys=true) }}|{{ d | tojson(separators=(',', ':')) }}|{{ d | tojson(ensure_ascii=true) }}"),
    ("tojson-empty", "{{ {} | tojson(indent=2) }}{{ [] | tojson(indent=2) }}{{ {} | tojson }}{{ [] | tojson }}"),
    ("tojson-escapes", "{{ 'a<b>&\\'\"\\\\ \\n\\t\\r\\x7f\\x01 é 😀' | tojson }}|{{ 'a<b>\\u2028😀' | tojson(ensure_ascii=true) }}"),
    ("tojson-numbers", "{{ f | tojson }}{{ tiny | tojson }}{{ neg | tojson }}{{ g | tojson }}{{ h | tojson }}{{ t | tojson }}{{ n | tojson }}{{ (1e300 * 10) | tojson }}{{ (-1e300 * 10) | tojson }}{{ (1e300 * 10 - 1e300 * 10) | tojson }}"),
    ("tojson-tools", "{{ tools | tojson }}\n{% for t in tools %}{{ t | tojson(indent=4) }}\n{% endfor %}"),
    ("tojson-undefined", "{{ undefined_var | tojson }}"),
    ("tojson-positional", "{{ d | tojson(false, 1) }}"),
    // Python string methods.
    ("strip", "[{{ s | trim }}|{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' \\n') }}|{{ 'xxhixx'.strip('x') }}|{{ 'xyhi'.lstrip('yx') }}|{{ d.u.strip() }}|{{ s | trim('\\n ') }}]"),
    ("split", "{{ s.split() }}{{ s.split(',') }}{{ csv.split(',') }}{{ csv.split(',', 1) }}{{ csv.rsplit(',', 1) }}{{ s.split(None, 1) }}{{ csv.split(sep=',', maxsplit=2) }}{{ ''.split() }}{{ s.rsplit() }}"),
    ("split-index", "{{ 'a</think>b</think>c'.split('</think>')[-1] }}|{{ 'no tag'.split('</think>')[0] }}"),
    ("splitlines", "{{ lines.splitlines() }}{{ lines.splitlines(true) }}{{ ''.splitlines() }}"),
    ("affixes", "{{ s.startswith('  H') }}{{ s.endswith('\\n') }}{{ s.startswith(('x', '  ')) }}{{ 'abc'.endswith(('c',)) }}{{ 'abc'.startswith('b', 1) }}"),
    ("replace", "{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 2) }}|{{ s | replace('o', '0') }}|{{ s | replace('o', '0', 1) }}|{{ i | replace('4', 'four') }}"),
    ("case", "{{ words.title() }}|{{ words | title }}|{{ words.capitalize() }}|{{ words | capitalize }}|{{ words.upper() }}|{{ words | upper }}|{{ words.lower() }}|{{ words | lower }}|{{ 'ß'.upper() }}|{{ n | lower }}"),
    ("find", "{{ s.find('o') }}{{ s.rfind('o') }}{{ s.find('zz') }}{{ s.count('l') }}{{ s.index('W') }}{{ '中😀a😀'.find('a') }}{{ s.find('o', 6) }}"),
    ("index-missing", "{{ s.index('zz') }}"),
    ("str-join", "{{ ', '.join(['a', 'b']) }}{{ '-'.join('abc') }}{{ ''.join(messages | map(attribute='role')) }}"),
    ("str-join-int", "{{ ', '.join([1, 2]) }}"),
    ("str-misc", "{{ s.isspace() }}{{ '  '.isspace() }}{{ 'a-b'.partition('-') }}{{ 'pre_x'.removeprefix('pre_') }}{{ 'x.py'.removesuffix('.py') }}{{ 'abc'.isalpha() }}{{ '123'.isdigit() }}"),
    ("str-format", "{{ '{} is {}'.format('a', 1) }}|{{ '%s and %s' | format('a', 'b') }}|{{ '%d items' | format(3) }}"),
    // dict and list methods.
    ("dict-methods", "{{ d.items() | list }}|{{ d.keys() | list }}|{{ d.values() | list }}|{{ d.get('k') }}|{{ d.get('missing') }}|{{ d.get('missing', 'dflt') }}"),
    ("dict-items-loop", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }},{% endfor %}"),
    ("list-methods", "{{ x.count(1) }}{{ x.index('a') }}"),
    ("list-append", "{{ x.append(3) }}"),
    ("dict-update", "{{ d.update({'a': 1}) }}"),
    // Loops.
    ("loop-vars", "{% for m in messages %}{{ loop.index0 }}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.previtem.role if loop.previtem is defined }}|{{ loop.nextitem.role if loop.nextitem is defined else 'END' }};{% endfor %}"),
    ("loop-controls", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
    ("loop-filter-else", "{% for m in messages if m.role == 'user' %}{{ m.content }};{% else %}none{% endfor %}{% for a in [] %}x{% else %}empty{% endfor %}"),
    ("loop-scope", "{% set y = 0 %}{% for i in [1, 2, 3] %}{% if loop.first %}{% set y = 5 %}{% endif %}{{ y }},{% endfor %}{{ y }}"),
    ("loop-cycle", "{% for i in range(4) %}{{ loop.cycle('a', 'b') }}{% endfor %}"),
    ("namespace", "{% set ns = namespace(found=false, count=0, text='') %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.found = true %}{% set ns.count = ns.count + 1 %}{% set ns.text = ns.text + m.content %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.count }} {{ ns.text }}"),
    ("namespace-underscore", "{% set ns = namespace(_x=1) %}{{ ns._x }}"),
    // Tests.
    ("test-sequence", "{{ x is sequence }}{{ d is sequence }}{{ s is sequence }}{{ i is sequence }}{{ undefined_var is sequence }}{{ n is sequence }}"),
    ("test-iterable", "{{ x is iterable }}{{ d is iterable }}{{ s is iterable }}{{ i is iterable }}{{ undefined_var is iterable }}{{ n is iterable }}{{ t is iterable }}"),
    ("test-mapping", "{{ x is mapping }}{{ d is mapping }}{{ s is mapping }}{{ undefined_var is mapping }}{{ n is mapping }}"),
    ("test-types", "{{ s is string }}{{ i is string }}{{ i is number }}{{ g is number }}{{ t is number }}{{ t is integer }}{{ i is integer }}{{ i is float }}{{ g is float }}{{ t is boolean }}{{ i is boolean }}"),
    ("test-none-defined", "{{ n is none }}{{ undefined_var is none }}{{ n is defined }}{{ undefined_var is defined }}{{ undefined_var is undefined }}{{ d.missing is defined }}{{ d.z is none }}"),
    ("test-misc", "{{ t is true }}{{ 1 is true }}{{ false is false }}{{ i is odd }}{{ i is even }}{{ i is divisibleby 7 }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 'aB' is lower }}{{ 2 is in [1, 2] }}{{ i is eq 42 }}{{ i is gt 40 }}{{ raise_exception is callable }}"),
    ("in-operator", "{{ 'x' in s }}{{ 'k' in d }}{{ 1 in x }}{{ 'x' in undefined_var }}{{ 'Hello' not in s }}{{ 'tool_calls' in messages[2] }}"),
    ("comparisons", "{{ 1 == 1.0 }}{{ 'a' < 'b' }}{{ [1, 2] == [1, 2] }}{{ d == d }}{{ none == none }}{{ messages[0] == messages[0] }}{{ messages[0] != messages[1] }}"),
    // Filters.
    ("length", "{{ x | length }}{{ d | length }}{{ s | length }}{{ undefined_var | length }}{{ '中😀' | length }}{{ messages | count }}"),
    ("first-last", "{{ x | first }}{{ x | last }}{{ s | first }}{{ d | first }}{{ [] | first }}|{{ messages | last | tojson }}"),
    ("default", "{{ undefined_var | default('dflt') }}|{{ n | default('dflt') }}|{{ e | default('dflt', true) }}|{{ d.missing | d('x') }}|{{ e | default('dflt') }}"),
    ("selectattr", "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|{{ messages | rejectattr('role', 'eq', 'user') | map(attribute='content') | list }}|{{ messages | selectattr('tool_calls', 'defined') | list | length }}|{{ messages | selectattr('tool_calls') | map(attribute='role') | first }}"),
    ("select-reject", "{{ x | select('string') | list }}{{ x | reject('none') | list }}{{ [1, 2, 3, 4] | select('odd') | list }}{{ x | select | list }}"),
    ("map", "{{ messages | map(attribute='content') | map('upper') | list }}{{ ['a', 'b'] | map('upper') | join }}"),
    ("sort-unique-sum", "{{ [3, 1, 2] | sort }}{{ ['b', 'A', 'a'] | sort }}{{ [1, 2, 2, 3] | unique | list }}{{ [1, 2, 3] | sum }}{{ [1, 5, 3] | max }}{{ [1, 5, 3] | min }}{{ x | reverse | list }}{{ 'abc' | reverse }}"),
    ("items-filter", "{{ d | items | list }}|{% for k, v in d | items %}{{ k }};{% endfor %}|{{ d | dictsort }}"),
    ("indent", "[{{ s | indent(2) }}]|[{{ lines | indent(4, true) }}]|[{{ lines | indent(width='>', first=true, blank=true) }}]|[{{ 'a\\n\\nb' | indent }}]"),
    ("numbers", "{{ 3.7 | int }}{{ '42' | int }}{{ 'x' | int }}{{ '3.5' | float }}{{ 2.5 | round }}{{ 3.14159 | round(2) }}{{ -3 | abs }}{{ 7 | float }}"),
    ("list-filter", "{{ 'abc' | list }}{{ d | list }}{{ range(3) | list }}{{ range(1, 10, 3) | list }}"),
    ("slicing", "{{ s[::-1] }}|{{ x[1:3] }}|{{ x[-1] }}|{{ x[::2] }}|{{ s[2:7] }}|{{ '中😀abc'[1:3] }}|{{ messages[1:] | length }}|{{ x[10:] }}"),
    ("indexing", "{{ messages[-1].content }}{{ messages[0]['role'] }}{{ messages[2].tool_calls[0].function.arguments.a }}{{ d['k'] }}{{ d.k }}{{ x[0] }}{{ nested.a.b[1].c }}"),
    ("index-out-of-range", "[{{ x[10] }}]"),
    ("undefined-attr", "{{ undefined_var.attr }}"),
    ("undefined-chain", "[{{ d.missing }}]{{ d.missing.x }}"),
    ("undefined-loop", "[{% for a in undefined_var %}x{% endfor %}]{% if undefined_var %}y{% else %}n{% endif %}{{ undefined_var is none }}"),
    ("system-extraction", "{% if messages[0].role == 'system' %}{% set sys = messages[0].content %}{% set msgs = messages[1:] %}{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}[{{ sys }}]{{ msgs | length }}"),
    ("macro", "{% macro render(m, sep='|') %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{{ sep }}{% endmacro %}{% for m in messages %}{{ render(m) }}{% endfor %}{{ render(messages[0], sep='!') }}"),
    ("call-block", "{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}inside {{ i }}{% endcall %}"),
    ("filter-block", "{% filter upper %}abc {{ s }}{% endfilter %}"),
    ("set-block", "{% set block %}  x {{ i }} {% endset %}[{{ block }}]"),
    ("with", "{% with a = 1, b = i %}{{ a + b }}{% endwith %}"),
    ("dict-global", "{{ dict(a=1, b='x') }}|{{ dict(d, extra=2) | tojson }}"),
    ("dict-literal", "{{ {'a': 1, 'b': [1, 2], 'c': {'d': none}} }}|{{ {'z': 1, 'a': 2} | tojson }}"),
    ("string-escapes", "{{ 'tab\\there' }}|{{ \"q'uote\" }}|{{ 'new\\nline' }}|{{ '\\u00e9\\x41' }}"),
    ("tools-access", "{{ tools[0].function.name }}|{{ tools[0]['function']['parameters']['properties'] | list }}|{% for name, spec in tools[0].function.parameters.properties.items() %}{{ name }}:{{ spec.type }}{{ spec.default if spec.default is defined }};{% endfor %}|{{ tools | map(attribute='function') | map(attribute='name') | join(',') }}"),
    ("precedence", "{{ messages | length > 1 }}{{ not messages }}{{ -i | abs }}{{ 'a' if t else 'b' }}{{ 'a' if n }}|{{ i + 1 * 2 }}"),
    // strftime_now, raise_exception.
    ("strftime", "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%d %B %Y') }}|{{ strftime_now('%b %-d, %Y %I:%M %p') }}|{{ strftime_now('%A %j %e') }}"),
    ("raise", "{% if i > 1 %}{{ raise_exception('too big: ' ~ i) }}{% endif %}"),
    ("raise-in-macro", "{% macro m() %}{{ raise_exception('from macro') }}{% endmacro %}before{{ m() }}"),
    ("raise-in-loop", "{% for m in messages %}{% if m.role == 'assistant' %}{{ raise_exception('no assistant: ' + m.content) }}{% endif %}{% endfor %}"),
    // Whitespace control.
    ("ws-trim-lstrip", "  {% if true %}\n    yes\n  {% endif %}\nafter\n"),
    ("ws-trailing-newlines", "a\n\n"),
    ("ws-minus", "{%- if true -%}\n  x  \n{%- endif -%}\n  y"),
    ("ws-plus-lstrip", "  {%+ if true %}kept indent{% endif %}\n"),
    ("ws-plus-trim", "{% if true +%}\nnewline kept{% endif %}"),
    ("ws-variables", "{{ 'a' }}\n{{ 'b' }}\n  {{ 'c' }}\n"),
    ("ws-comments", "{# comment #}\nafter comment\n  {# indented comment #}\nx\n  {#- minus -#}  \ny"),
    ("ws-raw", "{% raw %}{{ not rendered }}{% endraw %}\n  {% raw %}\nx{% endraw %}"),
    ("ws-tabs", "\t{% if true %}\tx{% endif %}\n\t  {% for i in [1] %}\n{{ i }}\n\t{% endfor %}\n"),
    ("ws-crlf", "{% if true %}\r\nline\r\n{% endif %}\r\nend\r\n"),
    // More of what templates write.
    ("loop-changed-recursive", "{% for i in [1, 1, 2] %}{% if loop.changed(i) %}{{ i }}{% endif %}{% endfor %}|{% for k in [nested] recursive %}{{ loop.depth }}{{ k.a is defined }}{% endfor %}"),
    ("rare-filters", "{{ 'abc' | center(9) }}|{{ s | truncate(9) }}|{{ s | wordcount }}|{{ x | batch(4) | list }}|{{ x | slice(2) | list }}|{{ '<&>\"\\'' | e }}|{{ i | e }}|{{ s | truncate(9, true) }}|{{ s | truncate(12, end='…') }}|{{ 'ab' | center(7) }}|{{ 'ab' | center(6) }}|{{ 'abc' | center(6) }}|{{ 'héllo wörld_1 x2' | wordcount }}|{{ x | truncate }}"),
    ("str-pad", "[{{ 'ab'.center(7, '*') }}][{{ 'ab'.ljust(5) }}][{{ 'ab'.rjust(5, '-') }}][{{ 'Ⅻ²3'.isnumeric() }}{{ '²'.isdigit() }}{{ '²'.isdecimal() }}{{ 'é1'.isalnum() }}{{ 'ǅ'.islower() }}{{ 'ABC1'.isupper() }}]"),
    ("joiner-cycler", "{% set j = joiner(', ') %}{% for i in [1, 2] %}{{ j() }}{{ i }}{% endfor %}|{% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.current }}{{ c.next() }}{{ c.next() }}{% set _ = c.reset() %}{{ c.current }}"),
    ("tuple-unpack", "{% set a, b = 1, 'two' %}{{ a }}{{ b }}{% for a, b in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}"),
    ("tilde-values", "{{ 'x' ~ x }}|{{ 'x' ~ (1, 2) }}|{{ 'x' ~ g }}|{{ 'x' ~ nested }}|{{ 'x' ~ h ~ i ~ t ~ n }}"),
    ("truthiness", "{% if x %}1{% endif %}{% if d %}2{% endif %}{% if e %}3{% endif %}{% if [] %}4{% endif %}{% if {} %}5{% endif %}{% if 0 %}6{% endif %}{% if 0.0 %}7{% endif %}{% if n %}8{% endif %}{% if '0' %}9{% endif %}"),
    ("bool-arithmetic", "{{ true + 1 }}|{{ 1 == true }}|{{ 0 == false }}|{{ '5' | int + 1 }}|{{ i | string | length }}"),
    ("missing-items", "[{{ 'abc'[5] }}][{{ d['missing'] }}][{{ none.x }}][{{ messages[0].content[0] }}][{{ d.n.x }}]"),
    ("none-chain", "{{ n.x.y }}"),
    ("zero-division", "{{ 7 / 0 }}"),
    ("selectattr-in", "{{ messages | selectattr('role', 'in', ['user', 'system']) | list | length }}|{{ d | dictsort(reverse=true) | first }}|{{ messages | sort(attribute='role') | map(attribute='role') | join(',') }}"),
    ("unicode-compare", "{{ 'é' > 'z' }}{{ 'a' in ['a'] }}{{ 'B' < 'a' }}{{ [1, 2] < [1, 3] }}"),
    ("dictsort-tools", "{% for k, v in tools[0].function.parameters.properties | dictsort %}{{ k }}={{ v.type }}{% if not loop.last %}, {% endif %}{% endfor %}"),
    ("floats-more", "{{ -0.0 }} {{ 0.1 * 3 }} {{ 1e22 }} {{ 1e15 + 0.3 }} {{ 5e-324 }} {{ 1.7976931348623157e308 }} {{ 100.0 }} {{ 1e16 / 3 }}"),
    ("macro-args", "{% macro m(a, b=2) %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(b=5, a=4) }}"),
    ("documents", "{% for doc in documents %}{{ doc.title }}: {{ doc.text }}|{{ doc | tojson }}{% endfor %}{{ documents is none }}"),
    ("builtin-names", "{{ range(3) | list }}{{ lipsum is defined }}{{ cycler is defined }}{{ joiner is defined }}{{ debug is defined }}{{ namespace is defined }}"),
    ("add-generation-prompt", "{{ add_generation_prompt }}{{ add_generation_prompt is defined }}{{ tools is none }}"),
    ("string-iteration", "{% for c in 'héllo' %}{{ c }}.{% endfor %}{{ 'héllo' | list }}"),
    ("nested-generation-loop", "{% for m in messages %}{% generation %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}{% endgeneration %}{% endfor %}"),
    ("generation-colon", "a{% generation: %}b{% endgeneration %}c"),
    ("big-ints", "{{ 12345678901234567890 }} {{ 2 ** 63 }} {{ -(2 ** 63) }} {{ 2 ** 64 + 1 }}"),
    ("modulo-signs", "{{ -7 % 3 }} {{ 7 % -3 }} {{ -7.5 % 2 }} {{ 7.5 // 2 }} {{ -7 // 2.0 }} {{ 2 ** -1 }} {{ 2 ** 0.5 }}"),
    ("dot-index", "{{ messages.0.role }}|{{ x.1 }}"),
    ("str-format-more", "{{ '{0}-{1}-{0}'.format('a', 'b') }}|{{ '{name}!'.format(name='n') }}|{{ '{:>5}|{:<4}|{:^6}'.format('r', 'l', 'c') }}|{{ '{:.2f}'.format(h) }}"),
    ("filters-more", "{{ undefined_var | default(none) }}|{{ [{'n': 1}, {'n': 2}] | sum(attribute='n') }}|{{ ['1', '2'] | map('int') | sum }}|{{ ['b', 'A', 'c'] | min }}|{{ ['b', 'A', 'c'] | max }}|{{ ['a', 'A', 'b'] | unique | list }}|{{ d | dictsort(by='key') | first }}|{{ x | map('string') | join(',') }}|{{ [1, 2] | join }}|{{ 'abc' | upper | list }}"),
    ("groupby", "{% for g in messages | groupby('role') %}{{ g.grouper }}:{{ g.list | length }};{% endfor %}"),
    ("recursive-macro", "{% macro ty(s) %}{% if s.type == 'object' %}{ {% for k, v in s.properties.items() %}{{ k }}: {{ ty(v) }}{% if not loop.last %}, {% endif %}{% endfor %} }{% elif s.type == 'array' %}{{ ty(s['items']) }}[]{% elif s.enum is defined %}{{ s.enum | map('tojson') | join(' | ') }}{% else %}{{ s.type }}{% endif %}{% endmacro %}{% for t in tools %}{{ t.function.name }}({{ ty(t.function.parameters) }})\n{% endfor %}"),
    ("tests-more", "{{ i is sameas 42 }}{{ n is sameas none }}{{ 'abc' is in 'xabcx' }}{{ x is not none and x | length > 0 }}{{ s is escaped }}"),
    ("content-parts-join", "{% set parts = [{'type': 'text', 'text': 'a'}, {'type': 'image'}, {'type': 'text', 'text': 'b'}] %}{{ parts | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\\n') }}"),
    ("reverse-loop", "{% set ns = namespace(last=-1) %}{% for m in messages[::-1] %}{% set idx = (messages | length - 1) - loop.index0 %}{% if ns.last == -1 and m.role == 'user' %}{% set ns.last = idx %}{% endif %}{% endfor %}{{ ns.last }}"),
    ("think-split", "{% set c = '<think>\\nreason\\n</think>\\n\\nanswer' %}{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[-1].lstrip('\\n') }}"),
    ("map-tojson", "{{ tools | map('tojson') | join('\\n') }}|{{ x | map('tojson') | list }}"),
    ("repeat-edge", "[{{ 'ab' * -1 }}][{{ [1] * 0 }}][{{ 'a' * true }}][{{ 2 * 'b' }}]"),
    ("tojson-list", "{{ x | select('string') | list | tojson }}{{ x[::-1] | tojson }}{{ (1, 'a') | tojson }}"),
    ("ws-mixed", "a  {% if true %}b{% endif %}\n{% if true %}\n\nc{% endif %}\n\n  d {%- if true %} e {% endif -%}  \n\t {%+ if true %}f{%- endif +%}\n{%- raw -%}  g  {%- endraw -%}  \n   {# c #}   h\n"),
    ("ws-line-end", "{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n{% if false %}\nno\n{% else %}\n  else\n{% endif %}"),
    ("namespace-object", "{% set ns = namespace(a=1) %}{{ ns is mapping }}{{ ns }}|{{ ns.a }}{{ ns.b is defined }}"),
    ("namespace-tojson", "{% set ns = namespace(a=1) %}{{ ns | tojson }}"),
    ("filter-kwargs", "{{ e | default('dflt', boolean=true) }}|{{ n | default(default_value='dv') }}|{{ [3, 1, 2] | sort(reverse=true) }}|{{ messages | map(attribute='missing', default='x') | list }}|{{ messages | unique(attribute='role') | map(attribute='role') | list }}|{{ x | batch(4, 'fill') | list }}|{{ x | slice(4, 'f') | list }}|{{ [1, 2] | sum(start=10) }}|{{ 2.567 | round(1, 'floor') }}|{{ 2.561 | round(2, 'ceil') }}|{{ d | dictsort(false, 'value') | first if false else 1 }}"),
    // Generation blocks.
    ("generation-loop", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}"),
    ("generation-ws", "x\n  {%- generation %}\n  body\n  {% endgeneration -%}\n  y\n{% generation -%}   z   {%- endgeneration %}\nw"),
    ("generation-nested", "ab{% generation %}c{% generation %}dé{% endgeneration %}f{% endgeneration %}g"),
    ("generation-empty", "a{% generation %}{% endgeneration %}b{% generation %}{{ '' }}{% endgeneration %}"),
    ("generation-raise", "{% generation %}x{{ raise_exception('inside') }}{% endgeneration %}"),
    ("generation-unicode", "😀{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}|{% endfor %}"),
];

/// Larger templates in the style of recent models' (written for this test,
/// not copied), rendered like the corpus templates on every synthetic
/// conversation: reasoning split out of the content, tools as typed
/// signatures through recursive macros, generation blocks. (name, source).
pub const EXTRA_TEMPLATES: &[(&str, &str)] = &[
    (
        "extra:reasoning-tools",
        r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- generation %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- content }}
            {%- endif %}
        {%- else %}
            {{- content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"##,
    ),
    (
        "extra:typed-signatures",
        r##"{#- Tools as typed signatures, through a recursive macro. -#}
{%- macro render_type(spec, required=[]) -%}
    {%- if spec.type == "object" and spec.properties is defined -%}
        {{- "{\n" -}}
        {%- for name, prop in spec.properties | items -%}
            {{- "  " ~ name -}}
            {%- if name not in required %}{{ "?" }}{% endif -%}
            {{- ": " ~ render_type(prop, prop.required | default([])) -}}
            {%- if prop.description is defined %}{{ " // " ~ prop.description | trim }}{% endif -%}
            {{- ",\n" if not loop.last else "\n" -}}
        {%- endfor -%}
        {{- "}" -}}
    {%- elif spec.type == "array" -%}
        {{- render_type(spec['items'] | default({'type': 'any'})) ~ "[]" -}}
    {%- elif spec.enum is defined -%}
        {{- spec.enum | map("tojson") | join(" | ") -}}
    {%- elif spec.type in ["integer", "number"] -%}
        {{- "number" -}}
        {%- if spec.default is defined %}{{ " = " ~ spec.default | string }}{% endif -%}
    {%- else -%}
        {{- spec.type | default("any") -}}
    {%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- if tools is not none and tools | length > 0 -%}
<|system|>
{% for tool in tools -%}
{%- set f = tool.function -%}
// {{ f.description | default("") | replace("\n", " ") }}
type {{ f.name }} = (_: {{ render_type(f.parameters, f.parameters.required | default([])) }}) => any;
{% endfor -%}
<|end|>
{% endif -%}
{%- for message in messages -%}
    {%- if message.role == "assistant" -%}
<|assistant|>
{% generation -%}
{%- if message.content -%}{{ message.content | trim }}{%- endif -%}
{%- for call in message.tool_calls | default([]) %}
<|call|>{{ call.function.name }}({{ call.function.arguments | tojson(sort_keys=true) }})
{%- endfor %}
<|end|>{{ eos_token }}
{% endgeneration -%}
    {%- elif message.role == "tool" -%}
<|tool|>{{ message.content if message.content is string else message.content | tojson(indent=2) }}<|end|>
{% else -%}
<|{{ message.role }}|>
{{ message.content | string | trim }}<|end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|assistant|>
{% endif -%}
"##,
    ),
];
