// A Prometheus rule file as YAML text, written for people as well as for Prometheus: a header
// of comments, each rule after its own comment (a rule's hidden field `comment`), its fields
// in a fixed order (record or alert, expr, for, labels, annotations), a multi-line expression
// as a literal block and a long annotation folded over lines (`>-`, which reads back as the
// same one-line string).
//
// std.manifestYamlDoc writes the same rules without the comments; any tool that manifests
// the mixin's prometheusRules and prometheusAlerts that way gets the same rules.
local width = 100;

// jsonnet 0.18's std.findSubstr, std.member on strings and std.escapeStringJson are written in
// jsonnet and slow on long strings: characters are looked up in objects, substrings found with
// std.strReplace, and strings quoted by the native std.toString.
local setOf(chars) = { [c]: true for c in std.stringChars(chars) };
local letters = setOf('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ');
local digits = setOf('0123456789');
local plainChars = letters + digits + setOf('_.:/-');
local indicators = setOf('-?:,[]{}#&*!|>\'"%@`');
local reserved = setOf('') + { 'true': true, 'false': true, yes: true, no: true, on: true, off: true, 'null': true, y: true, n: true };

// jsonnet 0.18 has no std.all.
local every(bools) = std.foldl(function(a, b) a && b, bools, true);
// Whether every character of `s` is in `set`, looking no further than the first that is not.
local all(s, set) =
  local n = std.length(s);
  local from(i) = if i == n then true else if !std.objectHas(set, s[i]) then false else from(i + 1) tailstrict;
  from(0);
local has(s, part) = std.strReplace(s, part, '') != s;
// `s` as a JSON (and YAML) double-quoted string.
local quoted(s) = local list = std.toString([s]); std.stripChars(list[1:std.length(list) - 1], ' ');

local units = setOf('smhdwy');
local isDuration(s) =
  std.length(s) >= 2 && std.length(s) <= 8
  && std.objectHas(units, s[std.length(s) - 1])
  && all(s[0:std.length(s) - 1], digits);

// A string YAML reads as that string without quotes.
local isPlain(s) =
  isDuration(s) || (
    std.length(s) > 0
    && std.objectHas(letters, s[0])
    && all(s, plainChars)
    && s[std.length(s) - 1] != ':'
    && !std.objectHas(reserved, std.asciiLower(s))
  );

// A one-line PromQL expression YAML reads as itself without quotes: no indicator first, no
// ": " or " #" inside, no space at either end.
local isPlainExpr(s) =
  std.length(s) > 0
  && !std.objectHas(indicators, s[0])
  && !has(s, ': ')
  && !has(s, ' #')
  && !has(s, '\t')
  && s[0] != ' '
  && s[std.length(s) - 1] != ' '
  && s[std.length(s) - 1] != ':';

// Words joined by single spaces, greedily into lines of at most `room` characters.
local wrap(words, room) =
  local n = std.length(words);
  local go(i, line, lines) =
    if i == n then lines + [line]
    else if std.length(line) + 1 + std.length(words[i]) <= room then go(i + 1, line + ' ' + words[i], lines) tailstrict
    else go(i + 1, words[i], lines + [line]) tailstrict;
  if n == 0 then [] else go(1, words[0], []);

// A string that folds back to itself: one line, single spaces between words, no space at
// either end (a line starting with a space would keep its line break).
local foldable(s) =
  std.length(s) > 0
  && !has(s, '\n')
  && !has(s, '\t')
  && !has(s, '  ')
  && s[0] != ' '
  && s[std.length(s) - 1] != ' ';

local spaces(n) = std.join('', std.makeArray(n, function(i) ' '));

// `key: value` at `indent`, as one or more lines.
local scalar(indent, key, value) =
  local head = spaces(indent) + key + ':';
  local body = spaces(indent + 2);
  local s = if std.isString(value) then value else std.toString(value);
  if !std.isString(value) then [head + ' ' + s]
  else if has(s, '\n') then
    local ends = std.endsWith(s, '\n');
    local text = if ends then s[0:std.length(s) - 1] else s;
    assert !std.endsWith(text, '\n') : '%s: more than one trailing newline' % key;
    assert text[0] != ' ' : '%s: a block starting with a space' % key;
    [head + (if ends then ' |' else ' |-')] + [if line == '' then '' else body + line for line in std.split(text, '\n')]
  else if isPlain(s) || (key == 'expr' && isPlainExpr(s)) then [head + ' ' + s]
  else if std.length(head) + 1 + std.length(quoted(s)) <= width || !foldable(s) then
    [head + ' ' + quoted(s)]
  else
    [head + ' >-'] + [body + line for line in wrap(std.split(s, ' '), width - std.length(body))];

// Comment lines of `text` (its last newline, if any, ends the comment), a line longer than
// the width wrapped.
local comment(indent, text) =
  local body = std.rstripChars(text, '\n');
  local room = width - indent - 2;
  local lines(line) = if std.length(line) <= room || !foldable(line) then [line] else wrap(std.split(line, ' '), room);
  if body == '' then []
  else [
    spaces(indent) + (if line == '' then '#' else '# ' + line)
    for line in std.flattenArrays([lines(l) for l in std.split(body, '\n')])
  ];

local mapping(indent, key, obj, order) =
  local keys = [k for k in order if std.objectHas(obj, k)]
               + [k for k in std.objectFields(obj) if !std.member(order, k)];
  [spaces(indent) + key + ':'] + std.flattenArrays([scalar(indent + 2, k, obj[k]) for k in keys]);

local rule(r) =
  local kind = if std.objectHas(r, 'record') then 'record' else 'alert';
  local known = { record: 1, alert: 1, expr: 1, 'for': 1, labels: 1, annotations: 1 };
  assert every([std.objectHas(known, k) for k in std.objectFields(r)]) : 'a rule field the writer does not know: %s' % std.objectFields(r);
  local fields = scalar(6, kind, r[kind])
                 + scalar(8, 'expr', r.expr)
                 + (if std.objectHas(r, 'for') then scalar(8, 'for', r['for']) else [])
                 + (if std.objectHas(r, 'labels') then mapping(8, 'labels', r.labels, []) else [])
                 + (if std.objectHas(r, 'annotations') then mapping(8, 'annotations', r.annotations, ['summary', 'description', 'runbook_url', 'ui_url']) else []);
  comment(6, if std.objectHasAll(r, 'comment') then r.comment else '')
  + ['      - ' + std.lstripChars(fields[0], ' ')]
  + fields[1:];

local group(g) =
  ['  - name: ' + g.name]
  + (if std.objectHas(g, 'interval') then ['    interval: ' + g.interval] else [])
  + ['    rules:']
  + std.join([''], [rule(r) for r in g.rules]);

{
  // The rule file of `rules` (an object with `groups`), after the comment `header`.
  manifest(rules, header)::
    std.join('\n', comment(0, header) + ['groups:'] + std.join([''], [group(g) for g in rules.groups])) + '\n',
}
