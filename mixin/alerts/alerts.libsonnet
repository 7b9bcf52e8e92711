// The alerts. Each carries labels.severity and the annotations summary, description,
// runbook_url (its section of docs/runbook.md, by runbookURLPattern) and ui_url (the page of
// the service's own web UI that shows the problem).
//
// ui_url's base is the `ui_url` label of idemgate_build_info (http.public_url), read when the
// alert is sent by a template query: from an instance of the alert's consumer group (or the
// alert's instance), a live one first (build_info × up sorts the up ones first), remembered for
// a day so that a link still works while the instances are down; else from any instance.
//
// Every series of the service carries `broker`, the kind of broker it consumes (rocketmq,
// rabbitmq, kafka): every aggregation keeps it, so each alert names its broker and services on
// different brokers never mix, and every template query selects the alert's broker. `up` has no
// `broker` (Prometheus writes it): joins with it match on the cluster, job and instance only.
local text = import '../lib/text.libsonnet';

{
  prometheusAlerts+:: {
    local c = $._config,
    local r = $._recorded,
    local sel(metric, matchers=[]) = text.selector(metric, [c.idemgateSelector] + matchers),
    local by(names) = text.labels([c.clusterLabel, 'broker'] + names),
    local groupBiz = by(['consumer_group', 'biz_type']),
    local group = by(['consumer_group']),
    local groupInstance = by(['consumer_group', 'instance']),
    // A scrape target, as `up` names it.
    local target = text.labels([c.clusterLabel, 'job', 'instance']),
    local cluster = '(index $labels "%s")' % c.clusterLabel,
    local broker = '(index $labels "broker")',

    local tune(keys) =
      'Tune in mixin/config.libsonnet: '
      + std.join(', ', [
        '%s (%s)' % [
          k,
          if std.isArray(c[k]) then std.join('|', c[k])
          else if std.isNumber(c[k]) then text.number(c[k])
          else c[k],
        ]
        for k in keys
      ])
      + '.',

    local runbook(name) = c.runbookURLPattern % std.asciiLower(name),

    // A recorded series of the alert's consumer group and biz_type, for a description.
    local recordedValue(name) =
      '{{ with printf "' + name + '{' + c.clusterLabel + '=%q,broker=%q,consumer_group=%q,biz_type=%q}" '
      + cluster + ' ' + broker + ' $labels.consumer_group $labels.biz_type | query }}{{ . | first | value | printf "%.3g" }}{{ end }}',

    // The UI of any instance of the job, a live one first.
    local anyUiQuery =
      local info = text.selector('idemgate_build_info', [text.goString(c.idemgateSelector)]);
      'sort_desc(last_over_time(' + info + '[1d]) * on (' + target + ') group_left '
      + text.selector('up', [text.goString(c.idemgateSelector)]) + ' or 0 * last_over_time(' + info + '[1d]))',
    local anyUi = '{{ with query "' + anyUiQuery + '" }}{{ . | first | label "ui_url" }}{{ end }}',

    // `path` on the UI of an instance whose `label` and broker are the alert's, else of any
    // instance.
    local ui(label, path) =
      local info = text.selector(
        'idemgate_build_info',
        [text.goFormat(c.idemgateSelector), c.clusterLabel + '=%[2]q', 'broker=%[3]q', label + '=%[1]q']
      );
      local query =
        'sort_desc(last_over_time(' + info + '[1d]) * on (' + target + ') group_left '
        + text.selector('up', [text.goFormat(c.idemgateSelector)]) + ' or 0 * last_over_time(' + info + '[1d]))';
      '{{ with printf "' + query + '" $labels.' + label + ' ' + cluster + ' ' + broker + ' | query -}} '
      + '{{ . | first | label "ui_url" }} {{- else -}} ' + anyUi + ' {{- end -}} ' + path,

    local alert(name, severity, expr, summary, description, uiUrl, comment, tuned, forDuration=null) =
      {
        alert: name,
        expr: expr,
        labels: { severity: severity },
        annotations: {
          summary: summary,
          description: description,
          runbook_url: runbook(name),
          ui_url: uiUrl,
        },
        comment:: comment + tune(tuned),
      } + (if forDuration == null then {} else { 'for': forDuration }),

    groups+: [
      {
        name: 'idemgate.alerts',
        rules: [
          alert(
            'IdemgateConflictSpike',
            'warning',
            |||
              (%(conflicts)s > %(min)s)
              and
              (%(conflicts)s > %(factor)s * %(baseline)s)
            ||| % {
              conflicts: r.conflicts,
              baseline: r.conflictBaseline,
              min: text.number(c.conflictSpikeMinPerSecond),
              factor: text.number(c.conflictSpikeFactor),
            },
            'Duplicate spike on {{ $labels.biz_type }} ({{ $labels.consumer_group }})',
            '{{ $labels.biz_type }} in consumer group {{ $labels.consumer_group }} stops '
            + '{{ printf "%.3g" $value }} duplicates/s (5m), more than ' + text.number(c.conflictSpikeFactor)
            + ' times its ' + c.conflictSpikeBaseline + ' baseline of ' + recordedValue(r.conflictBaseline)
            + '/s. The duplicates are harmless, their cause is not: see the causes on the overview.',
            ui('consumer_group', '/'),
            |||
              Duplicates stopped per second jumped well above their own recent normal: a rebalance
              storm, a broker redelivering, a producer retrying after timeouts or resending, or a
              replay.
              Relative on purpose: a biz_type that always sees many duplicates does not page; the
              level itself is IdemgateDuplicateRatioHigh's job.
            |||,
            ['conflictSpikeFactor', 'conflictSpikeMinPerSecond', 'conflictSpikeBaseline', 'conflictSpikeFor'],
            c.conflictSpikeFor,
          ),

          alert(
            'IdemgateDuplicateRatioHigh',
            'warning',
            |||
              (%(ratio)s > %(threshold)s)
              and on (%(on)s)
              (%(deliveries)s > %(min)s)
            ||| % {
              ratio: r.duplicateRatio,
              deliveries: r.deliveries,
              on: groupBiz,
              threshold: text.number(c.duplicateRatioThreshold),
              min: text.number(c.duplicateRatioMinDeliveriesPerSecond),
            },
            '{{ $value | humanizePercentage }} of {{ $labels.biz_type }} deliveries are duplicates ({{ $labels.consumer_group }})',
            '{{ $value | humanizePercentage }} of the deliveries of {{ $labels.biz_type }} in consumer group '
            + '{{ $labels.consumer_group }} were duplicates over the last 5 minutes, for '
            + text.words(c.duplicateRatioFor) + ' (threshold ' + text.percent(c.duplicateRatioThreshold)
            + ' %). Look at the causes: redelivery (acks lost, rebalances, crashes, slow consumers), '
            + "producer_retry (the producer's client sending again after a timeout), producer_resend (the "
            + 'application sending the event again), replay, ambiguous_commit (database connections lost at COMMIT).',
            ui('consumer_group', '/'),
            |||
              A large share of deliveries are duplicates, for a long time. The traffic floor keeps 2
              duplicates out of 5 deliveries from counting.
            |||,
            ['duplicateRatioThreshold', 'duplicateRatioMinDeliveriesPerSecond', 'duplicateRatioFor'],
            c.duplicateRatioFor,
          ),

          alert(
            'IdemgateRetryStorm',
            'warning',
            |||
              (%(redeliveries)s > %(min)s)
              and on (%(on)s)
              (%(ratio)s > %(share)s)
            ||| % {
              redeliveries: r.redeliveries,
              ratio: r.redeliveryRatio,
              on: groupBiz,
              min: text.number(c.retryStormMinPerSecond),
              share: text.number(c.retryStormShare),
            },
            'Retry storm on {{ $labels.biz_type }} ({{ $labels.consumer_group }})',
            '{{ $labels.biz_type }} in consumer group {{ $labels.consumer_group }} receives '
            + '{{ printf "%.3g" $value }} redeliveries/s, more than ' + text.percent(c.retryStormShare)
            + ' % of its deliveries, for ' + text.words(c.retryStormFor) + '; failed attempts: '
            + recordedValue(r.failed) + '/s. Messages that keep failing end up dead-lettered.',
            ui('consumer_group', '/dead-letters?biz_type={{ $labels.biz_type | urlquery }}'),
            |||
              Many deliveries are retries: handlers fail (a dependency down, messages out of order)
              and the broker brings them back, again and again.
            |||,
            ['retryStormMinPerSecond', 'retryStormShare', 'retryStormFor'],
            c.retryStormFor,
          ),

          alert(
            'IdemgateProducerRetries',
            'warning',
            |||
              sum by (%s) (
                rate(%s[5m])
              ) > %s
            ||| % [
              groupBiz,
              sel('idemgate_conflicts_total', ['cause="producer_retry"']),
              text.number(c.producerRetriesMinPerSecond),
            ],
            'Producer retries on {{ $labels.biz_type }} ({{ $labels.consumer_group }})',
            '{{ $labels.biz_type }} in consumer group {{ $labels.consumer_group }} stops '
            + '{{ printf "%.3g" $value }} duplicates/s of cause producer_retry (5m), for '
            + text.words(c.producerRetriesFor) + ": the same message id on a second stored copy, sent again by the producer's "
            + "client when a send's answer did not come in time. Look at the producer's send timeout and retries ("
            + '{{ if eq ' + broker + ' "kafka" }}request.timeout.ms, delivery.timeout.ms, enable.idempotence'
            + '{{ else if eq ' + broker + ' "rabbitmq" }}its wait for publisher confirms'
            + '{{ else }}sendMsgTimeout, retryTimesWhenSendFailed{{ end }}) '
            + "and at the broker's latency to store a message.",
            ui('consumer_group', '/'),
            |||
              Duplicates of cause producer_retry: the delivery carries the claim's producer id (RocketMQ
              UNIQ_KEY, the AMQP message-id, Kafka's UNIQ_KEY header) on another stored copy (on
              RabbitMQ: not flagged redelivered). The producer's client sent the message again after a
              send whose response or confirm it did not get in time. Harmless to the books; a sign that
              the producer's sends time out.
            |||,
            ['producerRetriesMinPerSecond', 'producerRetriesFor'],
            c.producerRetriesFor,
          ),

          alert(
            'IdemgateRebalanceStorm',
            'warning',
            |||
              sum by (%s) (
                rate(%s[5m])
              ) > %s
            ||| % [
              group,
              sel('idemgate_redelivery_duplicates_total', ['sub_cause="rebalance"']),
              text.number(c.rebalanceStormMinPerSecond),
            ],
            'Rebalance storm in {{ $labels.consumer_group }}',
            'Consumer group {{ $labels.consumer_group }} stops {{ printf "%.3g" $value }} redeliveries/s (5m) of '
            + 'messages already applied whose {{ if eq ' + broker + ' "kafka" }}partition{{ else }}queue{{ end }} '
            + 'was taken from the instance that applied them before their answer reached the broker, for '
            + text.words(c.rebalanceStormFor) + ': instances keep joining or leaving the group. Check restarts '
            + '(crash loops, deploys, IdemgateDown) and '
            + '{{ if eq ' + broker + ' "kafka" }}kafka.session_timeout_ms against missed heartbeats'
            + "{{ else }}rocketmq.heartbeat_interval_seconds against the broker's channel expiry{{ end }}.",
            ui('consumer_group', '/'),
            |||
              Redelivered duplicates of sub-cause rebalance: the queue or partition of the delivery that
              applied the key was taken from its instance, or given to another, before its answer
              reached the broker (read from the consumer record). One rebalance brings a short burst; a
              storm lasts. Never on RabbitMQ, whose consumers of a group share one queue. By consumer
              group: the sub-cause is counted by the instance that met the redelivery, not by the one
              that lost the queue.
            |||,
            ['rebalanceStormMinPerSecond', 'rebalanceStormFor'],
            c.rebalanceStormFor,
          ),

          alert(
            'IdemgateAckFailures',
            'warning',
            |||
              sum by (%s) (
                rate(%s[5m])
              ) > %s
            ||| % [
              group,
              sel('idemgate_redelivery_duplicates_total', ['sub_cause="ack_lost"']),
              text.number(c.ackFailuresMinPerSecond),
            ],
            'Answers lost on the way to the broker in {{ $labels.consumer_group }}',
            'Consumer group {{ $labels.consumer_group }} stops {{ printf "%.3g" $value }} redeliveries/s (5m) of '
            + 'messages already applied whose answer never reached the broker ('
            + '{{ if eq ' + broker + ' "kafka" }}offset commits that failed'
            + '{{ else }}acks or rejects that failed, or a channel lost with them unanswered{{ end }}), for '
            + text.words(c.ackFailuresFor) + ". Look at the network between the instances and the broker and at the broker's "
            + 'health; the service log names each failure.',
            ui('consumer_group', '/'),
            |||
              Redelivered duplicates of sub-cause ack_lost: the instance that applied the key recorded an
              answer that failed after it (RabbitMQ: an ack or reject that failed, or the channel lost;
              Kafka: an offset commit that failed). RocketMQ's client reports no failed offset commit, so
              it never fires there. By consumer group, as IdemgateRebalanceStorm.
            |||,
            ['ackFailuresMinPerSecond', 'ackFailuresFor'],
            c.ackFailuresFor,
          ),

          alert(
            'IdemgateDeadLetters',
            'warning',
            |||
              sum by (%s) (
                increase(%s[%s])
              ) > %s
            ||| % [
              groupBiz,
              sel('idemgate_deliveries_total', ['outcome="dead_lettered"']),
              c.deadLettersWindow,
              text.number(c.deadLettersAbove),
            ],
            'Dead letters on {{ $labels.biz_type }} ({{ $labels.consumer_group }})',
            '{{ $labels.biz_type }} in consumer group {{ $labels.consumer_group }}: deliveries '
            + 'dead-lettered in the last ' + text.words(c.deadLettersWindow)
            + ': about {{ printf "%.0f" $value }}. Their bodies are kept: fix the cause, then replay '
            + 'them from the dead-letter page.',
            ui('consumer_group', '/dead-letters?biz_type={{ $labels.biz_type | urlquery }}'),
            |||
              Messages were dead-lettered: retries exhausted, or refused for good by the handler.
              Each one is an effect that did not happen until someone replays or discards it.
            |||,
            ['deadLettersAbove', 'deadLettersWindow'],
          ),

          alert(
            'IdemgateKeyCollision',
            'critical',
            |||
              sum by (%s) (
                increase(%s[%s])
              ) > 0
            ||| % [groupBiz, sel('idemgate_key_collisions_total'), c.keyCollisionWindow],
            'Business key collision on {{ $labels.biz_type }} ({{ $labels.consumer_group }})',
            '{{ $labels.biz_type }} in consumer group {{ $labels.consumer_group }}: duplicates '
            + "whose body differs from the claim's in the last " + text.words(c.keyCollisionWindow)
            + ': about {{ printf "%.0f" $value }}. A producer reuses business keys for different '
            + 'messages, and the later ones were skipped as duplicates. Compare the bodies on the '
            + 'collisions page.',
            ui('consumer_group', '/collisions?biz_type={{ $labels.biz_type | urlquery }}'),
            |||
              A duplicate arrived whose body differs from the claim's: two different messages share
              one business key (a producer bug). The second one was skipped as a duplicate, so its
              effect is missing.
            |||,
            ['keyCollisionWindow'],
          ),

          alert(
            'IdemgateArchiveStale',
            'warning',
            |||
              (
                max by (%(group)s) (max_over_time(%(success)s[%(hours)dh]))
                < time() - %(hours)d * 3600
              )
              and on (%(group)s)
              count by (%(group)s) (%(success)s offset %(hours)dh)
            ||| % {
              group: group,
              success: sel('idemgate_archive_last_success_timestamp_seconds'),
              hours: c.archiveStaleHours,
            },
            'No successful archive run in {{ $labels.consumer_group }} for over %d hours' % c.archiveStaleHours,
            'The last successful archive run of consumer group {{ $labels.consumer_group }} '
            + '{{ if eq $value 0.0 }}has not happened since its instances started, over %d hours ago' % c.archiveStaleHours
            + '{{ else }}was at {{ $value | humanizeTimestamp }}{{ end }}. Old claims stay in the live '
            + 'dedup table, which grows and slows claims down.',
            ui('consumer_group', '/archive'),
            |||
              No instance of the consumer group archived old claims successfully for too long: the
              live dedup table keeps growing. The value is the time of the last success (0: none).
              An instance reports 0 until its first success since it started: max_over_time keeps
              what it reported before a restart, and a group reporting for less than the window (a
              new deployment) is left alone.
            |||,
            ['archiveStaleHours', 'archiveStaleFor'],
            c.archiveStaleFor,
          ),

          alert(
            'IdemgateArchiveFailing',
            'warning',
            |||
              (
                sum by (%(group)s) (increase(%(failed)s[%(window)s])) > 0
              )
              unless on (%(group)s)
              (
                sum by (%(group)s) (increase(%(success)s[%(window)s])) > 0
              )
            ||| % {
              group: group,
              failed: sel('idemgate_archive_runs_total', ['status="failed"']),
              success: sel('idemgate_archive_runs_total', ['status="success"']),
              window: c.archiveFailingWindow,
            },
            'Archive runs fail in {{ $labels.consumer_group }}',
            'Archive runs of consumer group {{ $labels.consumer_group }} failed in the last '
            + text.words(c.archiveFailingWindow)
            + ' (about {{ printf "%.0f" $value }}) and none succeeded. The service log has the error '
            + 'of each run.',
            ui('consumer_group', '/archive'),
            |||
              Archive runs fail and none succeeded since: a database error, a lock, a full disk.
              Each instance counts the passes it ended (a dead instance's pass: the one that marked
              it failed), so the sum over the group's instances counts every pass once.
            |||,
            ['archiveFailingWindow'],
          ),

          alert(
            'IdemgateLogPartitionsBehind',
            'warning',
            'max by (%s) (%s) < %s' % [
              group,
              sel('idemgate_delivery_log_partitions_ahead_seconds'),
              text.number(c.logPartitionsAheadSeconds),
            ],
            'Delivery log partitions run out in under %s ({{ $labels.consumer_group }})' % text.seconds(c.logPartitionsAheadSeconds),
            '{{ if gt $value 0.0 }}The newest day partition of the delivery log of consumer group '
            + '{{ $labels.consumer_group }} ends in {{ $value | humanizeDuration }}, less than '
            + text.seconds(c.logPartitionsAheadSeconds) + ' ahead{{ else }}Every day partition of the '
            + 'delivery log of consumer group {{ $labels.consumer_group }} has ended: new rows go to the '
            + 'overflow partition{{ end }}. The archive job, which makes them 3 days ahead at each run, '
            + 'did not: it has not run, failed, or could not take its locks. The archive page lists its '
            + 'runs; idemgate archive makes them by hand.',
            ui('consumer_group', '/archive'),
            |||
              The partitioned delivery log (PostgreSQL, MariaDB/MySQL) is close to the end of its
              newest day partition: the archive job, which makes them 3 to 4 days ahead, has not made
              any for days. Past the end, rows land in the overflow partition (IdemgateLogOverflowRows).
              The value is the time left (negative: already past). A plain log reports nothing.
            |||,
            ['logPartitionsAheadSeconds', 'logPartitionsBehindFor'],
            c.logPartitionsBehindFor,
          ),

          alert(
            'IdemgateLogOverflowRows',
            'warning',
            'max by (%s) (%s) > 0' % [group, sel('idemgate_delivery_log_overflow_rows')],
            'Delivery log rows in the overflow partition ({{ $labels.consumer_group }})',
            'The overflow partition of the delivery log of consumer group {{ $labels.consumer_group }} '
            + 'holds {{ printf "%.0f" $value }}{{ if ge $value 100000.0 }} or more{{ end }} rows that no '
            + 'day partition takes: the partitions fell behind, or the clock of an instance is far off. '
            + 'They are kept and read, but retention deletes them row by row instead of dropping their '
            + 'day. Check the clocks, then run idemgate archive: it moves the rows of the days it makes '
            + 'into their partitions.',
            ui('consumer_group', '/archive'),
            |||
              Rows of the partitioned delivery log fell into its overflow partition (DEFAULT on
              PostgreSQL, MAXVALUE on MariaDB/MySQL): their time has no day partition. Counted up to
              100000 at each scrape. A plain log reports nothing.
            |||,
            ['logOverflowFor'],
            c.logOverflowFor,
          ),

          alert(
            'IdemgateNoTraffic',
            'warning',
            |||
              (%(instanceTopic)s == 0)
              and on (%(onInstance)s)
              (%(up)s == 1)
              and on (%(onTopic)s)
              (%(topic)s > %(min)s)
            ||| % {
              instanceTopic: r.instanceTopicDeliveries,
              topic: r.topicDeliveries,
              up: sel('up'),
              onInstance: target,
              onTopic: by(['consumer_group', 'topic']),
              min: text.number(c.noTrafficMinGroupPerSecond),
            },
            '{{ $labels.instance }} consumes nothing from {{ $labels.topic }} ({{ $labels.consumer_group }})',
            'Instance {{ $labels.instance }} of consumer group {{ $labels.consumer_group }} is up but had '
            + 'no delivery from topic {{ $labels.topic }} for ' + text.words(c.noTrafficFor)
            + ', while the group receives {{ with printf "' + r.topicDeliveries + '{' + c.clusterLabel
            + '=%q,broker=%q,consumer_group=%q,topic=%q}" ' + cluster + ' ' + broker
            + ' $labels.consumer_group $labels.topic | query }}'
            + '{{ . | first | value | printf "%.3g" }}{{ end }} deliveries/s from it. Check '
            + '{{ if eq ' + broker + ' "kafka" }}the partition assignment of the group '
            + '(kafka-consumer-groups.sh --describe)'
            + '{{ else if eq ' + broker + ' "rabbitmq" }}the consumers of the group\'s queue '
            + '(rabbitmqctl list_consumers)'
            + '{{ else }}the queue allocation of the group (mqadmin consumerProgress){{ end }} '
            + 'and that every instance subscribes the same topics and tags.',
            ui('instance', '/'),
            |||
              An instance is up but gets nothing from a topic that its consumer group does consume:
              it holds no queue (more instances than the topic has queues, or Kafka partitions), its
              subscription differs from the group's, or its consumer is stuck. The group's floor
              makes a zero meaningful (enough that an instance holding even a small share of the
              queues cannot get 0 in 5 minutes by chance). The group is the instance's broker's:
              services on different brokers with the same group and topic names are never compared.
            |||,
            ['noTrafficMinGroupPerSecond', 'noTrafficFor'],
            c.noTrafficFor,
          ),

          alert(
            'IdemgateDown',
            'critical',
            |||
              (%(up)s == 0)
              or
              absent(%(up)s)
            ||| % { up: sel('up') },
            '{{ if $labels.instance }}idemgate instance {{ $labels.instance }} is down{{ else }}No idemgate target is scraped{{ end }}',
            '{{ if $labels.instance }}Prometheus could not scrape {{ $labels.instance }} (job '
            + '{{ $labels.job }}) for ' + text.words(c.downFor) + '. While it is down its queues go to '
            + 'the other instances of its consumer group after a rebalance; without any, messages wait '
            + 'in the broker.{{ else }}Prometheus has no target matching ' + sel('up')
            + ': the scrape configuration or its service discovery lost them.{{ end }}',
            '{{ with query "' + anyUiQuery + '" -}} {{ . | first | label "ui_url" }} {{- else -}} '
            + '{{ if $labels.instance }}http://{{ $labels.instance }}{{ end }} {{- end -}} /',
            |||
              An instance cannot be scraped, or Prometheus has no idemgate target at all (the
              selector matches no `up` series).
            |||,
            ['idemgateSelector', 'downFor'],
            c.downFor,
          ),
        ] + [
          local critical = 'kind=~"%s"' % std.join('|', c.reconcileCriticalKinds);
          local others = 'kind!~"%s"' % std.join('|', c.reconcileCriticalKinds);
          alert(
            'IdemgateReconcileAnomalies',
            severity,
            'max by (%s) (%s) > 0' % [
              by(['consumer_group', 'kind']),
              sel('idemgate_reconcile_anomalies', [if severity == 'critical' then critical else others]),
            ],
            'Reconcile found {{ $value }} {{ $labels.kind }} deliveries ({{ $labels.consumer_group }})',
            'The last reconcile run of consumer group {{ $labels.consumer_group }} found {{ $value }} '
            + 'anomalies of kind {{ $labels.kind }}'
            + (if severity == 'critical' then ': business data that does not match the deliveries' else '')
            + '. The anomalies page lists each one with its trace.',
            ui('consumer_group', '/anomalies?kind={{ $labels.kind | urlquery }}'),
            if severity == 'critical' then |||
              The last reconcile run found deliveries and effects that do not agree. Lost (claimed,
              effect missing) and double_applied (an effect applied twice) are damage to business
              data: critical.
            ||| else |||
              The other kinds of anomaly need a look: a warning.
            |||,
            ['reconcileCriticalKinds'],
          )
          for severity in ['critical', 'warning']
        ] + [
          alert(
            'IdemgateRedisPrefilterDown',
            'warning',
            |||
              sum by (%(by)s) (rate(%(fallback)s[5m]))
                /
              sum by (%(by)s) (rate(%(all)s[5m]))
                > %(share)s
            ||| % {
              by: groupInstance,
              fallback: sel('idemgate_prefilter_total', ['step="fallback"']),
              all: sel('idemgate_prefilter_total'),
              share: text.number(c.redisFallbackShare),
            },
            'Redis pre-filter falling back on {{ $labels.instance }} ({{ $labels.consumer_group }})',
            '{{ $value | humanizePercentage }} of the deliveries of {{ $labels.instance }} that use the '
            + 'Redis pre-filter fell back to the database alone over 5 minutes. Duplicates are still '
            + 'stopped by the unique index, at the cost of a transaction each. Check Redis at '
            + "redis.url; the dashboard's pre-filter panel shows the fallbacks by cause (timeout, "
            + 'error, circuit_open).',
            ui('instance', '/'),
            |||
              Most deliveries of an instance that use the Redis pre-filter fell back to the database
              alone: Redis is down, unreachable or slower than redis.timeout_ms. No duplicate gets
              through (the unique index decides), but each one costs a transaction again.
            |||,
            ['redisFallbackShare', 'redisFallbackFor'],
            c.redisFallbackFor,
          ),

          alert(
            'IdemgateGroupCommitSplitting',
            'warning',
            |||
              (
                sum by (%(by)s) (rate(%(split)s[%(window)s]))
                  /
                sum by (%(by)s) (rate(%(all)s[%(window)s]))
                  > %(share)s
              )
              and
              sum by (%(by)s) (rate(%(all)s[%(window)s])) > %(perMinute)s / 60
            ||| % {
              by: groupInstance,
              split: sel('idemgate_group_commits_total', ['result="split"']),
              all: sel('idemgate_group_commits_total'),
              window: c.groupCommitWindow,
              share: text.number(c.groupCommitSplitShare),
              perMinute: text.number(c.groupCommitMinGroupsPerMinute),
            },
            'Group commit splitting groups on {{ $labels.instance }} ({{ $labels.consumer_group }})',
            '{{ $value | humanizePercentage }} of the group-commit groups of {{ $labels.instance }} could '
            + 'not commit over ' + text.words(c.groupCommitWindow) + ' and fell back to one transaction '
            + 'per delivery. Effects stay exactly-once, but throughput drops. Look for "a group could '
            + 'not commit" in the service log (it gives the error) and at the dashboard\'s group-commit '
            + 'panel (splits and retries).',
            ui('instance', '/'),
            |||
              Many groups of an instance's group commit could not commit even after their retries and
              were split: each of their deliveries went through the gate alone, one transaction each.
              Still exactly-once, but slower; a database error, or a delivery that breaks the shared
              transaction, keeps happening. Never fires with [group_commit] off (0 / 0 is no match).
            |||,
            ['groupCommitSplitShare', 'groupCommitWindow', 'groupCommitMinGroupsPerMinute', 'groupCommitSplitFor'],
            c.groupCommitSplitFor,
          ),

          alert(
            'IdemgateConsumerLagGrowing',
            'warning',
            |||
              (%(lag)s > %(min)s)
              and
              (deriv(%(lag)s[%(window)s]) > 0)
            ||| % {
              lag: r.consumerLag,
              min: text.number(c.consumerLagMinMessages),
              window: c.consumerLagTrendWindow,
            },
            'Consumer group {{ $labels.consumer_group }} is falling behind on {{ $labels.topic }}',
            'Consumer group {{ $labels.consumer_group }}{{ with ' + broker + ' }} on {{ . }}{{ end }} has '
            + '{{ $value | printf "%.0f" }} messages of '
            + '{{ $labels.topic }} not yet consumed, and the number has grown for over '
            + text.words(c.consumerLagFor) + '. The oldest has waited {{ with printf "max('
            + text.selector('idemgate_consumer_lag_seconds', [
              text.goFormat(c.idemgateSelector),
              c.clusterLabel + '=%q',
              'broker=%q',
              'consumer_group=%q',
              'topic=%q',
            ])
            + ')" ' + cluster + ' ' + broker + ' $labels.consumer_group $labels.topic | query }}'
            + '{{ . | first | value | humanizeDuration }}{{ end }}. Check that every instance is up and '
            + 'consuming, and the time in the gate and the handler on the dashboard.',
            ui('consumer_group', '/'),
            |||
              A consumer group falls further behind a topic, for a long time: messages arrive faster
              than the instances apply them (too few instances, a slow database or handler), or the
              consumers are not pulling at all (stopped, stuck, every instance down). Duplicates and
              dead letters have their own alerts; this one is about delay. Behind means, per broker:
              RocketMQ, a queue's max offset minus the group's committed offset; Kafka, a partition's
              high watermark minus the committed offset; RabbitMQ, the ready messages of the group's
              queue and of its delay queue.
            |||,
            ['consumerLagMinMessages', 'consumerLagTrendWindow', 'consumerLagFor'],
            c.consumerLagFor,
          ),
        ],
      },
    ],
  },
}
