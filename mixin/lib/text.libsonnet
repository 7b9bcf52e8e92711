// What the rules, the alerts and the dashboard share: selectors built from label matchers, and
// numbers and durations written out for people.
{
  // `metric{m1, m2, …}` of the non-empty matchers, or the bare metric when there are none
  // (`metric{}` is not valid PromQL).
  selector(metric, matchers)::
    local present = [m for m in matchers if m != ''];
    if std.length(present) == 0 then metric else '%s{%s}' % [metric, std.join(', ', present)],

  // A label list for `by (…)` and `on (…)`.
  labels(names):: std.join(', ', names),

  // '15m' → '15 minutes', '1h' → '1 hour'. One unit only.
  words(duration)::
    local n = std.length(duration);
    local units = { s: 'second', m: 'minute', h: 'hour', d: 'day', w: 'week', y: 'year' };
    local unit = duration[n - 1];
    assert n >= 2 && std.objectHas(units, unit) : 'not a one-unit duration: %s' % duration;
    local count = std.parseInt(duration[0:n - 1]);
    '%d %s%s' % [count, units[unit], if count == 1 then '' else 's'],

  // A number of seconds in the largest unit that divides it: 86400 → '1 day', 5400 → '90 minutes'.
  seconds(n)::
    if n % 86400 == 0 then self.words('%dd' % (n / 86400))
    else if n % 3600 == 0 then self.words('%dh' % (n / 3600))
    else if n % 60 == 0 then self.words('%dm' % (n / 60))
    else self.words('%ds' % n),

  // 0.25 → '25', to one decimal at most (0.125 → '12.5').
  percent(share)::
    local tenths = std.floor(share * 1000 + 0.5);  // jsonnet 0.18 has no std.round
    if tenths % 10 == 0 then '%d' % (tenths / 10) else '%d.%d' % [std.floor(tenths / 10), tenths % 10],

  // A number as PromQL reads it: 3, 0.2, 1000.
  number(x):: if x == std.floor(x) && std.abs(x) < 1e15 then '%d' % x else '%.15g' % x,

  // `s` inside a Go template's double-quoted string.
  goString(s):: std.strReplace(std.strReplace(s, '\\', '\\\\'), '"', '\\"'),

  // `s` inside a Go template's printf format: a double-quoted string in which % is doubled.
  goFormat(s):: std.strReplace(self.goString(s), '%', '%%'),
}
