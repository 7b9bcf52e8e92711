// The Grafana dashboard: provisions from its file with no edits (a `datasource` variable, no
// import inputs), every panel with a unit, `$__rate_interval` in every rate, the variables
// cluster, job, broker, consumer_group, instance, biz_type and topic, links to the service's
// own pages through `idemgate_url`, deploys marked from idemgate_build_info's version label,
// and the optional parts (the Redis pre-filter, group commit, Galera, the process) in collapsed
// rows.
local text = import '../lib/text.libsonnet';

{
  grafanaDashboards+:: {
    local c = $._config,
    local ds = { type: 'prometheus', uid: '${datasource}' },

    // The template variables' matchers, each metric's selector built from them. Every series
    // of the service carries `broker` (the kind of broker it consumes), `up` does not.
    local filters = {
      cluster: c.clusterLabel + '=~"$cluster"',
      job: 'job=~"$job"',
      broker: 'broker=~"$broker"',
      consumer_group: 'consumer_group=~"$consumer_group"',
      instance: 'instance=~"$instance"',
      biz_type: 'biz_type=~"$biz_type"',
      topic: 'topic=~"$topic"',
    },
    local everything = ['broker', 'consumer_group', 'instance', 'biz_type', 'topic'],
    local noTopic = ['broker', 'consumer_group', 'instance', 'biz_type'],
    local noBizType = ['broker', 'consumer_group', 'instance', 'topic'],
    local groupInstance = ['broker', 'consumer_group', 'instance'],
    // `metric` filtered by the cluster, the job and the variables `names`, and `extra` matchers.
    local m(metric, names, extra=[]) =
      text.selector(metric, [filters.cluster, filters.job] + [filters[n] for n in names] + extra),
    // A series of the process (`process_*`, with broker but without consumer_group), kept to
    // the instances of the selected consumer groups through idemgate_build_info.
    local ofGroup(expr) =
      '%s * on (%s) group_left () max by (%s) (%s)' % [
        expr,
        text.labels([c.clusterLabel, 'job', 'instance']),
        text.labels([c.clusterLabel, 'job', 'instance']),
        m('idemgate_build_info', groupInstance),
      ],

    local link(title, path) = { title: title, url: '${idemgate_url}' + path, targetBlank: true },
    local at(x, y, w, h) = { gridPos: { x: x, y: y, w: w, h: h } },
    local targetsOf(queries) = [
      {
        datasource: ds,
        refId: std.char(std.codepoint('A') + i),
        editorMode: 'code',
        expr: queries[i][0],
        legendFormat: queries[i][1],
        range: true,
        instant: false,
      }
      for i in std.range(0, std.length(queries) - 1)
    ],

    // A stat panel: the last value of its one query, coloured by `steps`.
    local stat(id, title, unit, description, queries, links=[], steps=[], defaults={}) = {
      id: id,
      type: 'stat',
      title: title,
      description: description,
      datasource: ds,
      fieldConfig: {
        defaults: {
          unit: unit,
          color: { mode: 'thresholds' },
          thresholds: { mode: 'absolute', steps: steps },
        } + defaults,
        overrides: [],
      },
      targets: targetsOf(queries),
      links: links,
      options: {
        reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
        colorMode: 'value',
        graphMode: 'area',
        justifyMode: 'auto',
        orientation: 'auto',
        textMode: 'auto',
      },
    },

    // A time series panel: lines (`style` changes the drawing), a table legend with mean, max
    // and last; `dataLinks` are the links of a clicked series (absent when null).
    local timeseries(id, title, unit, description, queries, links=[], dataLinks=null, style={}, defaults={}, overrides=[], extra={}) = {
      id: id,
      type: 'timeseries',
      title: title,
      description: description,
      datasource: ds,
      fieldConfig: {
        defaults: {
          unit: unit,
          custom: {
            drawStyle: 'line',
            lineWidth: 1,
            fillOpacity: 10,
            showPoints: 'never',
            spanNulls: false,
            stacking: { mode: 'none', group: 'A' },
            axisSoftMin: 0,
          } + style,
          color: { mode: 'palette-classic' },
          thresholds: { mode: 'absolute', steps: [{ color: 'green', value: null }] },
        } + (if dataLinks == null then {} else { links: dataLinks }) + defaults,
        overrides: overrides,
      },
      targets: targetsOf(queries),
      links: links,
      options: {
        legend: { displayMode: 'table', placement: 'bottom', showLegend: true, calcs: ['mean', 'max', 'lastNotNull'] },
        tooltip: { mode: 'multi', sort: 'desc' },
      },
    } + extra,

    // A collapsed row at line `y`, holding `panels` placed below it (their y counted from the
    // row's next line). Grafana moves them into place when the row is opened.
    local row(id, title, y, panels) = {
      id: id,
      type: 'row',
      title: title,
      collapsed: true,
      gridPos: { x: 0, y: y, w: 24, h: 1 },
      panels: [p { gridPos+: { y: super.y + y + 1 } } for p in panels],
    },

    local queryVariable(name, label, description, query, multi, includeAll, hide=0) = {
      name: name,
      label: label,
      description: description,
      type: 'query',
      datasource: ds,
      definition: query,
      query: { query: query, refId: 'StandardVariableQuery' },
      refresh: 2,
      regex: '',
      sort: 1,
      multi: multi,
      includeAll: includeAll,
      options: [],
      hide: hide,
    } + (
      if includeAll then {
        // `.*` matches every value, the empty one included.
        allValue: '.*',
        current: { selected: true, text: if multi then ['All'] else 'All', value: if multi then ['$__all'] else '$__all' },
      } else { current: {} }
    ),

    local dashboardLink(title, path, tooltip) = {
      title: title,
      type: 'link',
      url: '${idemgate_url}' + path,
      targetBlank: true,
      icon: 'external link',
      tooltip: tooltip,
      asDropdown: false,
      includeVars: false,
      keepTime: false,
      tags: [],
    },

    'idemgate.json': {
      id: null,
      uid: c.dashboardUid,
      title: c.dashboardTitle,
      description: 'Idempotent consumption from RocketMQ, RabbitMQ or Kafka: throughput, duplicates and their causes, retries, dead letters, key collisions, latency, archive and reconcile.',
      tags: c.dashboardTags,
      editable: true,
      graphTooltip: 1,
      timezone: c.dashboardTimezone,
      time: { from: 'now-6h', to: 'now' },
      refresh: c.dashboardRefresh,
      schemaVersion: 39,
      version: 1,
      annotations: {
        list: [
          {
            // A version of the service that was not running 10 minutes earlier: a deploy.
            name: 'Deploys',
            datasource: ds,
            enable: true,
            hide: false,
            iconColor: 'blue',
            expr: 'count by (%(by)s) (%(info)s) unless count by (%(by)s) (%(info)s offset 10m)' % {
              by: text.labels([c.clusterLabel, 'broker', 'consumer_group', 'version']),
              info: m('idemgate_build_info', groupInstance),
            },
            step: '1m',
            titleFormat: 'Deployed {{version}} ({{consumer_group}}, {{broker}})',
            textFormat: 'Version {{version}} started in consumer group {{consumer_group}} on {{broker}}; it was not running 10 minutes before.',
            tagKeys: 'version,consumer_group,broker',
            useValueForTime: false,
          },
        ],
      },
      links: [
        dashboardLink('idemgate overview', '/', "The service's overview page"),
        dashboardLink('Trace a bizId', '/trace', 'Every delivery of one business key'),
        dashboardLink('Dead letters', '/dead-letters', 'Dead-lettered deliveries, with their bodies, for replay'),
        dashboardLink('Invalid', '/invalid', 'Deliveries rejected as invalid, with the reason'),
        dashboardLink('Key collisions', '/collisions', "Duplicates whose body differs from the claim's"),
        dashboardLink('Archive', '/archive', 'Archive runs'),
        dashboardLink('Anomalies', '/anomalies', 'What the last reconcile run found'),
      ],
      templating: {
        list: [
          {
            name: 'datasource',
            label: 'Data source',
            type: 'datasource',
            query: 'prometheus',
            current: {},
            options: [],
            regex: '',
            refresh: 1,
            hide: 0,
            includeAll: false,
            multi: false,
          },
          queryVariable(
            'cluster',
            'cluster',
            'The %s label of the series (one Prometheus watching several clusters); All when there is none.' % c.clusterLabel,
            'label_values(%s, %s)' % [text.selector('up', [c.idemgateSelector]), c.clusterLabel],
            multi=false,
            includeAll=true,
            hide=if c.showMultiCluster then 0 else 2,
          ),
          queryVariable(
            'job',
            'job',
            'The scrape job of the idemgate instances: the jobs of the targets %s matches.' % text.selector('up', [c.idemgateSelector]),
            'label_values(%s, job)' % text.selector('up', [c.idemgateSelector, filters.cluster]),
            multi=false,
            includeAll=false,
          ),
          queryVariable(
            'broker',
            'broker',
            'The kind of broker the service consumes (rocketmq, rabbitmq, kafka): the broker label every series of idemgate carries.',
            'label_values(%s, broker)' % m('idemgate_build_info', []),
            multi=false,
            includeAll=true,
          ),
          queryVariable(
            'consumer_group',
            'consumer group',
            'The consumer group: part of every claim key.',
            'label_values(%s, consumer_group)' % m('idemgate_deliveries_total', ['broker']),
            multi=false,
            includeAll=true,
          ),
          queryVariable(
            'instance',
            'instance',
            'Scrape targets (idemgate processes).',
            'label_values(%s, instance)' % m('idemgate_deliveries_total', ['broker', 'consumer_group']),
            multi=true,
            includeAll=true,
          ),
          queryVariable(
            'biz_type',
            'biz_type',
            'Business type; All also includes unrouted invalid deliveries (empty biz_type).',
            'label_values(%s, biz_type)' % m('idemgate_deliveries_total', ['broker', 'consumer_group']),
            multi=false,
            includeAll=true,
          ),
          queryVariable(
            'topic',
            'topic',
            'The topic, on RabbitMQ the exchange (deliveries, redeliveries, the ratios and the consumer lag only: the other metrics have no topic).',
            'label_values(%s, topic)' % m('idemgate_deliveries_total', ['broker', 'consumer_group']),
            multi=true,
            includeAll=true,
          ),
          queryVariable(
            'idemgate_url',
            'idemgate UI',
            'The web UI the links open: the ui_url label of idemgate_build_info (http.public_url) of the selected instances.',
            'label_values(%s, ui_url)' % m('idemgate_build_info', groupInstance),
            multi=false,
            includeAll=false,
          ),
        ],
      },
      panels: [
        stat(
          1,
          'Instances up',
          'short',
          'Scrape targets of the selected job that answer (up == 1).',
          [
            ['sum(%s)' % m('up', ['instance']), 'up'],
          ],
          links=[link('idemgate overview', '/')],
          steps=[{ color: 'red', value: null }, { color: 'green', value: 1 }],
        ) + at(0, 0, 4, 4),
        stat(
          2,
          'Deliveries /s',
          'ops',
          'All deliveries of the selection, every outcome.',
          [
            ['sum(rate(%s[$__rate_interval]))' % m('idemgate_deliveries_total', everything), 'deliveries/s'],
          ],
          links=[link('idemgate overview', '/')],
          steps=[{ color: 'green', value: null }],
        ) + at(4, 0, 4, 4),
        stat(
          3,
          'Duplicate ratio',
          'percentunit',
          'Duplicates / all deliveries of the selection, from the counters (empty without traffic).',
          [
            ['sum(rate(%s[$__rate_interval]))\n/\n(sum(rate(%s[$__rate_interval])) > 0)' % [m('idemgate_deliveries_total', everything, ['outcome="duplicate"']), m('idemgate_deliveries_total', everything)], 'duplicates'],
          ],
          links=[link('idemgate overview', '/')],
          steps=[{ color: 'green', value: null }, { color: 'orange', value: c.duplicateRatioThreshold / 2 }, { color: 'red', value: c.duplicateRatioThreshold }],
          defaults={ decimals: 2 },
        ) + at(8, 0, 4, 4),
        stat(
          4,
          'Dead letters /min',
          'opm',
          'Deliveries dead-lettered: retries exhausted or refused for good.',
          [
            ['sum(rate(%s[$__rate_interval])) * 60' % m('idemgate_deliveries_total', everything, ['outcome="dead_lettered"']), 'dead letters/min'],
          ],
          links=[link('Dead letters of ${biz_type}', '/dead-letters?biz_type=${biz_type:percentencode}')],
          steps=[{ color: 'green', value: null }, { color: 'red', value: 0.0001 }],
        ) + at(12, 0, 4, 4),
        stat(
          5,
          'Key collisions /min',
          'opm',
          "Duplicates whose body differs from the claim's: a producer reuses business keys.",
          [
            ['sum(rate(%s[$__rate_interval])) * 60' % m('idemgate_key_collisions_total', noTopic), 'collisions/min'],
          ],
          links=[link('Key collisions of ${biz_type}', '/collisions?biz_type=${biz_type:percentencode}')],
          steps=[{ color: 'green', value: null }, { color: 'red', value: 0.0001 }],
        ) + at(16, 0, 4, 4),
        stat(
          6,
          'Last successful archive',
          's',
          'Time since the last successful archive run of any selected instance (IdemgateArchiveStale: over %d h).' % c.archiveStaleHours,
          [
            ['time() - max(%s)' % m('idemgate_archive_last_success_timestamp_seconds', groupInstance), 'age'],
          ],
          links=[link('Archive', '/archive')],
          steps=[{ color: 'green', value: null }, { color: 'red', value: c.archiveStaleHours * 3600 }],
        ) + at(20, 0, 4, 4),
        timeseries(
          7,
          'Throughput by outcome',
          'ops',
          'Deliveries per second by outcome: processed, duplicate, failed (retried), dead_lettered, invalid.',
          [
            ['sum by (outcome) (rate(%s[$__rate_interval]))' % m('idemgate_deliveries_total', everything), '{{outcome}}'],
          ],
          links=[link('idemgate overview', '/'), link('Trace a bizId', '/trace')],
          style={ fillOpacity: 20, stacking: { mode: 'normal', group: 'A' } },
        ) + at(0, 4, 12, 8),
        timeseries(
          8,
          'Deliveries by biz_type',
          'ops',
          'Deliveries per second by biz_type, every outcome. Click a series to trace one of its bizIds.',
          [
            ['sum by (biz_type) (rate(%s[$__rate_interval]))' % m('idemgate_deliveries_total', everything), '{{biz_type}}'],
          ],
          links=[link('Trace a bizId', '/trace')],
          dataLinks=[link('Trace a bizId of ${__field.labels.biz_type}', '/trace?biz_type=${__field.labels.biz_type:percentencode}')],
        ) + at(12, 4, 12, 8),
        timeseries(
          9,
          'Conflict rate by layer',
          'ops',
          'Duplicates stopped per second, by the defence layer that stopped them (db, redis, state_machine, business_unique, business, late_duplicate).',
          [
            ['sum by (layer) (rate(%s[$__rate_interval]))' % m('idemgate_conflicts_total', noTopic), '{{layer}}'],
          ],
          links=[link('idemgate overview', '/')],
          style={ fillOpacity: 20, stacking: { mode: 'normal', group: 'A' } },
        ) + at(0, 12, 8, 8),
        timeseries(
          10,
          'Duplicates by cause',
          'ops',
          "Duplicates per second by cause, named from the producer's id of the send (RocketMQ UNIQ_KEY, AMQP message-id, Kafka UNIQ_KEY header) and the stored copy each delivery was read from: redelivery (the same stored copy again; on RabbitMQ, flagged redelivered), producer_retry (the same id on another stored copy: the producer's client sent it again after a lost send response), producer_resend (a new id: the application sent the event again), replay, ambiguous_commit (a COMMIT that lost its database connection, found committed by the retry), unknown (no id to compare). Redeliveries by sub-cause splits the first.",
          [
            ['sum by (cause) (rate(%s[$__rate_interval]))' % m('idemgate_conflicts_total', noTopic), '{{cause}}'],
          ],
          links=[link('idemgate overview', '/')],
          style={ fillOpacity: 20, stacking: { mode: 'normal', group: 'A' } },
        ) + at(8, 12, 8, 8),
        timeseries(
          11,
          'Duplicate ratio by biz_type',
          'percentunit',
          'Duplicates / all deliveries per biz_type, computed from the counters over every selected instance (the recording rule ' + $._recorded.duplicateRatio + ' does the same). No line while a biz_type has no traffic.',
          [
            ['sum by (biz_type) (rate(%s[$__rate_interval]))\n/\n(sum by (biz_type) (rate(%s[$__rate_interval])) > 0)' % [m('idemgate_deliveries_total', everything, ['outcome="duplicate"']), m('idemgate_deliveries_total', everything)], '{{biz_type}}'],
          ],
          links=[link('idemgate overview', '/')],
          dataLinks=[link('Trace a bizId of ${__field.labels.biz_type}', '/trace?biz_type=${__field.labels.biz_type:percentencode}')],
          defaults={ max: 1 },
        ) + at(16, 12, 8, 8),
        timeseries(
          12,
          'Retries',
          'ops',
          'Redeliveries per second (deliveries whose broker reconsume count is above 0) and failed attempts per second (the handler or the database asked for a retry).',
          [
            ['sum by (biz_type) (rate(%s[$__rate_interval]))' % m('idemgate_redeliveries_total', everything), 'redelivered {{biz_type}}'],
            ['sum by (biz_type) (rate(%s[$__rate_interval]))' % m('idemgate_deliveries_total', everything, ['outcome="failed"']), 'failed {{biz_type}}'],
          ],
          links=[link('Dead letters of ${biz_type}', '/dead-letters?biz_type=${biz_type:percentencode}')],
        ) + at(0, 20, 8, 8),
        timeseries(
          13,
          'Dead letters',
          'opm',
          'Deliveries dead-lettered per minute by biz_type. Their bodies are kept for replay: click a series for its dead letters.',
          [
            ['sum by (biz_type) (rate(%s[$__rate_interval])) * 60' % m('idemgate_deliveries_total', everything, ['outcome="dead_lettered"']), '{{biz_type}}'],
          ],
          links=[link('Dead letters of ${biz_type}', '/dead-letters?biz_type=${biz_type:percentencode}'), link('All dead letters', '/dead-letters')],
          dataLinks=[link('Dead letters of ${__field.labels.biz_type}', '/dead-letters?biz_type=${__field.labels.biz_type:percentencode}')],
          style={ drawStyle: 'bars', fillOpacity: 80 },
        ) + at(8, 20, 8, 8),
        timeseries(
          14,
          'Key collisions',
          'opm',
          "Duplicates per minute whose body differs from the claim's, by biz_type: two different messages share one business key, and the later one was skipped.",
          [
            ['sum by (biz_type) (rate(%s[$__rate_interval])) * 60' % m('idemgate_key_collisions_total', noTopic), '{{biz_type}}'],
          ],
          links=[link('Key collisions of ${biz_type}', '/collisions?biz_type=${biz_type:percentencode}')],
          dataLinks=[link('Key collisions of ${__field.labels.biz_type}', '/collisions?biz_type=${__field.labels.biz_type:percentencode}')],
          style={ drawStyle: 'bars', fillOpacity: 80 },
        ) + at(16, 20, 8, 8),
        timeseries(
          15,
          'Invalid deliveries',
          'opm',
          'Deliveries per minute logged invalid (no usable key, or a body of the wrong shape), by topic. Unrouted ones have an empty biz_type.',
          [
            ['sum by (topic) (rate(%s[$__rate_interval])) * 60' % m('idemgate_deliveries_total', everything, ['outcome="invalid"']), '{{topic}}'],
          ],
          links=[link('Invalid deliveries', '/invalid')],
          style={ drawStyle: 'bars', fillOpacity: 80 },
        ) + at(0, 28, 8, 8),
        timeseries(
          16,
          'Duplicate ratio, in process (per instance)',
          'percentunit',
          "idemgate_duplicate_ratio: each instance's own ratio over its last 1m and 5m, for setups without recording rules. Per instance: not to be summed or averaged across instances.",
          [
            ['%s' % m('idemgate_duplicate_ratio', noTopic), '{{instance}} {{biz_type}} {{window}}'],
          ],
          links=[link('idemgate overview', '/')],
          defaults={ max: 1 },
        ) + at(8, 28, 8, 8),
        timeseries(
          17,
          'Conflicts /s, in process (per instance)',
          'ops',
          "idemgate_conflicts_per_second: each instance's own conflict rate over its last 1m and 5m, for setups without recording rules.",
          [
            ['%s' % m('idemgate_conflicts_per_second', noTopic), '{{instance}} {{biz_type}} {{window}}'],
          ],
          links=[link('idemgate overview', '/')],
        ) + at(16, 28, 8, 8),
        timeseries(
          18,
          'Handler latency',
          's',
          "p50/p95/p99 of the business handler's run time (idemgate_handler_duration_seconds).",
          [
            ['histogram_quantile(0.5, sum by (le) (rate(%s[$__rate_interval])))' % m('idemgate_handler_duration_seconds_bucket', noTopic), 'p50'],
            ['histogram_quantile(0.95, sum by (le) (rate(%s[$__rate_interval])))' % m('idemgate_handler_duration_seconds_bucket', noTopic), 'p95'],
            ['histogram_quantile(0.99, sum by (le) (rate(%s[$__rate_interval])))' % m('idemgate_handler_duration_seconds_bucket', noTopic), 'p99'],
          ],
          links=[link('Trace a bizId', '/trace')],
        ) + at(0, 36, 8, 8),
        timeseries(
          19,
          'Time in the gate',
          's',
          "p50/p95/p99 of a delivery's whole time in the gate: claim, handler, log row and commit (idemgate_delivery_duration_seconds).",
          [
            ['histogram_quantile(0.5, sum by (le) (rate(%s[$__rate_interval])))' % m('idemgate_delivery_duration_seconds_bucket', noTopic), 'p50'],
            ['histogram_quantile(0.95, sum by (le) (rate(%s[$__rate_interval])))' % m('idemgate_delivery_duration_seconds_bucket', noTopic), 'p95'],
            ['histogram_quantile(0.99, sum by (le) (rate(%s[$__rate_interval])))' % m('idemgate_delivery_duration_seconds_bucket', noTopic), 'p99'],
          ],
          links=[link('Trace a bizId', '/trace')],
        ) + at(8, 36, 8, 8),
        timeseries(
          20,
          'End-to-end latency',
          's',
          "p50/p95/p99 from the message's birth at the producer to its outcome (idemgate_end_to_end_seconds): broker time, queueing and retries included.",
          [
            ['histogram_quantile(0.5, sum by (le) (rate(%s[$__rate_interval])))' % m('idemgate_end_to_end_seconds_bucket', noTopic), 'p50'],
            ['histogram_quantile(0.95, sum by (le) (rate(%s[$__rate_interval])))' % m('idemgate_end_to_end_seconds_bucket', noTopic), 'p95'],
            ['histogram_quantile(0.99, sum by (le) (rate(%s[$__rate_interval])))' % m('idemgate_end_to_end_seconds_bucket', noTopic), 'p99'],
          ],
          links=[link('Trace a bizId', '/trace')],
        ) + at(16, 36, 8, 8),
        timeseries(
          21,
          'Archive: time since last success',
          's',
          'Time since the last successful archive pass over the database, whichever instance ran it (every instance reports the same, so the highest is shown); no line before the first success. IdemgateArchiveStale fires over %d h for a whole consumer group.' % c.archiveStaleHours,
          [
            ['time() - (max(%s) > 0)' % m('idemgate_archive_last_success_timestamp_seconds', groupInstance), 'last success'],
          ],
          links=[link('Archive', '/archive')],
          style={ thresholdsStyle: { mode: 'line' } },
          defaults={ thresholds: { mode: 'absolute', steps: [{ color: 'green', value: null }, { color: 'red', value: c.archiveStaleHours * 3600 }] } },
        ) + at(0, 44, 6, 8),
        timeseries(
          22,
          'Archive runs by status',
          'short',
          'Archive runs by status (success, failed, skipped: nothing to do, or another instance ran it), per bar of at least 5 minutes. Each instance counts the passes it ended (a pass of a process that died: the instance that marked it failed), so the sum over instances counts each pass once.',
          [
            ['sum by (status) (increase(%s[$__rate_interval]))' % m('idemgate_archive_runs_total', groupInstance), '{{status}}'],
          ],
          links=[link('Archive', '/archive')],
          style={ drawStyle: 'bars', fillOpacity: 80 },
          defaults={ decimals: 0 },
          extra={ interval: '5m' },
        ) + at(6, 44, 6, 8),
        timeseries(
          23,
          'Archive rows moved',
          'short',
          'Claims moved from the live dedup table to the archive, per bar of at least 5 minutes. Each instance counts the rows its own passes moved, so the sum over instances counts each row once.',
          [
            ['sum(increase(%s[$__rate_interval]))' % m('idemgate_archive_rows_moved_total', groupInstance), 'rows moved'],
          ],
          links=[link('Archive', '/archive')],
          style={ drawStyle: 'bars', fillOpacity: 80 },
          defaults={ decimals: 0 },
          extra={ interval: '5m' },
        ) + at(12, 44, 6, 8),
        timeseries(
          24,
          'Archive: last run duration',
          's',
          'How long the last finished archive pass over the database took, whichever instance ran it (every instance reports the same, so the highest is shown).',
          [
            ['max(%s)' % m('idemgate_archive_last_run_duration_seconds', groupInstance), 'last pass'],
          ],
          links=[link('Archive', '/archive')],
        ) + at(18, 44, 6, 8),
        timeseries(
          25,
          'Reconcile anomalies by kind',
          'short',
          'Anomalies found by the last reconcile run, by kind (lost, stuck, double_applied, orphan, key_collision, late_duplicate). Click a series for the list.',
          [
            ['max by (kind) (%s)' % m('idemgate_reconcile_anomalies', groupInstance), '{{kind}}'],
          ],
          links=[link('Anomalies', '/anomalies')],
          dataLinks=[link('Anomalies of kind ${__field.labels.kind}', '/anomalies?kind=${__field.labels.kind:percentencode}')],
          defaults={ decimals: 0 },
        ) + at(0, 52, 8, 8),
        stat(
          26,
          'Last reconcile run',
          's',
          'Time since the last reconcile run of any selected instance.',
          [
            ['time() - max(%s)' % m('idemgate_reconcile_last_run_timestamp_seconds', groupInstance), 'age'],
          ],
          links=[link('Anomalies', '/anomalies')],
          steps=[{ color: 'green', value: null }],
        ) + at(8, 52, 4, 8),
        timeseries(
          27,
          'Dedup table rows',
          'short',
          'Rows in the live claims table and in the archive (read at scrape time; instances sharing a database report the same numbers, so the highest is shown).',
          [
            ['max by (table) (%s)' % m('idemgate_dedup_rows', groupInstance), '{{table}}'],
          ],
          links=[link('Archive', '/archive')],
          defaults={ decimals: 0 },
        ) + at(12, 52, 6, 8),
        timeseries(
          44,
          'Delivery log partitions: time ahead and overflow rows',
          's',
          'A delivery log partitioned by day (PostgreSQL, MariaDB/MySQL; empty on a plain log): the time from now to the end of its newest day partition (left axis, idemgate_delivery_log_partitions_ahead_seconds), which the archive job keeps 3 to 4 days ahead; below %s IdemgateLogPartitionsBehind fires, past 0 new rows have no partition. Right axis: rows in the overflow partition, which takes rows no day partition takes (idemgate_delivery_log_overflow_rows, counted up to 100000; IdemgateLogOverflowRows fires above 0): normally 0. Every instance on the database reports the same, so the highest is shown.' % text.seconds(c.logPartitionsAheadSeconds),
          [
            ['max by (consumer_group) (%s)' % m('idemgate_delivery_log_partitions_ahead_seconds', groupInstance), '{{consumer_group}} ahead'],
            ['max by (consumer_group) (%s)' % m('idemgate_delivery_log_overflow_rows', groupInstance), '{{consumer_group}} overflow rows'],
          ],
          links=[link('Archive', '/archive')],
          style={ thresholdsStyle: { mode: 'line' } },
          defaults={ thresholds: { mode: 'absolute', steps: [{ color: 'red', value: null }, { color: 'green', value: c.logPartitionsAheadSeconds }] } },
          overrides=[{ matcher: { id: 'byFrameRefID', options: 'B' }, properties: [{ id: 'unit', value: 'short' }, { id: 'decimals', value: 0 }, { id: 'custom.axisPlacement', value: 'right' }, { id: 'custom.axisLabel', value: 'overflow rows' }, { id: 'custom.thresholdsStyle', value: { mode: 'off' } }] }],
        ) + at(18, 52, 6, 8),
        timeseries(
          28,
          'State machines: illegal moves and moves already made',
          'opm',
          "Per minute by biz_type, from the state-machine handlers' conditional updates that changed no row. Illegal: the row was in a state the move cannot start from; the delivery is dead-lettered (idemgate_illegal_transitions_total). Already made: the row was already in a done state; a duplicate at layer state_machine (idemgate_conflicts_total). Click a series for the dead letters.",
          [
            ['sum by (biz_type) (rate(%s[$__rate_interval])) * 60' % m('idemgate_illegal_transitions_total', noTopic), '{{biz_type}} illegal'],
            ['sum by (biz_type) (rate(%s[$__rate_interval])) * 60' % m('idemgate_conflicts_total', noTopic, ['layer="state_machine"']), '{{biz_type}} already made'],
          ],
          links=[link('Dead letters of ${biz_type}', '/dead-letters?biz_type=${biz_type:percentencode}')],
          dataLinks=[link('Dead letters of ${__field.labels.biz_type}', '/dead-letters?biz_type=${__field.labels.biz_type:percentencode}')],
        ) + at(0, 60, 12, 8),
        timeseries(
          45,
          'Redeliveries by sub-cause',
          'ops',
          "Duplicates of cause redelivery per second by what the broker did (idemgate_redelivery_duplicates_total), read from the consumer record about the run that applied the key: consume_timeout (the broker's own timeout: RabbitMQ's consumer_timeout, Kafka's max.poll.interval.ms), ack_lost (an ack, reject or offset commit that failed after the delivery was applied), rebalance (its queue or partition moved to another instance; never on RabbitMQ), crash (the instance stopped without a clean stop), unattributed (nothing on record says why). Counted when the sub-cause is written, about 4 s after the duplicate, so a few seconds behind Duplicates by cause; a redelivery logged by an instance that stopped before then is not counted here.",
          [
            ['sum by (sub_cause) (rate(%s[$__rate_interval]))' % m('idemgate_redelivery_duplicates_total', noTopic), '{{sub_cause}}'],
          ],
          links=[link('idemgate overview', '/')],
          style={ fillOpacity: 20, stacking: { mode: 'normal', group: 'A' } },
        ) + at(12, 60, 12, 8),
        timeseries(
          32,
          'Consumer lag: messages behind',
          'short',
          "Messages stored at the brokers and not yet consumed by the consumer group, per topic, read by every instance every broker.lag_interval_seconds (max over instances, summed over queues). Per broker: RocketMQ, each queue's max offset minus the group's committed offset (a queue per broker_name and queue); Kafka, each partition's high watermark minus the committed offset (queue: the partition); RabbitMQ, the ready messages of the group's queue (queue 0) and of its delay queue (queue 1). On RocketMQ and Kafka the last few seconds of messages still count right after consumption, until the client commits its offsets. Failed and partial readings per second below.",
          [
            ['sum by (topic) (max by (broker, topic, broker_name, queue) (%s))' % m('idemgate_consumer_lag_messages', noBizType), '{{topic}}'],
            ['sum by (result) (rate(%s[$__rate_interval]))' % m('idemgate_consumer_lag_reads_total', noBizType, ['result!="complete"']), 'readings {{result}} /s'],
          ],
          links=[link('Overview (consumer lag)', '/')],
          defaults={ decimals: 0 },
        ) + at(0, 68, 8, 8),
        timeseries(
          33,
          'Consumer lag: oldest message waiting',
          's',
          'How long the oldest message of the topic not yet consumed by the group has waited since the broker stored it (0 when nothing waits).',
          [
            ['max by (topic) (%s)' % m('idemgate_consumer_lag_seconds', noBizType), '{{topic}}'],
          ],
          links=[link('Overview (consumer lag)', '/')],
        ) + at(8, 68, 8, 8),
        timeseries(
          35,
          'Consumer: messages pulled and held',
          'short',
          "Messages each instance's broker client has pulled and not yet consumed (those in the gate included), per topic. The client stops pulling a queue past its share of rocketmq.buffered_messages, so while the database is slow this rises to about that bound (plus at most one pull per queue) and stays there instead of filling memory; near 0 when consumers keep up.",
          [
            ['sum by (instance, topic) (%s)' % m('idemgate_consumer_buffered_messages', noBizType), '{{instance}} {{topic}}'],
          ],
          links=[],
          defaults={ decimals: 0 },
        ) + at(16, 68, 8, 8),
        row(37, 'Redis pre-filter', 76, [
          timeseries(
            29,
            'Redis pre-filter: what it said, and fallbacks',
            'ops',
            "Per second, deliveries through the Redis pre-filter by what it said (idemgate_prefilter_total): claimed = a fresh key, duplicate = stopped at Redis without a transaction, in_flight = another delivery holds the key and the database decided, fallback = Redis failed, was too slow, or was skipped while it is down (by cause, idemgate_prefilter_fallbacks_total). Fallbacks never let a duplicate through: the database's unique index decides alone. Empty when [redis] is off.",
            [
              ['sum by (step) (rate(%s[$__rate_interval]))' % m('idemgate_prefilter_total', noTopic), '{{step}}'],
              ['sum by (cause) (rate(%s[$__rate_interval]))' % m('idemgate_prefilter_fallbacks_total', groupInstance), 'fallback: {{cause}}'],
            ],
            links=[],
            dataLinks=[],
          ) + at(0, 0, 24, 8),
        ]),
        row(38, 'Group commit', 77, [
          timeseries(
            30,
            'Group commit: deliveries per transaction, retries, splits and deferrals',
            'short',
            'Group commit by consumer_group. Deliveries per transaction (left axis, idemgate_group_size): how many deliveries share one commit on average; 1 means no batching. Retries per second (right axis, idemgate_group_retries_total): whole-group transactions started again after a transient conflict (deadlock, busy file, lost connection). Splits per second (right axis, idemgate_group_commits_total{result="split"}): groups that could not commit even after retries; each of their deliveries then went through the gate alone, one transaction each: still exactly-once, but slower, and a sign of a database error or of a delivery that breaks the transaction (the service log says "a group could not commit"). Empty or 0 when [group_commit] is off. Deferrals per second (right axis, idemgate_group_deferrals_total): deliveries held back from a group because a group in flight in the same instance claims their key; they join the next group once that one commits, so their claim finds the key taken at once instead of waiting in the database. It follows the duplicates that arrive close together (redelivered batches, producer resends) and is not an error.',
            [
              ['sum by (consumer_group) (rate(%s[$__rate_interval]))\n/\nsum by (consumer_group) (rate(%s[$__rate_interval]))' % [m('idemgate_group_size_sum', groupInstance), m('idemgate_group_size_count', groupInstance)], '{{consumer_group}} deliveries per transaction'],
              ['sum by (consumer_group) (rate(%s[$__rate_interval]))' % m('idemgate_group_commits_total', groupInstance, ['result="split"']), '{{consumer_group}} splits/s'],
              ['sum by (consumer_group) (rate(%s[$__rate_interval]))' % m('idemgate_group_retries_total', groupInstance), '{{consumer_group}} retries/s'],
              ['sum by (consumer_group) (rate(%s[$__rate_interval]))' % m('idemgate_group_deferrals_total', groupInstance), '{{consumer_group}} deferrals'],
            ],
            links=[],
            dataLinks=[],
            overrides=[{ matcher: { id: 'byFrameRefID', options: 'B' }, properties: [{ id: 'unit', value: 'ops' }, { id: 'custom.axisPlacement', value: 'right' }, { id: 'custom.axisLabel', value: 'per second' }] }, { matcher: { id: 'byFrameRefID', options: 'C' }, properties: [{ id: 'unit', value: 'ops' }, { id: 'custom.axisPlacement', value: 'right' }, { id: 'custom.axisLabel', value: 'per second' }] }, { matcher: { id: 'byFrameRefID', options: 'D' }, properties: [{ id: 'unit', value: 'ops' }, { id: 'custom.axisPlacement', value: 'right' }, { id: 'custom.axisLabel', value: 'per second' }] }],
          ) + at(0, 0, 12, 8),
          timeseries(
            31,
            'Group commit: time waiting for a group (p50, p99)',
            's',
            'How long a delivery waited in the group-commit queue before its group started (idemgate_group_queue_wait_seconds), p50 and p99 by consumer_group. It grows when the database is slower than the broker delivers (backpressure). The queue is bounded: beyond it the consume threads wait and the broker client stops pulling, so memory stays flat. Empty when [group_commit] is off.',
            [
              ['histogram_quantile(0.5, sum by (le, consumer_group) (rate(%s[$__rate_interval])))' % m('idemgate_group_queue_wait_seconds_bucket', groupInstance), '{{consumer_group}} p50'],
              ['histogram_quantile(0.99, sum by (le, consumer_group) (rate(%s[$__rate_interval])))' % m('idemgate_group_queue_wait_seconds_bucket', groupInstance), '{{consumer_group}} p99'],
            ],
            links=[],
            dataLinks=[],
          ) + at(12, 0, 12, 8),
          timeseries(
            34,
            'Group commit: batch fallbacks by handler',
            'ops',
            'Groups whose handler batch form failed, per second, by consumer_group and handler (idemgate_group_fallbacks_total, [group_commit] batch = true). A fallback rolls the group back to just after its claims and runs it again one delivery at a time, each in a savepoint of its own, so that the delivery that broke the statement fails alone and the others commit: still exactly-once, but the group costs its handlers\' work twice. A steady rate means a handler\'s batch statement keeps failing on some delivery (a value its column refuses, a constraint); the service log says "a handler\'s batch failed" with the error. Zero for each handler from the start while group commit and the batch path are on; empty when either is off.',
            [
              ['sum by (consumer_group, handler) (rate(%s[$__rate_interval]))' % m('idemgate_group_fallbacks_total', groupInstance), '{{consumer_group}} {{handler}} fallbacks/s'],
            ],
            links=[],
            dataLinks=[],
          ) + at(0, 8, 24, 8),
        ]),
        row(39, 'Galera and transient retries', 78, [
          timeseries(
            36,
            'Transient retries by cause, and ambiguous commits',
            'ops',
            "Gate transactions (one delivery's, or a whole group's) started again after a transient conflict, per second, by consumer_group and cause (idemgate_transient_retries_total). deadlock, lock_wait and serialization: two transactions on the same rows, usually duplicates of one key arriving together; lock_wait also: a lock held past database.lock_timeout_ms by another transaction (another instance's claim left uncommitted, a row lock on a handler's table); busy: SQLite's writer lock; connection: no pooled connection in time, or one that broke (a database restart, a failover behind the proxy). certification: on a MariaDB Galera node, another node's transaction on the same key committed first and this one was refused at COMMIT; the retry then finds the key claimed and logs a duplicate. Each retry stays within [consumer] transient_retries; a delivery that runs out of retries fails and the broker redelivers it. A steady certification rate means the same keys are consumed on several nodes at once: see docs/galera.md. Zero for every cause from the start; each series appears with the instance. Beside them, the COMMITs whose answer was lost with their connection and whose outcome was read back on a fresh connection (idemgate_ambiguous_commits_total: a group's always, one delivery's once its retries ran out), by scope and by what the read-back said: committed, not_committed, or unread (a later attempt settles it): see docs/deliveries.md.",
            [
              ['sum by (consumer_group, cause) (rate(%s[$__rate_interval]))' % m('idemgate_transient_retries_total', groupInstance), '{{consumer_group}} {{cause}} retries/s'],
              ['sum by (consumer_group, scope, read_back) (rate(%s[$__rate_interval]))' % m('idemgate_ambiguous_commits_total', groupInstance), '{{consumer_group}} ambiguous {{scope}} commit, {{read_back}}/s'],
            ],
            links=[],
            dataLinks=[],
          ) + at(0, 0, 24, 8),
        ]),
        row(40, 'Process', 79, [
          timeseries(
            41,
            'Process: CPU',
            'short',
            'CPU time the process used per second, user and system (process_cpu_seconds_total): 1 is one core busy. Read from /proc at each scrape, in whole seconds.',
            [
              ['sum by (instance) (%s)' % ofGroup('rate(%s[$__rate_interval])' % m('process_cpu_seconds_total', ['broker', 'instance'])), '{{instance}}'],
            ],
            style={ axisLabel: 'cores' },
          ) + at(0, 0, 8, 8),
          timeseries(
            42,
            'Process: resident memory',
            'bytes',
            "Memory the process holds in RAM (process_resident_memory_bytes). The broker client's buffer is bounded by rocketmq.buffered_messages, the pools by their sizes: a steady climb under steady traffic is worth a look.",
            [
              ['sum by (instance) (%s)' % ofGroup(m('process_resident_memory_bytes', ['broker', 'instance'])), '{{instance}}'],
            ],
          ) + at(8, 0, 8, 8),
          timeseries(
            43,
            'Process: open file descriptors',
            'short',
            'File descriptors the process holds open (process_open_fds: sockets to the database, the brokers, Redis and HTTP clients, and files), and its limit (process_max_fds).',
            [
              ['sum by (instance) (%s)' % ofGroup(m('process_open_fds', ['broker', 'instance'])), '{{instance}} open'],
              ['sum by (instance) (%s)' % ofGroup(m('process_max_fds', ['broker', 'instance'])), '{{instance}} limit'],
            ],
          ) + at(16, 0, 8, 8),
        ]),
      ],
    },
  },
}
